"""The compiled per-packet kernel (``softnic.accel``) against the engine.

The kernel runs two loops in C: the sender building a run of MIDDLE packets
(``requester._bulk``) and the receiver checking and placing them
(``responder.receive_middles``).  Whatever it does must be exactly what the
engine's general path does packet by packet: the requester's ``_build`` (and
``append_icrc``) for each packet, and a receiver with ``fast_path=False`` (every
datagram checked, decoded and handed to ``responder.receive``): the same bytes
on the wire, the same memory, counters, ACKs and completions, whatever arrives
(corrupt, lost, duplicated or reordered packets in a coalesced run).  Without a C compiler or Python's headers the
kernel cannot be built and these tests skip, except in CI (``CI`` set), which
installs both and fails instead.
"""

from __future__ import annotations

import os
import random
import types
import zlib

import pytest

from hypothesis import given, note, settings, strategies as st

from softnic import accel
from softnic.core import requester, responder
from softnic.core.requester import Run
from softnic.core.dispatch import StreamKind
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import RecvWR, SendWR
from softnic.experiments.rig import connect
from softnic.wire.icrc import append_icrc
from softnic.wire.psn import PSN_MASK
from softnic.wire.roce import BTH_LEN

from test_bulk_tx import bulk_cases, _wqe

_LOADED = accel.load()


def kernel():
    """The kernel; a skip where it cannot be built (a failure in CI)."""
    if _LOADED is None:
        why = f"no kernel ({accel.error}); building it needs gcc and python3-dev"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return _LOADED


def test_the_kernel_builds_and_loads_here():
    kernel()
    assert accel.describe().startswith("cffi kernel")


def test_softnic_kernel_0_turns_it_off(monkeypatch):
    k = kernel()
    monkeypatch.setenv("SOFTNIC_KERNEL", "0")
    assert accel.load() is None
    assert "SOFTNIC_KERNEL" in accel.error
    monkeypatch.delenv("SOFTNIC_KERNEL")
    assert accel.load() is k


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=9000), st.integers(0, 0xFFFFFFFF))
def test_every_crc_the_kernel_may_use_is_zlibs(data, seed):
    """ISA-L's, zlib's and the table's CRC-32, each as the kernel calls it."""
    k = kernel()
    lib, ffi = k.lib, k.ffi
    kinds = []
    try:
        for addr, kind in accel._crc_candidates():
            assert lib.sn_set_crc(addr, kind) == kind
            kinds.append(kind)
            assert lib.sn_crc32(seed, ffi.from_buffer(data), len(data)) == \
                zlib.crc32(data, seed), accel.CRC_KINDS[kind]
    finally:
        accel._choose_crc(k)
    assert 0 in kinds
    try:
        import isal.isal_zlib  # noqa: F401
    except ImportError:
        return
    assert 1 in kinds, "isal is installed but its crc32_gzip_refl was not found"


def test_the_kernel_uses_isa_l_where_isal_is_installed():
    k = kernel()
    import isal.isal_zlib  # noqa: F401   (a dependency: its absence is a failure)
    assert k.crc == "isa-l"


@settings(max_examples=60, deadline=None)
@given(bulk_cases(), st.data())
def test_the_kernels_bulk_run_is_the_engines_packets(c, data):
    """``_bulk`` with the kernel gives, packet by packet, the bytes ``_build`` and
    ``append_icrc`` give with the AckReq cadence ``_send_packet`` follows, and the
    same bytes and AckReq count as its Python loop; so does the run it leaves in
    memory for a driver that gathers (``requester.Gather``, laid end to end).  A
    SEND's run may start at its FIRST (``requester._RUN_FIRST``).  A gather list of
    several SGEs is read into one buffer as the WQE starts (``GATHER_ONCE_MAX``;
    0 here: gathered packet by packet, in Python) and then built as one SGE is."""
    once = data.draw(st.booleans(), label="gathered once")
    bound = requester.GATHER_ONCE_MAX
    requester.GATHER_ONCE_MAX = bound if once else 0
    try:
        dev, qp, wqe, _ = _wqe(c)
    finally:
        requester.GATHER_ONCE_MAX = bound
    single = not c["cuts"] or once          # one view: one SGE, or a list read once
    end = requester._run_end(qp, wqe)
    lo = 0 if c["op"] in requester._RUN_FIRST else 1      # a SEND's run may start at its FIRST
    if end <= lo:
        return
    idx = data.draw(st.integers(lo, end - 1), label="idx")
    k = data.draw(st.integers(1, end - idx), label="k")
    got = {}
    counting = Counting(kernel())
    for name, kern, gather in (("python", None, False), ("kernel", counting, False),
                               ("gather", kernel(), True)):
        dev.kernel = kern
        dev.tx_gather = gather
        qp.req.pkts_since_ackreq = c["since"]
        buf, seg = requester._bulk(dev, qp, wqe, idx, k, qp.dest, c["ack_every"])
        if gather:
            middles = k - (idx + k - 1 == wqe.npkts - 1)
            assert (type(buf) is requester.Gather) == (single and middles > 0)
            if type(buf) is requester.Gather:
                assert len(buf) == len(buf.flatten())
                buf = buf.flatten()
        got[name] = (bytes(buf), seg, qp.req.pkts_since_ackreq)
    dev.tx_gather = False
    assert got["kernel"] == got["python"] == got["gather"]
    buf, seg, since = got["kernel"]
    s = c["since"]
    for i in range(k):
        s += 1
        ackreq = s >= c["ack_every"]
        if ackreq or idx + i == wqe.npkts - 1:      # a LAST always asks for an ACK
            s = 0
        want = append_icrc(requester._build(dev, qp, wqe, idx + i, ackreq),
                           dev.ip, qp.dest[0], dev.port, qp.dest[1])
        assert buf[i * seg:(i + 1) * seg] == bytes(want), f"packet {idx + i}"
    assert since == s
    middles = k - (idx + k - 1 == wqe.npkts - 1)
    if single:                          # one view: the MIDDLEs are the kernel's
        assert counting.built == middles
    else:
        assert counting.built == 0


def test_a_single_sge_writes_middles_are_built_by_the_kernel():
    counting = Counting(kernel())
    a, b, ea, eb = _side(counting, 1024, 128, False)
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 10 * 1024)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    a.datagram_runs(0.0)
    assert counting.built == 8            # FIRST, 8 MIDDLEs, LAST


