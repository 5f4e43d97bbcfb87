"""pytest plugin: connected softnic resources in one fixture, and failures that
show the packets.

Installed with softnic as the ``pytest11`` entry point ``softnic``, so it is
active wherever the package is (``-p no:softnic`` turns it off).  Everything
is built through the pyverbs API (``verbs_api``), as an application would.

Fixtures (function scope; each configures softnic before the test with
``softnic.driver.nic.configure(...)`` and closes everything and calls
``configure(None)`` after it, so nothing leaks from one test to the next):

``softnic_config``      the ``SoftnicConfig`` in force: defaults, then the
                        command-line options, then ``@pytest.mark.softnic(...)``,
                        then an indirect parameter; override the fixture to
                        compute your own
``softnic_fabric``      the configured network of this test (``SoftnicFabric``):
                        opens contexts, reads counters, renders the packet ladder
``softnic_devices``     two open ``Context`` objects, on softnic0 and softnic1
``softnic_rc_pair``     ``SoftnicPair``: sides ``.a`` and ``.b`` with ctx, pd, cq,
                        mr (full access) and an RC qp, connected and in RTS
``softnic_ud_pair``     the same with UD QPs; each side has ``.ah`` to its peer
``softnic_lossy_pair``  an RC pair over lossy links (``--softnic-faults``, or
                        the config's ``lossy_faults``, ``loss=0.05`` by default)

Options: ``--softnic-backend=sim|udp``, ``--softnic-seed=N``,
``--softnic-faults=MODEL`` (``softnic.driver.faults.FaultModel.parse`` text, applied
to every link of every softnic fixture), ``--softnic-trace-lines=N``.

When a test that used these fixtures fails, its report gets a ``softnic``
section: the seed, a command line that replays it, counters, and the last
packets exchanged (time, src -> dst, opcode, PSN).
"""

from __future__ import annotations

import shlex
from collections import Counter
import struct
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pytest

__all__ = ["SoftnicConfig", "SoftnicFabric", "SoftnicPair", "SoftnicSide", "UD_QKEY",
           "GRH_SIZE", "MTUS"]

MTUS = (256, 512, 1024, 2048, 4096)
UD_QKEY = 0x11111111
GRH_SIZE = 40                   # a UD receive buffer starts with room for the GRH
DEVICES = ("softnic0", "softnic1")
DEFAULT_TRACE_LINES = 24
_ICRC_LEN = 4


@dataclass(frozen=True)
class SoftnicConfig:
    """What a test runs on.  ``faults`` is fault model text (None: not set, a
    perfect link except for ``softnic_lossy_pair``, which then uses
    ``lossy_faults``); ``mtu`` is the path MTU the pairs are connected with."""

    backend: str = "sim"
    faults: str | None = None
    seed: int = 0
    mtu: int = 1024
    lossy_faults: str = "loss=0.05"
    recovery: str = "gbn"
    mr_size: int = 1 << 20

    def __post_init__(self) -> None:
        from softnic.driver.faults import FaultModel
        if self.backend not in ("sim", "udp"):
            raise ValueError(f"softnic backend must be 'sim' or 'udp', not {self.backend!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"softnic seed must be an int, not {self.seed!r}")
        if self.mtu not in MTUS:
            raise ValueError(f"softnic mtu must be one of {MTUS}, not {self.mtu!r}")
        if self.recovery not in ("gbn", "sr"):
            raise ValueError(f"softnic recovery must be 'gbn' or 'sr', not {self.recovery!r}")
        if not (isinstance(self.mr_size, int) and self.mr_size > 0):
            raise ValueError(f"softnic mr_size must be a positive int, not {self.mr_size!r}")
        for text in (self.faults, self.lossy_faults):
            if text is not None:
                FaultModel.parse(text)           # raises ValueError naming the bad item

    def with_(self, changes: Any) -> SoftnicConfig:
        """This config with ``changes`` (a dict or another SoftnicConfig) applied."""
        if isinstance(changes, SoftnicConfig):
            return changes
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown softnic config keys {sorted(unknown)}; known: "
                             f"{sorted(known)}")
        return replace(self, **changes)

    def fault_text(self, lossy: bool = False) -> str:
        if self.faults is not None:
            return self.faults
        return self.lossy_faults if lossy else ""