# ------------------------------------------------------------------ receiving


class Counting:
    """A kernel whose loops count the packets they take and build."""

    def __init__(self, k):
        self.ffi = k.ffi
        self.taken = 0
        self.built = 0
        self.edges = 0              # FIRSTs and LASTs of READs and SENDs taken (sn_rx_edge)

        def rx(*args):
            n = k.lib.sn_rx_middles(*args)
            self.taken += n
            return n

        def tx(*args):
            self.built += args[2]
            return k.lib.sn_tx_middles(*args)

        def edge(*args):
            n = k.lib.sn_rx_edge(*args)
            self.edges += n
            return n
        def send_run(*args):         # a SEND's FIRST, MIDDLEs and LAST: the three in one
            r = k.lib.sn_rx_send_run(*args)
            if r >= 0:
                self.taken += r >> 1
                self.edges += 1 + (r & 1)
            return r
        self.lib = types.SimpleNamespace(sn_rx_middles=rx, sn_tx_middles=tx, sn_rx_edge=edge,
                                         sn_rx_send_run=send_run)


def _side(kernel, mtu: int, window: int, sr: bool, engine: bool = False,
          both: bool = False):
    """Two devices; ``engine``: the receiver ``b`` runs the general path only (and,
    ``both``, the sender ``a`` too: it receives READ responses)."""
    cfg = DeviceConfig(min_timer=1e-3, window=window, selective_repeat=sr,
                       fast_path=not (engine and both))
    a = Device("a", "10.0.0.1", config=cfg)
    b = Device("b", "10.0.0.2", config=DeviceConfig(min_timer=1e-3, window=window,
                                                    selective_repeat=sr, fast_path=not engine))
    a.kernel = b.kernel = kernel
    ea, eb = connect(a, b, mtu=mtu, timeout=10, endpoint_args={"buf_size": 1 << 17})
    return a, b, ea, eb


def _mangle(rng: random.Random, buf: bytes, seg: int, faults: bool = True,
            seal=None) -> list[tuple[bytes, int]]:
    """What a GRO socket might hand over for a run of datagrams ``buf`` after a
    faulty network: cut in pieces, with some datagrams corrupt, lost, repeated
    or swapped, or with a header byte changed and the ICRC made good again
    (``seal``: a sender that gets a field wrong)."""
    pkts = [bytearray(buf[o:o + seg]) for o in range(0, len(buf), seg)]
    for _ in range(rng.choice([0, 0, 1, 2, 3]) if faults else 0):
        i = rng.randrange(len(pkts))
        what = rng.choice(["flip", "drop", "dup", "swap", "ackreq", "truncate", "header"])
        if what == "flip":
            p = pkts[i]
            p[rng.randrange(len(p))] ^= 1 << rng.randrange(8)
        elif what == "drop" and len(pkts) > 1:
            del pkts[i]
        elif what == "dup":
            pkts.insert(i, bytearray(pkts[i]))
        elif what == "swap" and i + 1 < len(pkts):
            pkts[i], pkts[i + 1] = pkts[i + 1], pkts[i]
        elif what == "ackreq":
            pkts[i][8] ^= 0x80                 # (the ICRC then fails)
        elif what == "header" and seal is not None:
            p = pkts[i]
            # (the BTH, and the AETH of a READ's FIRST or LAST: its syndrome too)
            p[rng.randrange(16)] ^= 1 << rng.randrange(8)
            pkts[i] = bytearray(seal(p[:-4]))
        elif what == "truncate" and len(pkts[i]) > 20:
            pkts[i] = pkts[i][:-rng.randrange(1, 9)]
    # runs as GRO forms them: equal sizes, a shorter one ends a run
    out, run = [], []
    for p in pkts:
        if run and (len(p) > len(run[0]) or len(run[-1]) < len(run[0])
                    or len(run) >= rng.choice([2, 8, 64])):
            out.append(run)
            run = []
        run.append(p)
    if run:
        out.append(run)
    return [(b"".join(r), len(r[0]) if len(r) > 1 else 0) for r in out]


#: what ``_exchange`` sends: WRITEs, SENDs into one-SGE receives (the kernel's),
#: SENDs into two-SGE receives (the general way), READs (their responses the bulk)
KINDS = ("write", "send", "send2", "read")
READ_AT = 1 << 16           # a READ's target in ``ea.buf``: from here on


def _post(a, b, ea, eb, kind: str, i: int, n: int, off: int) -> None:
    """Message ``i`` of ``n`` bytes from ``ea.buf[off % 4096:]`` to ``eb.buf[off %
    8192:]``: a WRITE there, or a SEND into a receive WQE of one SGE there (or
    of two, ``send2``, split in the middle), every other one with an
    immediate."""
    dst = off % 8192
    if kind == "read":
        a.post_send(ea.qp, SendWR(i, W.RDMA_READ, [ea.sge(READ_AT + dst, n)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr + off % 4096, rkey=eb.mr.rkey))
        return
    if kind == "write":
        a.post_send(ea.qp, SendWR(i, W.RDMA_WRITE, [ea.sge(off % 4096, n)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr + dst, rkey=eb.mr.rkey))
        return
    if kind == "send":
        sges = [eb.sge(dst, n)]
    else:
        h = n // 2
        sges = [eb.sge(dst, h), eb.sge(dst + h, n - h)]
    b.post_recv(eb.qp, RecvWR(100 + i, sges))
    a.post_send(ea.qp, SendWR(i, W.SEND_WITH_IMM if i % 2 else W.SEND, [ea.sge(off % 4096, n)],
                              SendFlags.SIGNALED, imm_data=0xABC00 + i))


def _runs(datagrams: list[bytes]) -> list[list[bytes]]:
    """``datagrams`` in runs as GRO forms them: equal sizes, a shorter one ends a run."""
    out: list[list[bytes]] = []
    for d in datagrams:
        if out and len(d) <= len(out[-1][0]) and len(out[-1][-1]) == len(out[-1][0]):
            out[-1].append(d)
        else:
            out.append([d])
    return out


def _exchange(seed: int, sizes: list[int], mtu: int, window: int, sr: bool, kernel,
              faults: bool = True, kind: str = "write"):
    """Two devices, the receiver given runs of datagrams (mangled by a seeded
    network), the sender the receiver's answers; returns everything observable.
    ``kernel`` None: the receiver is the engine alone (``fast_path=False``).
    ``kind``: one of ``KINDS``."""
    rng = random.Random(seed)
    a, b, ea, eb = _side(kernel, mtu, window, sr, engine=kernel is None, both=kind == "read")
    src = bytes(rng.getrandbits(8) for _ in range(1 << 16))
    ea.buf.view[0:1 << 16] = src
    eb.buf.view[0:1 << 16] = src            # (what READs read)
    wire = []
    off = 0
    for i, n in enumerate(sizes):
        _post(a, b, ea, eb, kind, i, n, off)
        off += 1000
    now = 0.0
    wcs = []
    rwcs = []
    imms = []

    def seal(pkt):
        return append_icrc(bytearray(pkt), a.ip, b.ip, a.port, b.port)

    def seal_b(pkt):
        return append_icrc(bytearray(pkt), b.ip, a.ip, b.port, a.port)
    for _ in range(400):
        for item in a.datagram_runs(now):
            if type(item) is not Run:
                data, seg = bytes(item[0]), 0
                pieces = [(data, 0)] if not faults or rng.random() > 0.05 else []
            else:
                pieces = _mangle(rng, bytes(item.buf), item.seg, faults, seal)
            for data, seg in pieces:
                b.receive_run(data, seg, a.address, now)
        answers = [bytes(data) for data, _ in b.datagrams_to_send(now)]
        wire += answers
        if kind == "read":
            # READ responses as a GRO socket hands them to the requester: runs of
            # equal sizes (whichever way the responder built them), mangled
            for run in _runs(answers):
                if len(run) == 1:
                    pieces = [(run[0], 0)] if not faults or rng.random() > 0.05 else []
                else:
                    pieces = _mangle(rng, b"".join(run), len(run[0]), faults, seal_b)
                for data, seg in pieces:
                    a.receive_run(data, seg, b.address, now)
            answers = []
        for data in answers:
            if not faults or rng.random() > 0.05:
                a.receive_datagram(data, b.address, now)
        wcs += [(w.wr_id, int(w.status)) for w in a.poll_cq(ea.send_cq, 64)]
        got = b.poll_cq(eb.recv_cq, 64)
        rwcs += [(w.wr_id, int(w.status), int(w.opcode), w.byte_len) for w in got]
        imms += [(w.wr_id, w.imm_data, int(w.wc_flags)) for w in got]
        if len(wcs) == len(sizes):
            break
        now += 0.002
        for d in (a, b):
            t = d.get_timer()
            if t is not None and t <= now:
                d.handle_timer(now)
    qb = eb.qp
    at = READ_AT if kind == "read" else 0
    memory = bytearray((ea if kind == "read" else eb).buf.view[at:1 << 17])
    ok = {wr_id for wr_id, status in wcs if status == 0}
    for i, n in enumerate(sizes):
        if i not in ok:             # a message that did not complete successfully
            start = (i * 1000) % 8192   # leaves its target undefined: not compared
            memory[start:start + n] = bytes(n)
    return {"wire": wire, "wcs": wcs, "rwcs": rwcs, "imms": imms, "memory": bytes(memory),
            "counters_b": dict(b.counters), "counters_a": dict(a.counters),
            "qp": (qb.resp.epsn, qb.resp.msn, qb.resp.write_off, qb.resp.off, qb.resp.kind)}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(1, 40000), min_size=1, max_size=6),
       st.sampled_from([256, 1024, 4096]), st.sampled_from([8, 32, 128]), st.booleans(),
       st.sampled_from(KINDS))
def test_receiving_runs_with_the_kernel_is_the_engine_receiving_them_one_by_one(
        seed, sizes, mtu, window, sr, kind):
    replay = f"_exchange({seed}, {sizes}, {mtu}, {window}, {sr}, kernel, kind={kind!r})"
    note(f"replay: {replay}")
    counting = Counting(kernel())
    fast = _exchange(seed, sizes, mtu, window, sr, counting, kind=kind)
    slow = _exchange(seed, sizes, mtu, window, sr, None, kind=kind)
    for key in ("wire", "wcs", "rwcs", "imms", "memory", "counters_a", "counters_b", "qp"):
        assert fast[key] == slow[key], f"{key} differs with the kernel (replay {replay})"
    assert fast["wcs"] or fast["counters_a"].get("retry_exceeded_err") or \
        fast["counters_b"].get("rcvd_pkts"), "nothing happened"
    # enough MIDDLEs that some form a run, all delivered: every message completed
    # successfully (an exchange that stalls on a lost ACK within the loop's 0.8 s,
    # or that a mangled packet ends with a NAK, may never have sent a run of them)
    delivered = len(fast["wcs"]) == len(sizes) and all(st == 0 for _, st in fast["wcs"])
    if delivered and kind != "send2" and any(n > 12 * mtu for n in sizes):
        cb = fast["counters_a" if kind == "read" else "counters_b"]
        assert counting.taken > 0 or cb.get("rcvd_icrc_err") or \
            cb.get("out_of_seq_request") or cb.get("completer_retry_err") or \
            cb.get("read_holes_requested"), "the kernel took nothing"


def test_a_clean_long_write_is_placed_by_the_kernel():
    counting = Counting(kernel())
    r = _exchange(7, [60000], 4096, 128, False, counting, faults=False)
    # 15 packets: FIRST and LAST in Python, and of the 13 MIDDLEs those the
    # window's AckReq bit does not mark
    assert r["wcs"] == [(0, 0)]
    assert counting.taken >= 11
    assert r["counters_b"].get("rcvd_icrc_err", 0) == 0


def test_a_clean_long_send_is_placed_by_the_kernel_into_its_one_sge_receive():
    counting = Counting(kernel())
    r = _exchange(7, [60000], 4096, 128, False, counting, faults=False, kind="send")
    assert r["wcs"] == [(0, 0)]
    assert r["rwcs"] == [(100, 0, 128, 60000)]      # IBV_WC_RECV, all its bytes
    assert counting.taken >= 11 and counting.edges == 2     # the FIRST and the LAST
    slow = _exchange(7, [60000], 4096, 128, False, None, faults=False, kind="send")
    assert r["memory"] == slow["memory"] and r["wire"] == slow["wire"]


def test_a_send_into_a_receive_of_two_sges_takes_the_general_way():
    counting = Counting(kernel())
    r = _exchange(7, [60000], 4096, 128, False, counting, faults=False, kind="send2")
    assert r["wcs"] == [(0, 0)] and r["rwcs"] == [(100, 0, 128, 60000)]
    assert counting.taken == 0 and counting.edges == 0
    slow = _exchange(7, [60000], 4096, 128, False, None, faults=False, kind="send2")
    assert r["memory"] == slow["memory"]


@pytest.mark.parametrize("sizes", [[8192], [8192, 8190, 4097, 100]])
def test_sends_of_two_packets_are_each_a_first_and_a_last_the_kernel_places(sizes):
    """A SEND of two packets (an eager fragment of UCX or Open MPI: no MIDDLE)
    is its FIRST and its LAST, each taken by ``responder.receive_edge``, and a
    SEND of one packet its ONLY, taken there too: what the engine alone makes of
    them, byte for byte."""
    counting = Counting(kernel())
    r = _exchange(7, sizes, 4096, 128, False, counting, faults=False, kind="send")
    slow = _exchange(7, sizes, 4096, 128, False, None, faults=False, kind="send")
    assert r == slow
    assert r["rwcs"] == [(100 + i, 0, 128, n) for i, n in enumerate(sizes)]
    edges = sum(2 if n > 4096 else 1 for n in sizes)    # (a SEND ONLY: one edge)
    assert counting.edges == edges and counting.taken == 0


def test_a_clean_long_reads_responses_are_built_in_a_run_and_placed_by_the_kernel():
    counting = Counting(kernel())
    r = _exchange(7, [60000], 4096, 128, False, counting, faults=False, kind="read")
    assert r["wcs"] == [(0, 0)]
    # 15 responses: the 13 MIDDLEs built in one run; the kernel takes those the
    # GRO runs hold wholly (the first MIDDLE ends the FIRST's run: it is shorter),
    # and the FIRST and the LAST (sn_rx_edge)
    assert counting.built == 13 and counting.taken == 12 and counting.edges == 2
    slow = _exchange(7, [60000], 4096, 128, False, None, faults=False, kind="read")
    assert r["memory"] == slow["memory"] and r["wire"] == slow["wire"]
    rng = random.Random(7)                      # (as _exchange draws its source bytes)
    src = bytes(rng.getrandbits(8) for _ in range(1 << 16))
    assert r["memory"][:60000] == src[:60000]


def _read_responses(kern, n: int = 3 * 1024 + 100, sges: int = 1):
    """A READ of ``n`` bytes from ``eb.buf`` into ``ea.buf`` (``sges`` SGEs), MTU
    1024: its responses, the FIRST, the MIDDLEs laid end to end (a GRO run) and
    the LAST."""
    a, b, ea, eb = _side(kern, 1024, 128, False, engine=kern is None, both=kern is None)
    eb.buf.view[0:8192] = bytes(range(256)) * 32
    h = n // 2
    sgl = [ea.sge(0, n)] if sges == 1 else [ea.sge(0, h), ea.sge(h, n - h)]
    a.post_send(ea.qp, SendWR(1, W.RDMA_READ, sgl, SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    for d, _ in a.datagrams_to_send(0.0):
        b.receive_datagram(d, a.address, 0.0)
    resp = [d for d, _ in b.datagrams_to_send(0.0)]
    return a, b, ea, eb, (resp[0], b"".join(resp[1:-1]), resp[-1])


@pytest.mark.parametrize("n", [1024 + 100, 2 * 1024, 2 * 1024 + 1, 3 * 1024 + 100])
def test_a_reads_first_names_its_qp_for_a_stream_when_middles_follow(n):
    """The kernel's READ FIRST (``completer.receive_edge``) names its QP the one a
    driver may stream (``dev.stream_qp``, ``Dispatch.stream_target``, as a
    SEND's or WRITE's FIRST does) when MIDDLEs follow it; a READ of two packets
    (a FIRST and a LAST) names none.  The stream then starts at the PSN after the
    FIRST, its bytes at the MTU's offset (``completer.reads_target``: the READ's
    second packet on)."""
    a, b, ea, eb, (first, mids, last) = _read_responses(Counting(kernel()), n)
    assert a.stream_qp is None
    a.receive_run(first, 0, b.address, 0.0)
    assert a.counters["rcvd_pkts"] == 1
    if n <= 2 * 1024:
        assert a.stream_qp is None and a.stream_target() is None
        return
    assert a.stream_qp is ea.qp
    t = a.stream_target()
    assert t is not None and t.kind is StreamKind.RESPONSES
    r = t.target
    assert (r.psn, r.p0, r.mtu, r.lens, r.wqes) == \
        ((ea.qp.comp.acked_psn + 1) & PSN_MASK, 1, 1024, [n], [ea.qp.sq[0]])


@pytest.mark.parametrize("change", ["icrc", "nak", "psn", "length", "two_sges"])
def test_a_reads_first_or_last_the_kernel_may_not_take_goes_the_engines_way(change):
    """The FIRST and the LAST of a READ (AETH, payload), each changed as a faulty
    responder might, the ICRC made good again but for ``icrc``: the kernel takes
    none of them (``sn_rx_edge``), the engine's general path decides, and memory,
    counters, state and completions are those of a requester without the kernel."""
    seen = {}
    for name, kern in (("engine", None), ("kernel", Counting(kernel()))):
        a, b, ea, eb, (first, mids, last) = _read_responses(kern, sges=2 if change ==
                                                            "two_sges" else 1)
        seg = BTH_LEN + 1024 + 4
        out = []
        for p in (first, last):
            q = bytearray(p)
            if change == "icrc":
                q[-1] ^= 1
            elif change == "nak":
                q[BTH_LEN] = 0x60                   # AETH syndrome: a NAK
            elif change == "psn":
                q[11] ^= 1
            elif change == "length":
                q = q[:-8]                          # 4 bytes of payload short
            if change not in ("icrc", "two_sges"):
                q = append_icrc(q[:-4], b.ip, a.ip, b.port, a.port)
            out.append(bytes(q))
        a.receive_run(out[0], 0, b.address, 0.0)
        a.receive_run(mids, seg, b.address, 0.0)
        a.receive_run(out[1], 0, b.address, 0.0)
        if kern is not None:
            assert kern.edges == 0
        seen[name] = (bytes(ea.buf.view[0:8192]), dict(a.counters), ea.qp.comp.acked_psn,
                      [(w.wr_id, int(w.status)) for w in a.poll_cq(ea.send_cq, 8)])
    assert seen["kernel"] == seen["engine"]
    if change == "two_sges":                        # the engine places it all
        assert seen["kernel"][0][:3 * 1024 + 100] == (bytes(range(256)) * 32)[:3 * 1024 + 100]
        assert seen["kernel"][3] == [(1, 0)]
    elif change != "nak":       # (a NAK's syndrome: the engine's own way, whatever it is)
        assert seen["kernel"][0][:1024] == bytes(1024)      # the FIRST was not placed
        assert seen["kernel"][3] != [(1, 0)]


def _send_packets(kern, n: int, sges: int = 1, recv: bool = True,
                  flags: SendFlags = SendFlags.SIGNALED, op: W = W.SEND, inv: int | None = None):
    """A SEND of ``n`` bytes from ``ea.buf`` into a receive of ``n`` bytes in
    ``eb.buf`` (``sges`` SGEs; none posted without ``recv``), MTU 1024: its
    FIRST, its MIDDLEs laid end to end (a GRO run) and its LAST."""
    a, b, ea, eb = _side(kern, 1024, 128, False, engine=kern is None)
    ea.buf.view[0:8192] = bytes(range(256)) * 32
    h = n // 2
    if recv:
        sgl = [eb.sge(0, n)] if sges == 1 else [eb.sge(0, h), eb.sge(h, n - h)]
        b.post_recv(eb.qp, RecvWR(2, sgl))
    a.post_send(ea.qp, SendWR(1, op, [ea.sge(0, n)], flags, imm_data=0x12345678,
                              invalidate_rkey=eb.mr.rkey if inv is None else inv))
    reqs = [bytes(item[0]) for item in a.datagram_runs(0.0)]
    seg = BTH_LEN + 1024 + 4
    pkts = [d[o:o + seg] for d in reqs for o in range(0, len(d), seg)]
    return a, b, ea, eb, (pkts[0], b"".join(pkts[1:-1]), pkts[-1])


#: (what is changed, in which packet): each a SEND FIRST or LAST the kernel must
#: leave to the engine
SEND_EDGE_CHANGES = [("icrc", "first"), ("icrc", "last"), ("psn", "first"), ("psn", "last"),
                     ("length", "first"), ("length", "last"), ("two_sges", "both"),
                     ("no_receive", "first")]


def _send_edges(kern, change: str, which: str, n: int = 3 * 1024 + 102, op: W = W.SEND,
                inv: int | None = None):
    """A SEND of ``n`` bytes (its LAST 102 bytes and 2 of pad), its FIRST or LAST
    changed (``which``) by ``change``, received as a GRO socket hands it over by
    a responder armed for solicited events; everything observable of it."""
    flags = SendFlags.SIGNALED | (SendFlags.SOLICITED if change == "solicited" else 0)
    a, b, ea, eb, (first, mids, last) = _send_packets(
        kern, n, sges=2 if change == "two_sges" else 1, recv=change != "no_receive",
        flags=flags, op=op, inv=inv)
    eb.recv_cq.req_notify(solicited_only=True)
    out = [_changed(p, change, this if which == this else "", a, b)
           for p, this in ((first, "first"), (last, "last"))]
    b.receive_run(out[0], 0, a.address, 0.0)
    if mids:
        b.receive_run(mids, BTH_LEN + 1024 + 4, a.address, 0.0)
    b.receive_run(out[1], 0, a.address, 0.0)
    return _observed(b, eb)


def _changed(p: bytes, change: str, this: str, a, b) -> bytes:
    """The request packet ``p``, a SEND's FIRST, MIDDLE or LAST (``this``; "": left
    as it is), changed by ``change``: a bad ICRC; another PSN; 4 bytes short of
    an MTU (a FIRST) or 4 bytes more (a LAST, past its receive); the ICRC made
    good again after the last two."""
    if not this:
        return p
    q = bytearray(p)
    if change == "icrc":
        q[-1] ^= 1
    elif change == "psn":
        q[11] ^= 1
    elif change == "length" and this == "first":
        q = q[:-8]                          # 4 bytes short of an MTU
    elif change == "length":
        q = q[:-4] + bytes(4) + q[-4:]      # 4 bytes past the receive
    if change in ("psn", "length"):
        q = append_icrc(q[:-4], a.ip, b.ip, a.port, b.port)
    return bytes(q)


def _observed(b, eb):
    """Everything observable of the responder ``b`` after a SEND into ``eb``: its
    memory, counters, answers, QP state, solicited events and completions."""
    answers = [bytes(d) for d, _ in b.datagrams_to_send(0.0)]
    qb = eb.qp
    return (bytes(eb.buf.view[0:8192]), dict(b.counters), answers,
            (qb.resp.epsn, qb.resp.msn, qb.resp.off, qb.resp.kind, qb.state),
            eb.recv_cq.events,
            [(w.wr_id, int(w.status), int(w.opcode), w.byte_len, int(w.wc_flags), w.imm_data,
              w.invalidated_rkey) for w in b.poll_cq(eb.recv_cq, 8)])


@pytest.mark.parametrize("change,which", SEND_EDGE_CHANGES)
def test_a_sends_first_or_last_the_kernel_may_not_take_goes_the_engines_way(change, which):
    """The FIRST or the LAST of a SEND changed as a faulty requester or network
    might (the ICRC made good again but for ``icrc``: a PSN not expected, a
    FIRST short of an MTU or a LAST longer than the receive), into a receive of
    two SGEs, or with no receive posted: the kernel takes none of those
    (``sn_rx_edge``), the engine's general path decides (a NAK, an RNR NAK,
    LOC_LEN_ERR), and memory, the responder's answers, counters, state and
    completions are those of a responder without the kernel."""
    n = 3 * 1024 + 102
    engine = _send_edges(None, change, which, n)
    counting = Counting(kernel())
    fast = _send_edges(counting, change, which, n)
    assert counting.edges == (1 if which == "last" else 0)
    assert fast == engine
    if change == "two_sges":                    # the engine places it all
        assert fast[0][:n] == (bytes(range(256)) * 32)[:n]
        assert [w[:4] for w in fast[5]] == [(2, 0, 128, n)]
    else:
        assert [w[:5] for w in fast[5]] != [(2, 0, 128, n, 0)]


def test_a_sends_solicited_last_is_the_kernels_and_raises_the_event_the_engine_does():
    """UCX asks for a solicited event on each of its messages (the SE bit on the
    LAST): the kernel takes that LAST (``sn_rx_edge``, its BTH word 0 with SE),
    and the receive completes with the event a CQ armed for solicited ones
    raises, as the engine alone raises it."""
    n = 3 * 1024 + 102
    engine = _send_edges(None, "solicited", "last", n)
    counting = Counting(kernel())
    fast = _send_edges(counting, "solicited", "last", n)
    assert counting.edges == 2
    assert fast == engine
    assert fast[0][:n] == (bytes(range(256)) * 32)[:n]
    assert fast[4] == 1 and [w[:4] for w in fast[5]] == [(2, 0, 128, n)]
    plain = _send_edges(Counting(kernel()), "none", "last", n)
    assert plain[4] == 0                        # (no event for a message not solicited)


@pytest.mark.parametrize("n", [1024 + 102, 2048])
def test_a_sends_bytes_land_in_its_receive_by_the_kernels_first_and_last(n):
    """A SEND of two packets, a FIRST and a LAST and no MIDDLE (a LAST with pad,
    a LAST of a whole MTU), into a receive whose memory held zeros: both taken
    by the kernel, the bytes sent are the bytes received, and everything else
    is what the engine alone makes of it."""
    engine = _send_edges(None, "none", "last", n)
    counting = Counting(kernel())
    fast = _send_edges(counting, "none", "last", n)
    assert counting.edges == 2 and counting.taken == 0
    assert fast == engine
    assert fast[0][:n] == (bytes(range(256)) * 32)[:n] and not any(fast[0][n:])
    assert [w[:5] for w in fast[5]] == [(2, 0, 128, n, 0)]


@pytest.mark.parametrize("op,inv,flags", [(W.SEND_WITH_IMM, None, 2), (W.SEND_WITH_INV, None, 8),
                                          (W.SEND_WITH_INV, 0x5A5A00, None)])
def test_a_sends_last_with_an_immediate_or_an_ieth_is_the_kernels(op, inv, flags):
    """A SEND WITH IMMEDIATE's or WITH INVALIDATE's LAST, arriving alone: the
    kernel takes it (``sn_rx_edge`` with the 4 bytes after its BTH), and the
    receive completes with the immediate or the invalidated key as the engine
    alone completes it (IBV_WC_WITH_IMM, IBV_WC_WITH_INV); an IETH naming no key
    fails the receive (LOC_PROT_ERR), NAKs and moves the QP to ERR, as there."""
    n = 3 * 1024 + 102
    engine = _send_edges(None, "none", "", n, op, inv)
    counting = Counting(kernel())
    fast = _send_edges(counting, "none", "", n, op, inv)
    assert counting.edges == 2
    assert fast == engine
    if flags is not None:
        assert [w[:5] for w in fast[5]] == [(2, 0, 128, n, flags)]
        imm, rkey = fast[5][0][5:]           # the immediate, or the key invalidated
        assert (imm, bool(rkey)) == ((0x12345678, False) if flags == 2 else (0, True))
        assert fast[0][:n] == (bytes(range(256)) * 32)[:n]
    else:
        assert [w[:2] for w in fast[5]] == [(2, int(WCStatus.LOC_PROT_ERR))]
        assert fast[3][4] == 6 and len(fast[2]) == 1        # the QP in ERR, one NAK


def _send_run(kern, change: str, which: str, n: int = 3 * 1024 + 102, op: W = W.SEND,
              monkeypatch=None):
    """A SEND of ``n`` bytes (MTU 1024) whose FIRST, MIDDLEs and LAST arrive as one
    run, as a GRO socket hands them over, the packet ``which`` ("first",
    "middle": the first MIDDLE, "last") changed by ``change`` (``_changed``; for
    a SEND with immediate or invalidate, ``op``, none but "inv_unknown": an
    IETH naming no key); everything observable of it, and what
    ``responder.receive_send_run`` returned each time it ran."""
    flags = SendFlags.SIGNALED | (SendFlags.SOLICITED if change == "solicited" else 0)
    a, b, ea, eb, (first, mids, last) = _send_packets(
        kern, n, sges=2 if change == "two_sges" else 1, recv=change != "no_receive",
        flags=flags, op=op, inv=0x5A5A00 if change == "inv_unknown" else None)
    eb.recv_cq.req_notify(solicited_only=True)
    seg = BTH_LEN + 1024 + 4
    mid = [mids[o:o + seg] for o in range(0, len(mids), seg)]
    pkts = [_changed(first, change, "first" if which == "first" else "", a, b)]
    if mid:
        pkts += [_changed(mid[0], change, "middle" if which == "middle" else "", a, b)] + mid[1:]
    pkts.append(_changed(last, change, "last" if which == "last" else "", a, b))
    took = []
    run = responder.receive_send_run

    def counted(*args):
        took.append(run(*args))
        return took[-1]
    monkeypatch.setattr(responder, "receive_send_run", counted)
    b.receive_run(b"".join(pkts), seg, a.address, 0.0)
    monkeypatch.undo()
    return _observed(b, eb), took


#: (what is changed, in which packet) of a SEND that arrives as one run, and how
#: many of its four datagrams (FIRST, two MIDDLEs, LAST) ``receive_send_run``
#: takes: it stops at the first the kernel may not take, before it if it is
#: the FIRST, and leaves the rest to their own ways
SEND_RUN_CHANGES = [("none", "", 4), ("solicited", "last", 4), ("icrc", "first", 0),
                    ("icrc", "middle", 1), ("icrc", "last", 3), ("psn", "first", 0),
                    ("psn", "middle", 1), ("psn", "last", 3), ("length", "last", 3),
                    ("two_sges", "", 0), ("no_receive", "", 0), ("imm", "", 4),
                    ("inv", "", 4), ("inv_unknown", "", 4)]


@pytest.mark.parametrize("change,which,taken", SEND_RUN_CHANGES)
def test_a_send_in_one_run_is_taken_in_one_pass_up_to_what_the_kernel_may_not_take(
        change, which, taken, monkeypatch):
    """A SEND's FIRST, MIDDLEs and LAST in one run (an eager message of UCX or
    Open MPI: 8 KiB and a header) are taken in one pass (``receive_send_run``)
    as far as the kernel takes each packet alone: a bad ICRC, a PSN not
    expected, a LAST longer than the receive, a receive of two SGEs or none
    stop it there, and the engine's general path decides the rest.  A LAST
    with an immediate or an IETH is taken too; an IETH naming no key fails
    the receive (LOC_PROT_ERR) and the QP as the engine fails them.  Memory,
    the responder's answers, counters, state, events and completions are
    those of a responder without the kernel given the packets one by one."""
    n = 3 * 1024 + 102
    op = {"imm": W.SEND_WITH_IMM, "inv": W.SEND_WITH_INV,
          "inv_unknown": W.SEND_WITH_INV}.get(change, W.SEND)
    engine, _ = _send_run(None, change, which, n, op, monkeypatch)
    fast, took = _send_run(Counting(kernel()), change, which, n, op, monkeypatch)
    assert took == [taken]
    assert fast == engine
    if change in ("none", "solicited", "imm", "inv", "two_sges"):     # all received
        assert fast[0][:n] == (bytes(range(256)) * 32)[:n] and not any(fast[0][n:])
        assert [w[:4] for w in fast[5]] == [(2, 0, 128, n)]             # IBV_WC_RECV
        # IBV_WC_WITH_IMM, IBV_WC_WITH_INV
        assert fast[5][0][4] == {"imm": 2, "inv": 8}.get(change, 0)
        assert fast[4] == (change == "solicited")
    elif change == "inv_unknown":       # LOC_PROT_ERR, the QP in ERR (6)
        assert [w[:2] for w in fast[5]] == [(2, int(WCStatus.LOC_PROT_ERR))]
        assert fast[3][4] == 6
    else:
        assert [w[:2] for w in fast[5]] != [(2, 0)]


@pytest.mark.parametrize("n", [1024 + 1, 2048, 2048 + 64, 8 * 1024])
def test_a_sends_run_lands_whole_in_its_receive(n, monkeypatch):
    """A SEND of two or more packets in one run, its LAST short, padded or of a
    whole MTU: every datagram taken in the one pass, the bytes sent are the
    bytes received, and the rest is what the engine alone makes of it."""
    engine, _ = _send_run(None, "none", "", n, W.SEND, monkeypatch)
    fast, took = _send_run(Counting(kernel()), "none", "", n, W.SEND, monkeypatch)
    assert took == [-(-n // 1024)]
    assert fast == engine
    assert fast[0][:n] == (bytes(range(256)) * 32)[:n] and not any(fast[0][n:])
    assert [w[:5] for w in fast[5]] == [(2, 0, 128, n, 0)]


def test_a_corrupt_middle_is_counted_and_dropped_not_placed():
    a, b, ea, eb = _side(kernel(), 1024, 128, False)
    ea.buf.view[0:8192] = bytes(range(256)) * 32
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 8192)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    runs = a.datagram_runs(0.0)
    first, (buf, _, seg, _) = runs[0], runs[1]
    b.receive_run(bytes(first[0]), 0, a.address, 0.0)
    bad = bytearray(buf)
    bad[2 * seg + 100] ^= 0xFF                   # the third MIDDLE's payload
    b.receive_run(bytes(bad), seg, a.address, 0.0)
    assert b.counters["rcvd_icrc_err"] == 1
    assert eb.qp.resp.epsn == 3                       # FIRST and two MIDDLEs placed
    assert bytes(eb.buf.view[0:3 * 1024]) == bytes(ea.buf.view[0:3 * 1024])
    assert bytes(eb.buf.view[3 * 1024:8192]) == bytes(8192 - 3 * 1024)  # untouched
    # the rest, out of sequence now, is NAKed once as go-back-N does
    assert b.counters["out_of_seq_request"] >= 1


def test_a_middle_with_a_wrong_p_key_and_a_good_icrc_is_not_the_kernels():
    counting = Counting(kernel())
    a, b, ea, eb = _side(counting, 1024, 128, False)
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 8192)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    (first, _), (buf, _, seg, _) = a.datagram_runs(0.0)[:2]
    b.receive_run(bytes(first), 0, a.address, 0.0)
    pkts = [bytearray(buf[o:o + seg]) for o in range(0, len(buf), seg)]
    for i, p in enumerate(pkts):
        p[2] = 0x7F                                   # P_Key 0x7FFF
        pkts[i] = append_icrc(p[:-4], a.ip, b.ip, a.port, b.port)
    b.receive_run(b"".join(bytes(p) for p in pkts), seg, a.address, 0.0)
    assert counting.taken == 0
    assert b.counters["rcvd_bad_pkey"] == len(pkts) and eb.qp.resp.epsn == 1


def test_middles_beyond_the_writes_length_are_refused_memory_untouched():
    """A FIRST whose RETH asks for 2 MTUs, then the MIDDLEs of a longer WRITE
    (ICRCs good): the kernel places the one that fits and stops; the next is
    NAKed by the general path; nothing lands past the 2 MTUs, with the kernel
    as without."""
    outcome = {}
    for name, kern in (("python", None), ("kernel", Counting(kernel()))):
        a, b, ea, eb = _side(kern, 1024, 128, False, engine=kern is None)
        ea.buf.view[0:6 * 1024] = bytes(range(256)) * 24
        eb.buf.view[0:8192] = b"\xee" * 8192
        a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 6 * 1024)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
        (first, _), (buf, _, seg, _) = a.datagram_runs(0.0)[:2]
        first = bytearray(first)
        first[24:28] = (2 * 1024).to_bytes(4, "big")          # the RETH's DMA length
        first = append_icrc(first[:-4], a.ip, b.ip, a.port, b.port)
        b.receive_run(bytes(first), 0, a.address, 0.0)
        b.receive_run(bytes(buf), seg, a.address, 0.0)
        outcome[name] = (bytes(eb.buf.view[0:8192]), dict(b.counters), eb.qp.state,
                         [bytes(d) for d, _ in b.datagrams_to_send(0.0)])
        if kern is not None:
            assert kern.taken == 1
    assert outcome["kernel"] == outcome["python"]
    memory, counters, state, out = outcome["kernel"]
    assert memory[:2048] == bytes(range(256)) * 8
    assert memory[2048:] == b"\xee" * (8192 - 2048)
    assert counters["resp_nak_invalid_request"] == 1 and out


def test_middles_that_ask_for_an_ack_are_taken_and_each_ack_queued():
    """A MIDDLE with AckReq is the kernel's too: its ACK is queued as ``accept``
    queues it, so the ACKs that leave are the engine's (with ack_every=1, every
    MIDDLE asks; the receiver's ACKs, coalesced, name the last PSN taken)."""
    out = {}
    for name, kern in (("python", None), ("kernel", Counting(kernel()))):
        cfg = DeviceConfig(min_timer=1e-3, ack_every=1)
        a = Device("a", "10.0.0.1", config=cfg)
        b = Device("b", "10.0.0.2", config=DeviceConfig(min_timer=1e-3, ack_every=1,
                                                        fast_path=kern is not None))
        a.kernel = b.kernel = kern
        ea, eb = connect(a, b, mtu=1024, timeout=10, endpoint_args={"buf_size": 1 << 16})
        ea.buf.view[0:8192] = bytes(range(256)) * 32
        a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 8192)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
        for item in a.datagram_runs(0.0):
            b.receive_run(bytes(item[0]), item.seg if type(item) is Run else 0, a.address, 0.0)
        out[name] = ([bytes(d) for d, _ in b.datagrams_to_send(0.0)], dict(b.counters),
                     bytes(eb.buf.view[0:8192]), eb.qp.resp.epsn)
        if kern is not None:
            assert kern.taken == 6                # the 6 MIDDLEs, each with AckReq
    assert out["kernel"] == out["python"]
    acks, counters, memory, epsn = out["kernel"]
    assert epsn == 8 and memory == bytes(range(256)) * 32
    assert counters["ack_deferred"] >= 6 and len(acks) >= 1
    assert counters.get("rcvd_icrc_err", 0) == 0 == counters.get("rcvd_malformed", 0)


def test_append_icrc_agrees_with_the_kernels_tx_icrc():
    """A MIDDLE built by the kernel carries the ICRC ``append_icrc`` computes."""
    a, b, ea, eb = _side(kernel(), 512, 128, False)
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 4096)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    buf, dest, seg, _ = a.datagram_runs(0.0)[1]
    for o in range(0, len(buf) - seg, seg):
        pkt = bytes(buf[o:o + seg])
        assert pkt == bytes(append_icrc(bytearray(pkt[:-4]), a.ip, dest[0], a.port, dest[1]))


def test_the_kernels_constants_are_the_python_ones():
    """Each ``#define`` of accel/wire.h names, in its comment, the Python constant
    that is its one definition, and so do those of the other sources that mirror
    one; they agree (this needs no compiler)."""
    import importlib
    import pathlib
    import re
    here = pathlib.Path(accel.__file__).parent
    row = re.compile(r"^#define (\w+) (\w+)\s+/\* (softnic\.[\w.]+) \*/$", re.M)
    wire = (here / "wire.h").read_text()
    assert len(row.findall(wire)) == wire.count("#define") >= 7
    rows = [r for path in sorted(here.glob("*.[ch]")) for r in row.findall(path.read_text())]
    assert len(rows) >= 12
    for name, value, where in rows:
        module, attr = where.rsplit(".", 1)
        assert int(value.rstrip("uU"), 0) == getattr(importlib.import_module(module), attr), \
            (name, where)


@pytest.mark.parametrize("op", [W.SEND, W.RDMA_WRITE])
def test_a_gather_list_is_read_once_and_its_middles_built_by_the_kernel(op, monkeypatch):
    """A SEND or WRITE of several SGEs (UCX's eager zero-copy: a header, then the
    data) is read into one buffer as it starts (``requester.GATHER_ONCE_MAX``), so
    the kernel builds its MIDDLEs as for one SGE: the same datagrams as the general
    path, packet by packet, and as a list longer than the bound, gathered MTU by
    MTU; the receiver gets the SGEs' bytes in order."""
    sizes = [13, 5000, 2048, 3000]             # 10 061 bytes: FIRST, 8 MIDDLEs, LAST
    offs = [0, 100, 6000, 9000]
    wire = {}
    for name, kern, bound in (("kernel", Counting(kernel()), requester.GATHER_ONCE_MAX),
                              ("general", None, requester.GATHER_ONCE_MAX),
                              ("per packet", Counting(kernel()), 4096)):
        monkeypatch.setattr(requester, "GATHER_ONCE_MAX", bound)
        a, b, ea, eb = _side(kern, 1024, 128, False, engine=kern is None, both=kern is None)
        ea.buf.view[0:16384] = bytes(range(251)) * 65 + bytes(16384 - 251 * 65)
        if op is W.SEND:
            b.post_recv(eb.qp, RecvWR(5, [eb.sge(0, 16384)]))
            wr = SendWR(1, op, [ea.sge(o, n) for o, n in zip(offs, sizes)], SendFlags.SIGNALED)
        else:
            wr = SendWR(1, op, [ea.sge(o, n) for o, n in zip(offs, sizes)], SendFlags.SIGNALED,
                        remote_addr=eb.buf.addr, rkey=eb.mr.rkey)
        a.post_send(ea.qp, wr)
        out = [bytes(d) for d, _ in a.datagrams_to_send(0.0)]
        for d in out:
            b.receive_datagram(d, a.address, 0.0)
        if op is W.RDMA_WRITE:      # (the FIRST's RETH names this run's buffer: its offset)
            va = int.from_bytes(out[0][12:20], "big") - eb.buf.addr
            out[0] = (out[0][:12], va, out[0][20:-4])
        for d, _ in b.datagrams_to_send(0.0):
            a.receive_datagram(d, b.address, 0.0)
        [wc] = a.poll_cq(ea.send_cq, 4)
        assert wc.status == WCStatus.SUCCESS, name
        want = b"".join(bytes(ea.buf.view[o:o + n]) for o, n in zip(offs, sizes))
        assert bytes(eb.buf.view[0:len(want)]) == want, name
        wire[name] = out
        if name == "kernel":                       # the MIDDLEs, and a SEND's FIRST
            assert kern.built == (9 if op is W.SEND else 8), kern.built
        elif name == "per packet":
            assert kern.built == 0
    for other in ("general", "per packet"):
        diff = [i for i, (x, y) in enumerate(zip(wire["kernel"], wire[other])) if x != y]
        assert wire["kernel"] == wire[other], (other, diff, len(wire[other]))
    assert len(wire["kernel"]) == 10