def _options(config: pytest.Config) -> dict:
    """The --softnic-* options given on the command line, as config changes."""
    got = {}
    for key in ("backend", "faults", "seed"):
        value = config.getoption(f"softnic_{key}", None)
        if value is not None:
            got[key] = value
    return got


# ---------------------------------------------------------------- pytest hooks

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("softnic", "softnic RDMA fixtures")
    group.addoption("--softnic-backend", choices=("sim", "udp"), default=None,
                    help="softnic fixtures run in the simulated fabric (sim, the default: "
                         "virtual time, deterministic) or on live loopback UDP sockets (udp)")
    group.addoption("--softnic-seed", type=int, default=None, metavar="N",
                    help="seed of the softnic fabric and its fault models (default 0)")
    group.addoption("--softnic-faults", default=None, metavar="MODEL",
                    help="fault model on every softnic link, e.g. 'loss=0.05,dup=0.01' "
                         "(softnic.driver.faults.FaultModel.parse)")
    group.addoption("--softnic-trace-lines", type=int, default=DEFAULT_TRACE_LINES,
                    metavar="N", help="packets shown in a failing softnic test's report "
                                      f"(default {DEFAULT_TRACE_LINES})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "softnic(backend=, faults=, seed=, mtu=, lossy_faults=, recovery=, "
                   "mr_size=): the softnic configuration this test's fixtures use")
    try:
        SoftnicConfig().with_(_options(config))
    except ValueError as exc:
        raise pytest.UsageError(f"softnic: {exc}") from None


def pytest_report_header(config: pytest.Config) -> str | None:
    opts = _options(config)
    if not opts:
        return None
    cfg = SoftnicConfig().with_(opts)
    return (f"softnic: backend={cfg.backend} seed={cfg.seed} "
            f"faults={cfg.faults if cfg.faults is not None else 'none'}")


_FABRIC = pytest.StashKey["SoftnicFabric"]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    fabric = item.stash.get(_FABRIC, None)
    if fabric is not None:
        if report.failed:
            lines = item.config.getoption("softnic_trace_lines", DEFAULT_TRACE_LINES)
            try:
                text = fabric.report(lines)
            except Exception as exc:             # the report must never hide the failure
                text = f"(the softnic report could not be made: {exc!r})"
            report.sections.append((f"softnic (seed {fabric.config.seed})", text))
        if call.when == "teardown":
            del item.stash[_FABRIC]               # let the fabric and its buffers go
    return report


# ---------------------------------------------------------------- fixtures

@pytest.fixture
def softnic_config(request: pytest.FixtureRequest) -> SoftnicConfig:
    """Defaults, then --softnic-* options, then softnic markers (the closest
    wins), then an indirect parameter (a dict or a SoftnicConfig)."""
    cfg = SoftnicConfig().with_(_options(request.config))
    for mark in reversed(list(request.node.iter_markers("softnic"))):
        if mark.args:
            raise pytest.UsageError("@pytest.mark.softnic takes keyword arguments only")
        cfg = cfg.with_(mark.kwargs)
    param = getattr(request, "param", None)
    if param is not None:
        cfg = cfg.with_(param)
    return cfg


@pytest.fixture
def softnic_fabric(request: pytest.FixtureRequest, softnic_config,
                   tmp_path_factory: pytest.TempPathFactory):
    """The softnic network of this test, configured now and torn down after."""
    cfg = softnic_config
    if isinstance(cfg, dict):
        cfg = SoftnicConfig().with_(cfg)
    lossy = "softnic_lossy_pair" in request.fixturenames
    capture_dir = tmp_path_factory.mktemp("softnic") if cfg.backend == "udp" else None
    fabric = SoftnicFabric(cfg, lossy=lossy, nodeid=request.node.nodeid,
                           capture_dir=capture_dir)
    request.node.stash[_FABRIC] = fabric
    fabric.start()
    try:
        yield fabric
    finally:
        fabric.close()


@pytest.fixture
def softnic_devices(softnic_fabric):
    """Two open Contexts, on softnic0 and softnic1."""
    return tuple(softnic_fabric.context(name) for name in DEVICES)


@pytest.fixture
def softnic_rc_pair(softnic_fabric):
    """Two RC QPs, on softnic0 (``.a``) and softnic1 (``.b``), connected."""
    return softnic_fabric.pair("rc")


@pytest.fixture
def softnic_ud_pair(softnic_fabric):
    """Two UD QPs in RTS; ``a.ah`` reaches b and ``b.ah`` reaches a."""
    return softnic_fabric.pair("ud")


@pytest.fixture
def softnic_lossy_pair(softnic_fabric):
    """An RC pair whose links lose packets (see SoftnicConfig.lossy_faults)."""
    return softnic_fabric.pair("rc")


# ---------------------------------------------------------------- the network of one test

class SoftnicFabric:
    """softnic configured for one test: the contexts opened through it are
    closed, and the process configuration reset, by ``close()``."""

    def __init__(self, config: SoftnicConfig, *, lossy: bool = False, nodeid: str = "",
                 capture_dir: Path | None = None) -> None:
        self.config = config
        self.lossy = lossy
        self.nodeid = nodeid
        self.capture_dir = capture_dir
        self.runtime = None
        self.world = None                        # the SimWorld, on the sim backend
        self._contexts: list = []
        self._nics: dict[str, Any] = {}          # device name -> NIC / SimNIC
        self._names: dict[tuple[str, int], str] = {}

    @property
    def backend(self) -> str:
        return self.config.backend

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def faults(self) -> str:
        """The fault model text on every link ('' for perfect links)."""
        return self.config.fault_text(self.lossy)

    def start(self) -> None:
        import softnic.driver.nic as nic
        from softnic.driver.config import RuntimeConfig, parse_devices
        from softnic.driver.faults import FaultModel
        capture = str(self.capture_dir / "softnic.pcap") if self.capture_dir else None
        self.runtime = RuntimeConfig(devices=parse_devices(str(len(DEVICES))),
                                     faults=FaultModel.parse(self.faults), seed=self.seed,
                                     capture=capture,
                                     selective_repeat=self.config.recovery == "sr",
                                     backend=self.backend)
        nic.configure(self.runtime)
        if self.backend == "sim":
            self.world = nic.sim_world()

    def close(self) -> None:
        import softnic.driver.nic as nic
        try:
            while self._contexts:
                self._contexts.pop().close()
        finally:
            nic.configure(None)

    # -- building --------------------------------------------------------------

    def context(self, name: str = DEVICES[0]):
        """An open pyverbs ``Context`` on device ``name``, closed at teardown."""
        import softnic.driver.nic as nic
        from verbs_api.device import Context
        ctx = Context(name=name)
        self._contexts.append(ctx)
        for n in nic.open_nics():
            if n.name == name:
                self._nics[name] = n
                self._names[(n.ip, n.port)] = name
        return ctx

    def pair(self, kind: str = "rc") -> SoftnicPair:
        """Two sides on softnic0 and softnic1 with RC (connected) or UD QPs."""
        return SoftnicPair(self, kind)

    # -- looking -----------------------------------------------------------------

    def counters(self) -> dict[str, Counter]:
        """Each opened device's counters (the names Linux soft-RoCE uses; one
        never counted reads 0)."""
        return {name: Counter(n.counters) for name, n in self._nics.items()}

    def fault_counters(self) -> dict[str, int]:
        """What the links did: sent, delivered, dropped_loss, dropped_burst,
        dropped_queue, duplicated, corrupted, reordered (softnic.driver.faults)."""
        from softnic.driver.faults import COUNTER_NAMES
        if self.world is not None:
            with self.world.lock:
                c = self.world.fabric.counters
            return {k: c[k] for k in COUNTER_NAMES}
        total = dict.fromkeys(COUNTER_NAMES, 0)
        for n in self._nics.values():
            for k, v in n.counters.items():
                if k.startswith("fault_") and k[6:] in total:
                    total[k[6:]] += v
        return total

    def packet_records(self) -> list[tuple[float, str, tuple, tuple, bytes]]:
        """The packets of this test as fabric trace records ``(time, kind, src,
        dst, datagram)``, oldest first; kinds send, deliver, drop, corrupt, dup.
        sim: the fabric's own trace (virtual seconds; the most recent 10 000
        records or more).  udp: rebuilt from the devices' captures (seconds of
        wall clock): each datagram a device sent, then its delivery if the
        peer's capture saw it, else a drop."""
        if self.world is not None:
            with self.world.lock:
                return list(self.world.fabric.trace)
        if self.capture_dir is None:
            return []
        for n in self._nics.values():
            cap = getattr(n, "capture", None)
            if cap is not None and not cap.closed:
                cap.flush()
        sent, received = [], {}
        for path in sorted(self.capture_dir.glob("*.pcap")):
            name = path.stem.rpartition("-")[2]
            for t, src, dst, data in _read_pcap(path):
                if self._names.get(src) == name:
                    sent.append((t, src, dst, data))
                else:
                    received.setdefault((src, dst, data), []).append(t)
        sent.sort(key=lambda p: p[0])
        records, delivered = [], []
        for t, src, dst, data in sent:
            records.append((t, "send", src, dst, data))
            times = received.get((src, dst, data))
            if times:
                delivered.append((times.pop(0), "deliver", src, dst, data))
            else:
                records.append((t, "drop", src, dst, data))
        records.extend(delivered)
        records.sort(key=lambda r: r[0])           # stable: a drop stays after its send
        return records

    def ladder(self, last: int = DEFAULT_TRACE_LINES) -> str:
        """The last ``last`` packets as text: time, src -> dst, opcode, PSN."""
        records = self.packet_records()
        try:
            return self._ladder_rendered(records, last)
        except Exception:                           # the ladder module is optional
            return self._ladder_plain(records, last)

    def _ladder_rendered(self, records: list, last: int) -> str:
        import importlib
        ladder = importlib.import_module("softnic.trace.ladder")
        events = ladder.from_fabric_trace(records)
        shown = events[-last:] if last > 0 else []
        clock = "virtual time" if self.world is not None else "wall clock"
        head = f"{ladder.summary(events)}; the last {len(shown)} ({clock}):"
        if not shown:
            return head + "\n(no packets)"
        return head + "\n" + ladder.render_text(shown, labels=dict(self._names)).rstrip("\n")

    def _ladder_plain(self, records: list, last: int) -> str:
        pkts = [r for r in records if r[1] != "deliver"]
        shown = pkts[-last:] if last > 0 else []
        clock = "virtual time" if self.world is not None else "wall clock"
        head = f"last {len(shown)} of {len(pkts)} packet events ({clock}):"
        if not shown:
            return head + "\n  (no packets)"
        t0 = shown[0][0]
        name = lambda a: self._names.get(tuple(a), f"{a[0]}:{a[1]}")  # noqa: E731
        rows = [(f"{(t - t0) * 1e6:.3f}us", name(src), name(dst), kind, *_describe(data))
                for t, kind, src, dst, data in shown]
        w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [head]
        for r in rows:
            lines.append(f"  {r[0]:>{w[0]}}  {r[1]:>{w[1]}} -> {r[2]:<{w[2]}}  {r[3]:<{w[3]}}  "
                         f"{r[4]:<{w[4]}}  psn={r[5]:<{w[5]}}  qp={r[6]:<{w[6]}}  {r[7]}".rstrip())
        return "\n".join(lines)

    def report(self, last: int = DEFAULT_TRACE_LINES) -> str:
        """The text a failing test's report shows."""
        cfg = self.config
        replay = ["pytest", self.nodeid, f"--softnic-seed={cfg.seed}"]
        if cfg.backend != "sim":
            replay.append(f"--softnic-backend={cfg.backend}")
        if cfg.faults is not None:
            replay.append(f"--softnic-faults={cfg.faults}")
        out = [f"seed {cfg.seed}, backend {cfg.backend}, faults {self.faults or 'none'}, "
               f"path MTU {cfg.mtu}, recovery {cfg.recovery}",
               "replay: " + " ".join(shlex.quote(a) for a in replay if a)
               + ("" if cfg.backend == "sim" else "   (live sockets: timing is not replayed)")]
        if self.world is not None:
            out.append(f"virtual time {self.world.fabric.now * 1e6:.3f} us")
        links = {k: v for k, v in self.fault_counters().items() if v}
        out.append("links: " + (" ".join(f"{k}={v}" for k, v in links.items()) or "no traffic"))
        for name, c in self.counters().items():
            nz = " ".join(f"{k}={v}" for k, v in c.items() if v and not k.startswith("fault_"))
            out.append(f"{name}: {nz or 'all counters 0'}")
        if self.capture_dir is not None:
            out.append(f"pcap: {self.capture_dir}")
        out.append(self.ladder(last))
        return "\n".join(out)


def _describe(data: bytes) -> tuple[str, str, str, str]:
    """(opcode, PSN, destination QPN, details) of one RoCEv2 datagram."""
    from softnic.wire.roce import AethCode, NakCode, WireError, decode
    try:
        p = decode(data[:-_ICRC_LEN])
    except (WireError, ValueError, struct.error) as exc:
        return (f"undecodable ({len(data)} B)", "-", "-", str(exc))
    b = p.bth
    info = []
    if p.aeth is not None:
        code = p.aeth.code
        if code == AethCode.NAK:
            try:
                info.append(f"NAK {NakCode(p.aeth.value).name}")
            except ValueError:
                info.append(f"NAK code {p.aeth.value}")
        elif code == AethCode.RNR_NAK:
            info.append("RNR NAK")
        else:
            info.append("ACK")
        info.append(f"msn={p.aeth.msn}")
    if p.reth is not None:
        info.append(f"rkey={p.reth.rkey:#x} len={p.reth.dma_len}")
    if p.atomiceth is not None:
        info.append(f"rkey={p.atomiceth.rkey:#x}")
    if p.deth is not None:
        info.append(f"src_qp={p.deth.src_qp:#x}")
    if p.payload:
        info.append(f"{len(p.payload)} B")
    if b.ackreq:
        info.append("ackreq")
    return (p.info.name, str(b.psn), f"{b.dest_qp:#x}", " ".join(info))


def _read_pcap(path: Path):
    """(time, src, dst, udp payload) of each record of a softnic capture
    (LINKTYPE_RAW, IPv4/UDP)."""
    raw = path.read_bytes()
    if len(raw) < 24:
        return
    magic = raw[:4]
    endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    rec = struct.Struct(endian + "IIII")
    off = 24
    while off + rec.size <= len(raw):
        sec, frac, caplen, _ = rec.unpack_from(raw, off)
        off += rec.size
        frame = raw[off:off + caplen]
        off += caplen
        if len(frame) < 28 or frame[0] >> 4 != 4:
            continue
        ihl = (frame[0] & 0x0F) * 4
        src_ip = ".".join(map(str, frame[12:16]))
        dst_ip = ".".join(map(str, frame[16:20]))
        sport, dport = struct.unpack_from("!HH", frame, ihl)
        t = sec + frac / (1e9 if nano else 1e6)
        yield t, (src_ip, sport), (dst_ip, dport), bytes(frame[ihl + 8:])


# ---------------------------------------------------------------- connected pairs

class SoftnicSide:
    """One end: ``ctx``, ``pd``, ``cq`` (send and receive), ``mr`` (local write
    and remote read, write and atomic access) and ``qp``; ``peer`` is the other
    side, ``ah`` (UD only) an address handle reaching it."""

    def __init__(self, fabric: SoftnicFabric, label: str, device: str, qp_type: int) -> None:
        import verbs_api.enums as e
        from verbs_api.cq import CQ
        from verbs_api.mr import MR
        from verbs_api.pd import PD
        from verbs_api.qp import QP, QPAttr, QPCap, QPInitAttr
        self.label = label
        self.device = device
        self._fabric = fabric
        self.ctx = fabric.context(device)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 1024)
        self.mr = MR(self.pd, fabric.config.mr_size, _all_access())
        cap = QPCap(max_send_wr=256, max_recv_wr=256, max_send_sge=4, max_recv_sge=4,
                    max_inline_data=64)
        init = QPInitAttr(qp_type=qp_type, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
        attr = QPAttr(port_num=1)
        if qp_type == e.IBV_QPT_UD:
            attr.qkey = UD_QKEY
        else:
            attr.qp_access_flags = _remote_access()
        self.qp = QP(self.pd, init, attr)
        self.peer: SoftnicSide | None = None
        self.ah = None

    @property
    def gid(self):
        return self.ctx.query_gid(1, 0)

    def sge(self, offset: int = 0, length: int | None = None):
        """An SGE over ``[offset, offset+length)`` of this side's MR (default: to its end)."""
        from verbs_api.wr import SGE
        if length is None:
            length = self.mr.length - offset
        return SGE(self.mr.buf + offset, length, self.mr.lkey)

    def poll(self, count: int = 1, timeout: float = 10.0) -> list:
        """``count`` completions from ``cq`` (any status), or AssertionError: at
        the deadline (seconds of wall clock), or, in the simulated fabric, as
        soon as the fabric is idle (nothing more can ever arrive)."""
        wcs: list = []
        deadline = time.monotonic() + timeout
        world = self._fabric.world
        while len(wcs) < count:
            n, got = self.cq.poll(count - len(wcs))
            wcs.extend(got)
            if n:
                continue
            if world is not None and not world.fabric.pending():
                n, got = self.cq.poll(count - len(wcs))
                wcs.extend(got)
                if not n:
                    raise AssertionError(f"{self.label}: {len(wcs)} of {count} completions; "
                                         "the simulated fabric is idle")
            elif time.monotonic() > deadline:
                raise AssertionError(f"{self.label}: {len(wcs)} of {count} completions "
                                     f"after {timeout} s")
        return wcs

    def counters(self) -> Counter:
        return self._fabric.counters()[self.device]

    def close(self) -> None:
        self.ctx.close()

    def __repr__(self) -> str:
        return f"<SoftnicSide {self.label} on {self.device} qpn={self.qp.qp_num:#x}>"


class SoftnicPair:
    """Sides ``a`` (softnic0) and ``b`` (softnic1); ``a, b = pair`` works too."""

    def __init__(self, fabric: SoftnicFabric, kind: str = "rc") -> None:
        import verbs_api.enums as e
        kinds = {"rc": e.IBV_QPT_RC, "ud": e.IBV_QPT_UD}
        if kind not in kinds:
            raise ValueError(f"pair kind must be 'rc' or 'ud', not {kind!r}")
        self.kind = kind
        self.fabric = fabric
        self.config = fabric.config
        self.qkey = UD_QKEY
        self.a = SoftnicSide(fabric, "a", DEVICES[0], kinds[kind])
        self.b = SoftnicSide(fabric, "b", DEVICES[1], kinds[kind])
        self.a.peer, self.b.peer = self.b, self.a
        if kind == "rc":
            self._connect()
        else:
            self._address()

    def _connect(self) -> None:
        import verbs_api.enums as e
        from verbs_api.addr import AHAttr, GlobalRoute
        from verbs_api.qp import QPAttr
        path_mtu = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
                    2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}[self.config.mtu]
        for me, peer in ((self.a, self.b), (self.b, self.a)):
            attr = QPAttr(port_num=1, path_mtu=path_mtu)
            attr.qp_access_flags = _remote_access()
            attr.dest_qp_num = peer.qp.qp_num
            attr.rq_psn = 0
            attr.sq_psn = 0
            attr.ah_attr = AHAttr(port_num=1, is_global=1,
                                  gr=GlobalRoute(dgid=peer.gid, sgid_index=0))
            attr.max_dest_rd_atomic = 4
            attr.max_rd_atomic = 4
            attr.min_rnr_timer = 1
            attr.timeout = 10                 # 4.096 us * 2**10: about 4 ms
            attr.retry_cnt = 7
            attr.rnr_retry = 7                # retry RNR for ever
            me.qp.to_rts(attr)

    def _address(self) -> None:
        from verbs_api.addr import AH, AHAttr, GlobalRoute
        for me, peer in ((self.a, self.b), (self.b, self.a)):
            me.ah = AH(me.pd, attr=AHAttr(port_num=1, is_global=1,
                                          gr=GlobalRoute(dgid=peer.gid, sgid_index=0)))

    def __iter__(self):
        return iter((self.a, self.b))

    def counters(self) -> dict[str, Counter]:
        return self.fabric.counters()

    def fault_counters(self) -> dict[str, int]:
        return self.fabric.fault_counters()

    def __repr__(self) -> str:
        return f"<SoftnicPair {self.kind} {self.a!r} {self.b!r}>"


def _all_access() -> int:
    import verbs_api.enums as e
    return e.IBV_ACCESS_LOCAL_WRITE | _remote_access()


def _remote_access() -> int:
    import verbs_api.enums as e
    return e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC
