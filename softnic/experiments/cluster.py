"""Collectives on a simulated leaf-spine, in virtual time.

One engine ``Device`` per host of a ``softnic.transport.clos.LeafSpine``; one
rank per host.  Each rank builds a ``softnic.collectives`` ``Communicator``
over the pyverbs API on its device and calls ``allreduce`` (``ring``, ``tree``
or ``ptree``, the pipelined tree) or ``alltoall``; the ranks run as cooperative
tasks in virtual time (``softnic.collectives.virtual``).  Their chunking,
credits, QPs per peer (``qps``, chunk ``s`` on QP ``s mod qps``, each QP with
its own UDP source port and so its own ECMP path) and receiver-driven admission
(``admission``: a receiver grants credits, its clear-to-send, to at most
``grants`` senders at once, as the NCCL change in Meta's RoCE paper) are the
real ones.  With private payload memory each rank checks its result; past
``PRIVATE_PAYLOAD_MAX`` the ranks share payload pages (the timing does not
depend on the values).

Every packet is the engine's: its window, ACKs, retransmission and congestion
control all run.

Figures: the collective's completion time, every transfer's (message's)
completion time (CDF), per-host throughput over time (smoothed over a sliding
window), the fabric's queues and pause time, the ECMP load of each leaf's
uplinks.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..core.device import Device, DeviceConfig
from ..core.enums import SendFlags, WCStatus, WROpcode as W
from ..core.qp import SendWR
from .rig import connect
from ..transport.clos import PFC, LeafSpineConfig
from ..transport.sim import RED, WIRE_OVERHEAD, Fabric
from ..wire.roce import psn_diff

#: with ``payload="auto"``, ranks get memory of their own (and check their results)
#: while all their buffers together stay below this; above it they share pages
PRIVATE_PAYLOAD_MAX = 1 << 30


@dataclass
class ClusterConfig:
    hosts: int = 16
    hosts_per_leaf: int = 4
    spines: int | None = None          # None: hosts_per_leaf (1:1, no oversubscription)
    rate_gbps: float = 100.0
    spine_rate_gbps: float | None = None
    delay: float = 1e-6
    collective: str = "allreduce"      # allreduce or alltoall
    algorithm: str = "ring"            # ring, tree or ptree (pipelined tree) (allreduce)
    size: int = 16 << 20               # bytes per rank
    qps: int = 1                       # QPs per peer
    mode: str = "lossless"             # lossy or lossless (PFC)
    cc: str = "none"                   # a congestion spec: none, dcqcn, hpcc, ...
    admission: bool = False
    grants: int = 2                    # transfers a receiver admits at once
    routing: str = "ecmp"              # ecmp, flowlet or spray
    placement: str = "spread"          # spread: rank r on leaf r % leaves; packed
    buffer: int = 1 << 20              # per port (lossy)
    xoff: int = 96_000
    xon: int = 64_000
    headroom: int | None = None        # None: per link, what its round trip needs
    kmin: int = 5_000
    kmax: int = 200_000
    pmax: float = 0.01
    mtu: int = 4096
    window: int = 128
    ack_every: int = 4
    sample: float = 10e-6              # sampling interval of series (s)
    seed: int = 1
    max_time: float = 1.0              # virtual seconds before giving up
    chunk: int | None = None           # the collectives' chunk (slot) size; None: theirs
    slots: int | None = None           # receive slots per peer; None: theirs
    payload: str = "auto"              # private (checked), shared (one copy), auto
    qp_timeout: int = 14               # the collectives' QP timeout: RTO 4.096 us * 2**this

    def __post_init__(self) -> None:
        if self.collective not in ("allreduce", "alltoall"):
            raise ValueError(f"collective must be allreduce or alltoall, not {self.collective!r}")
        if self.collective == "allreduce" and self.algorithm not in ("ring", "tree", "ptree"):
            raise ValueError(f"allreduce algorithm must be ring, tree or ptree, not "
                             f"{self.algorithm!r}")
        if self.mode not in ("lossy", "lossless"):
            raise ValueError(f"mode must be lossy or lossless, not {self.mode!r}")
        if self.placement not in ("spread", "packed"):
            raise ValueError(f"placement must be spread or packed, not {self.placement!r}")
        if self.hosts < 2 or self.hosts % self.hosts_per_leaf:
            raise ValueError("hosts must be >= 2 and a multiple of hosts_per_leaf")
        if not 1 <= self.qps <= 64:
            raise ValueError(f"qps must be in 1..64, got {self.qps}")
        if self.grants < 1:
            raise ValueError("grants must be >= 1")
        if self.payload not in ("auto", "private", "shared"):
            raise ValueError(f"payload must be auto, private or shared, not {self.payload!r}")


def _fabric(cfg: ClusterConfig):
    """The leaf-spine of ``cfg``, the engine devices' configuration, and each rank's
    address and leaf."""
    n = cfg.hosts
    leaves = n // cfg.hosts_per_leaf
    spines = cfg.spines or cfg.hosts_per_leaf
    rate = cfg.rate_gbps * 1e9
    pkt = cfg.mtu + 12 + 4 + WIRE_OVERHEAD
    base_rtt = 8 * cfg.delay + 6 * pkt * 8 / rate
    dcfg = DeviceConfig(cc=cfg.cc, line_rate_bps=rate, base_rtt=base_rtt, window=cfg.window,
                        ack_every=cfg.ack_every, min_timer=max(200e-6, 20 * base_rtt),
                        check_icrc=False, icrc=False, max_qp_wr=1 << 14)
    fabric = Fabric(cfg.seed)
    cc_name = cfg.cc.split(":")[0]
    net = fabric.add_leaf_spine(LeafSpineConfig(
        leaves=leaves, hosts_per_leaf=cfg.hosts_per_leaf, spines=spines, host_rate_bps=rate,
        spine_rate_bps=None if cfg.spine_rate_gbps is None else cfg.spine_rate_gbps * 1e9,
        delay=cfg.delay, buffer_bytes=cfg.buffer,
        red=RED(cfg.kmin, cfg.kmax, cfg.pmax) if cc_name == "dcqcn" else None,
        int_telemetry=cc_name in ("hpcc", "swift"), routing=cfg.routing,
        pfc=PFC(cfg.xoff, cfg.xon, cfg.headroom) if cfg.mode == "lossless" else None,
        sample_interval=None))      # no per-port queue samples: ``_Series`` takes its own
    hosts = []
    for r in range(n):
        leaf = r % leaves if cfg.placement == "spread" else r // cfg.hosts_per_leaf
        hosts.append((f"10.{leaf}.{r // leaves}.{r % 250 + 1}", leaf))
    return fabric, net, dcfg, hosts


class _Series:
    """The figures sampled every ``cfg.sample`` of virtual time."""

    def __init__(self, net, addresses) -> None:
        self.net = net
        self.times: list = []
        self.host_rx = [[] for _ in addresses]
        self.nic_tx = [[] for _ in addresses]
        self.down = [net.leaves[net.leaf_of[a]].down[a] for a in addresses]
        self.nics = [net.nic[a] for a in addresses]
        self.switch_ports = [p for name, p in net.ports() if not name.startswith("nic ")]
        self.all_ports = [p for _, p in net.ports()]
        self.up_q: list = []
        self.paused: list = []

    def sample(self, now: float) -> None:
        self.times.append(now)
        for r, (d, nic) in enumerate(zip(self.down, self.nics)):
            self.host_rx[r].append(d.tx_bytes)
            self.nic_tx[r].append(nic.tx_bytes)
        self.up_q.append(max(p.qbytes for p in self.switch_ports))
        self.paused.append(sum(p.paused_for(now) for p in self.all_ports))


def _summary(cfg, fabric, net, devs, fct, ends, finished, errors, wall) -> dict:
    stats = net.port_stats(fabric.now)
    uplinks = [p for leaf in net.leaves for p in leaf.up]
    imbalance = []
    for leaf, per in net.uplink_bytes().items():
        if sum(per):
            imbalance.append(max(per) / (sum(per) / len(per)))
    counters = defaultdict(int)
    for d in devs:
        for k in ("retransmitted_pkts", "timeouts", "sent_pkts", "np_cnp_sent"):
            counters[k] += d.counters.get(k, 0)
    completion = max(ends) if finished and ends else None
    ideal = _ideal_time(cfg)
    return {
        "finished": finished,
        "completion_s": completion,
        "ideal_s": ideal,
        "slowdown": (completion / ideal) if completion and ideal else None,
        "transfers": len(fct),
        "fct_p50_s": _pct(fct, 50), "fct_p99_s": _pct(fct, 99),
        "switch_drops": sum(v["dropped"] + v["headroom_drops"] for v in stats.values()),
        "pause_frames": net.pause_frames_sent(),
        "pause_time_uplinks_s": sum(p.paused_for(fabric.now) for p in uplinks),
        "pause_time_all_s": sum(v["paused_s"] for v in stats.values()),
        "uplink_max_over_mean": max(imbalance) if imbalance else None,
        "uplink_mean_max_over_mean": sum(imbalance) / len(imbalance) if imbalance else None,
        "ecn_marked": sum(v["marked"] for v in stats.values()),
        "wc_errors": errors,
        "wall_s": wall,
        "host_events": fabric.events_processed,
        "events": fabric.events_processed + fabric.hops_processed,
        "oversubscription": net.cfg.oversubscription,
        **counters,
    }


def _result(cfg, summary, series: _Series, fct, rank_done, net) -> dict:
    return {
        "config": asdict(cfg),
        "summary": summary,
        "times": series.times,
        "host_rx_bytes": series.host_rx,
        "nic_tx_bytes": series.nic_tx,
        "switch_queue_max_bytes": series.up_q,     # the deepest switch port, per sample
        "paused_s": series.paused,                 # time paused, summed over every port
        "fct_s": sorted(fct),
        "rank_done_s": rank_done,
        "uplink_bytes": net.uplink_bytes(),
    }


def run(cfg: ClusterConfig, *, progress: bool = False) -> dict:
    """Run one collective; return a JSON-able dict of figures and series."""
    return run_collectives(cfg, progress=progress)


def _rank_program(cfg: ClusterConfig, shared: bool, starts: list, ends: list):
    """What each rank runs: its Communicator on a ``VirtualTransport``, one collective
    timed from its call to its return (``starts``, ``ends``), and (private payload)
    a check of the result against what every rank can compute."""
    from ..collectives import Communicator
    from ..collectives.virtual import VirtualTransport

    n = cfg.hosts
    count = max(n, cfg.size // 4 // n * n)          # int32 elements, n equal blocks
    admit = cfg.grants if cfg.admission else None
    memo: dict = {}

    def ramp():
        """``arange(count) % 1000``, the part of an allreduce's inputs and of its
        result that no rank's number changes: made once, not once per rank."""
        r = memo.get("ramp")
        if r is None:
            r = memo["ramp"] = np.arange(count, dtype=np.int32) % 1000
        return r

    def program(rank, vc):
        t = VirtualTransport(vc, rank, n, qps=cfg.qps, chunk=cfg.chunk, slots=cfg.slots,
                             admit=admit, qp_timeout=cfg.qp_timeout, timeout=cfg.max_time)
        comm = Communicator(rank, n, vc.store, transport=t)
        try:
            send = vc.buffer(rank, count * 4, np.int32)
            recv = vc.buffer(rank, count * 4, np.int32) if cfg.collective == "alltoall" \
                else None
            m = count // n
            if not shared:      # inputs every rank can check the result of
                if recv is None:
                    send[:] = ramp()
                    send += rank
                else:
                    send[:] = (rank * n + np.arange(count, dtype=np.int32) // m) * 7
            starts[rank] = vc.now
            if recv is None:
                comm.allreduce(send, algorithm=cfg.algorithm)
            else:
                comm.alltoall(send, recv)
            ends[rank] = vc.now
            if shared:
                return None
            if recv is None:
                want = memo.get("want")
                if want is None:        # the same for every rank
                    want = memo["want"] = ramp() * n + n * (n - 1) // 2
                return bool(np.array_equal(send, want))
            want = (np.arange(count, dtype=np.int32) // m * n + rank) * 7
            return bool(np.array_equal(recv, want))
        finally:
            comm.close()

    return program


def run_collectives(cfg: ClusterConfig, *, progress: bool = False) -> dict:
    """One collective of ``softnic.collectives`` (``Communicator.allreduce`` or
    ``alltoall``), a rank per host, in virtual time (``softnic.collectives.virtual``).
    With private payload memory every rank checks its result."""
    from ..collectives.virtual import VirtualCluster

    n = cfg.hosts
    fabric, net, dcfg, hosts = _fabric(cfg)
    shared = cfg.payload == "shared" or (cfg.payload == "auto" and
                                         2 * n * cfg.size > PRIVATE_PAYLOAD_MAX)
    vc = VirtualCluster(fabric, [ip for ip, _ in hosts], dcfg,
                        place=lambda d, r: net.connect(d.address, hosts[r][1]),
                        seed=cfg.seed, shared_payload=shared)
    starts, ends = [None] * n, [None] * n
    program = _rank_program(cfg, shared, starts, ends)
    devs_ready = vc.devices
    series = None
    bar = None

    def on_sample(now):
        nonlocal series
        if series is None:
            series = _Series(net, [(ip, 4791) for ip, _ in hosts])
        series.sample(now)
        if bar is not None:
            bar.n = round(now * 1e6)
            bar.refresh()
    if progress:
        from tqdm import tqdm
        bar = tqdm(unit="µs virtual", desc=f"{cfg.collective} {cfg.algorithm} n={n} "
                   f"q={cfg.qps}", leave=False)
    wall0 = time.perf_counter()
    finished, errors, checks = True, 0, []
    try:
        checks = vc.run(program, sample=cfg.sample, on_sample=on_sample,
                        max_time=cfg.max_time)
    except TimeoutError:
        finished = False
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - wall0
    if series is None:
        series = _Series(net, [(ip, 4791) for ip, _ in hosts])
    if finished and not shared and not all(checks):
        raise AssertionError(f"wrong results on ranks "
                             f"{[r for r, ok in enumerate(checks) if not ok]}")
    fct = []
    for (src, dst), (st, en) in sorted(vc.flows.items()):
        fct.extend(e - s for s, e in zip(st, en))
    t0 = min(x for x in starts if x is not None) if any(x is not None for x in starts) else 0.0
    done = [None if e is None else e - t0 for e in ends]
    finished = finished and all(e is not None for e in ends)
    devs = [d for d in devs_ready if d is not None]
    summary = _summary(cfg, fabric, net, devs, fct, [e for e in done if e is not None],
                       finished, errors, wall)
    summary["payload"] = "shared" if shared else "private (results checked)"
    return _result(cfg, summary, series, fct, done, net)


def _ideal_time(cfg: ClusterConfig) -> float:
    """Completion time at line rate with no contention (payload plus headers)."""
    rate = cfg.rate_gbps * 1e9
    eff = cfg.mtu / (cfg.mtu + 12 + 4 + WIRE_OVERHEAD)
    n, size = cfg.hosts, cfg.size
    if cfg.collective == "alltoall":
        return (n - 1) * (size // n) * 8 / rate / eff
    if cfg.algorithm == "ring":
        return 2 * (n - 1) * (size // n) * 8 / rate / eff
    rounds = (n - 1).bit_length()
    return 2 * rounds * size * 8 / rate / eff


def _pct(xs, p):
    from .bottleneck import percentile
    return percentile(xs, p) if xs else None


def smooth_rate(times, cum_bytes, window: float):
    """Throughput (Gbit/s) at each sample time over the sliding window
    ``(t - window, t]`` (linear between samples)."""
    out = []
    j = 0
    for i, t in enumerate(times):
        t0 = t - window
        while j < i and times[j + 1] <= t0:
            j += 1
        if times[j] > t0 or j == i:
            b0, span = cum_bytes[j], t - times[j]
        else:
            f = (t0 - times[j]) / (times[j + 1] - times[j])
            b0 = cum_bytes[j] + f * (cum_bytes[j + 1] - cum_bytes[j])
            span = window
        out.append((cum_bytes[i] - b0) * 8 / span / 1e9 if span > 0 else 0.0)
    return out


def write_json(obj, path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(obj, indent=1))
    return path


# ---------------------------------------------------------------- studies

#: what each study varies, over a base configuration: (label, changes)
STUDIES = {
    "qps": ("ring allreduce, completion time against QPs per peer (ECMP)",
            [(f"ecmp q={q}", dict(qps=q)) for q in (1, 2, 4, 8)]),
    "lossless": ("alltoall, lossy against lossless (PFC), no congestion control",
                 [("lossy", dict(mode="lossy")),
                  ("lossy, RTO 4 ms", dict(mode="lossy", qp_timeout=10)),
                  ("lossless", dict(mode="lossless"))]),
    "dcqcn": ("alltoall, DCQCN off and on, lossless and lossy",
              [("lossless", dict(mode="lossless", cc="none")),
               ("lossless+dcqcn", dict(mode="lossless", cc="dcqcn")),
               ("lossy", dict(mode="lossy", cc="none")),
               ("lossy+dcqcn", dict(mode="lossy", cc="dcqcn"))]),
    "admission": ("alltoall, receiver-driven admission (clear-to-send) against none, lossless",
                  [("no admission", dict(admission=False)),
                   ("admission, 1 grant", dict(admission=True, grants=1)),
                   ("admission, 2 grants", dict(admission=True, grants=2)),
                   ("admission, 4 grants", dict(admission=True, grants=4))]),
}

STUDY_BASE = {
    "qps": dict(collective="allreduce", algorithm="ring", mode="lossless"),
    "lossless": dict(collective="alltoall"),
    "dcqcn": dict(collective="alltoall"),
    "admission": dict(collective="alltoall", mode="lossless"),
}


def study(name: str, base: dict, *, seeds=(1,), progress: bool = False) -> dict:
    """Run every variant of study ``name`` over ``base`` (ClusterConfig fields)
    for each seed; return rows (one per variant and seed) and per-variant
    series of the first seed."""
    title, variants = STUDIES[name]
    rows, runs = [], {}
    for label, change in variants:
        for seed in seeds:
            cfg = ClusterConfig(**{**base, **STUDY_BASE[name], **change, "seed": seed})
            res = run(cfg, progress=progress)
            s = res["summary"]
            rows.append({"variant": label, "seed": seed, **{k: s[k] for k in (
                "finished", "completion_s", "ideal_s", "slowdown", "fct_p50_s", "fct_p99_s",
                "switch_drops", "pause_frames", "pause_time_uplinks_s", "pause_time_all_s",
                "uplink_max_over_mean", "uplink_mean_max_over_mean", "retransmitted_pkts",
                "timeouts", "ecn_marked", "wall_s", "events", "host_events")}})
            if label not in runs:
                runs[label] = res
    return {"study": name, "title": title, "base": base, "seeds": list(seeds), "rows": rows,
            "runs": runs}


# ---------------------------------------------------------------- PFC victim


@dataclass
class VictimConfig:
    """Head-of-line blocking by PFC: three leaves of four hosts under one spine
    whose links are fast enough (``spine_rate_gbps``) that no uplink is a
    bottleneck.  Hosts 1-3 of leaf 0 and of leaf 2 all write to host 0 of
    leaf 1 (a 6:1 incast: that host's port is the only bottleneck); the
    victim, host 0 of leaf 0, writes to host 0 of leaf 2, a path no other
    flow's bottleneck is on."""
    mode: str = "lossless"
    cc: str = "none"
    rate_gbps: float = 100.0
    spine_rate_gbps: float = 400.0
    duration: float = 2e-3
    delay: float = 1e-6
    msg: int = 256 << 10
    outstanding: int = 4
    buffer: int = 1 << 20
    xoff: int = 96_000
    xon: int = 64_000
    headroom: int | None = None        # None: per link, what its round trip needs
    mtu: int = 4096
    sample: float = 5e-6
    seed: int = 1


def _victim_network(cfg: VictimConfig):
    """Three leaves of four hosts under one spine, lossy or lossless as ``cfg.mode`` says."""
    rate = cfg.rate_gbps * 1e9
    pkt = cfg.mtu + 12 + 4 + WIRE_OVERHEAD
    base_rtt = 8 * cfg.delay + 6 * pkt * 8 / rate
    dcfg = DeviceConfig(cc=cfg.cc, line_rate_bps=rate, base_rtt=base_rtt, window=128,
                        ack_every=4, min_timer=max(200e-6, 20 * base_rtt), check_icrc=False,
                        icrc=False)
    fabric = Fabric(cfg.seed)
    dcqcn = cfg.cc.split(":")[0] == "dcqcn"
    net = fabric.add_leaf_spine(LeafSpineConfig(
        leaves=3, hosts_per_leaf=4, spines=1, host_rate_bps=rate,
        spine_rate_bps=cfg.spine_rate_gbps * 1e9, delay=cfg.delay, buffer_bytes=cfg.buffer,
        red=RED() if dcqcn else None,
        pfc=PFC(cfg.xoff, cfg.xon, cfg.headroom) if cfg.mode == "lossless" else None,
        sample_interval=cfg.sample))
    hosts = {}
    for leaf in range(3):
        for i in range(4):
            d = Device(f"l{leaf}h{i}", f"10.{leaf}.0.{i + 1}", config=dcfg)
            fabric.attach(d)
            net.connect(d.address, leaf)
            hosts[(leaf, i)] = d
    return fabric, net, hosts


def victim(cfg: VictimConfig) -> dict:
    fabric, net, hosts = _victim_network(cfg)
    flows = [("victim", (0, 0), (2, 0))] + [
        (f"incast l{leaf}h{i}", (leaf, i), (1, 0)) for leaf in (0, 2) for i in (1, 2, 3)]
    eps = []
    for name, a, b in flows:
        ea, eb = connect(hosts[a], hosts[b], mtu=cfg.mtu, timeout=10, endpoint_args=dict(
            buf_size=cfg.msg, max_send_wr=cfg.outstanding + 1, cq_depth=256))
        eps.append((name, hosts[a], ea, eb))

    def post(dev, ea, eb, k):
        for _ in range(k):
            dev.post_send(ea.qp, SendWR(0, W.RDMA_WRITE, [ea.sge(0, cfg.msg)],
                                        SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                        rkey=eb.mr.rkey))
    for _, dev, ea, eb in eps:
        post(dev, ea, eb, cfg.outstanding)
    times, acked = [], {name: [] for name, *_ in eps}
    first = {name: ea.qp.comp.acked_psn for name, _, ea, _ in eps}
    total = {name: 0 for name in acked}
    last = dict(first)
    uplink = net.leaves[0].up[0]
    paused = {"leaf0->spine0": [], "spine0->leaf1": [], "nic victim": []}
    t = 0.0
    wall0 = time.perf_counter()
    while t < cfg.duration:
        t = min(cfg.duration, t + cfg.sample)
        fabric.flush()
        fabric.run(until=t)
        times.append(t)
        for name, dev, ea, eb in eps:
            for wc in dev.poll_cq(ea.send_cq, 64):
                if wc.status == WCStatus.SUCCESS and t < cfg.duration:
                    post(dev, ea, eb, 1)
            p = ea.qp.comp.acked_psn
            total[name] += psn_diff(p, last[name])
            last[name] = p
            acked[name].append(total[name] * cfg.mtu)
        paused["leaf0->spine0"].append(uplink.paused_for(t))
        paused["spine0->leaf1"].append(net.spines[0].down[1].paused_for(t))
        paused["nic victim"].append(net.nic[hosts[(0, 0)].address].paused_for(t))
    wall = time.perf_counter() - wall0
    half = len(times) // 2
    span = times[-1] - times[half]

    def steady(name):
        return (acked[name][-1] - acked[name][half]) * 8 / span / 1e9

    stats = net.port_stats(fabric.now)
    return {
        "config": asdict(cfg),
        "times": times,
        "acked_bytes": acked,
        "paused_s": paused,
        "summary": {
            "victim_gbps": steady("victim"),
            "incast_total_gbps": sum(steady(n) for n in acked if n != "victim"),
            "pause_frames": net.pause_frames_sent(),
            "paused_s": {k: v[-1] for k, v in paused.items()},
            "switch_drops": sum(v["dropped"] + v["headroom_drops"] for v in stats.values()),
            "retransmitted_pkts": sum(h.counters["retransmitted_pkts"] for h in hosts.values()),
            "wall_s": wall,
            "events": fabric.events_processed + fabric.hops_processed,
        },
    }


# ---------------------------------------------------------------- plots

def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _cdf(ax, xs, label, scale=1e3):
    xs = sorted(xs)
    if not xs:
        return
    ax.step([x * scale for x in xs], [(i + 1) / len(xs) for i in range(len(xs))],
            where="post", label=label, lw=1)


def plot_run(res: dict, path, *, window: float = 50e-6) -> Path:
    """One collective: per-host receive throughput (sliding ``window``), the
    deepest switch queue and the ports' pause time, and the CDFs of transfer
    and per-rank completion times."""
    plt = _plt()
    path = Path(path)
    cfg, s = res["config"], res["summary"]
    t_ms = [t * 1e3 for t in res["times"]]
    fig, axes = plt.subplots(3, 1, figsize=(9, 10))
    ax = axes[0]
    rates = [smooth_rate(res["times"], series, window) for series in res["host_rx_bytes"]]
    if len(rates) <= 8:
        for r, series in enumerate(rates):
            ax.plot(t_ms, series, lw=0.6, label=f"rank {r}")
        ax.legend(fontsize=6, ncol=4)
    else:                       # many hosts: the spread across them at each instant
        cols = [sorted(col) for col in zip(*rates)]
        k = len(rates)
        ax.fill_between(t_ms, [c[k // 10] for c in cols], [c[k - 1 - k // 10] for c in cols],
                        color="C0", alpha=0.3, lw=0, label="10th to 90th percentile of hosts")
        ax.plot(t_ms, [c[k // 2] for c in cols], color="C0", lw=0.8, label="median host")
        ax.plot(t_ms, [c[0] for c in cols], color="C3", lw=0.5, label="slowest host")
        ax.legend(fontsize=7)
    ax.set_ylabel(f"per-host receive rate (Gbit/s,\nsliding {window * 1e6:g} µs window)")
    ax.set_xlabel("time (ms, virtual)")
    comp = s["completion_s"]
    algo = cfg["algorithm"] if cfg["collective"] == "allreduce" else ""
    ax.set_title(f"{cfg['collective']} {algo}"
                 f" {cfg['size'] / 2**20:g} MiB, {cfg['hosts']} hosts, {cfg['qps']} QP/peer, "
                 f"{cfg['mode']}, cc={cfg['cc']}, {cfg['routing']}"
                 f"{', admission' if cfg['admission'] else ''} — "
                 + (f"{comp * 1e3:.3f} ms ({s['slowdown']:.2f}x ideal)" if comp else "unfinished"),
                 fontsize=9)
    ax = axes[1]
    ax.plot(t_ms, [q / 1e3 for q in res["switch_queue_max_bytes"]], lw=0.6, color="k",
            label="deepest switch port queue")
    ax.set_ylabel("queue (KB)")
    ax.set_xlabel("time (ms, virtual)")
    ax2 = ax.twinx()
    ax2.plot(t_ms, [p * 1e6 for p in res["paused_s"]], lw=0.8, color="r",
             label="time paused, summed over all ports (NICs too)")
    ax2.set_ylabel("cumulative pause (µs)", color="r")
    ax.legend(loc="upper left", fontsize=7)
    ax2.legend(loc="upper right", fontsize=7)
    ax = axes[2]
    _cdf(ax, res["fct_s"],
         "each message between two ranks (first chunk posted to last chunk taken)")
    _cdf(ax, [t for t in res["rank_done_s"] if t is not None],
         "each rank's collective (0 to its last receive)")
    ax.set_xlabel("completion time (ms)")
    ax.set_xscale("log")
    ax.legend(fontsize=7)
    ax.set_ylabel("CDF")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_study(st: dict, path) -> Path:
    """Completion time (relative to line rate) per variant, and the CDF of
    transfer completion times of each variant's first seed."""
    plt = _plt()
    path = Path(path)
    labels = list(st["runs"])
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    for i, lab in enumerate(labels):
        ys = [r["completion_s"] * 1e3 for r in st["rows"]
              if r["variant"] == lab and r["completion_s"] is not None]
        ax.scatter([i] * len(ys), ys, color="C0", s=14, zorder=3)
        if ys:
            ax.bar(i, sum(ys) / len(ys), color="C0", alpha=0.35)
    ideal = st["rows"][0]["ideal_s"] * 1e3
    ax.axhline(ideal, color="k", ls="--", lw=0.8, label="line rate, no contention")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, fontsize=8)
    ax.set_ylabel("collective completion time (ms)")
    ax.legend(fontsize=7)
    b = st["base"]
    ax.set_title(f"{st['title']}\n{b.get('hosts')} hosts, {b.get('size', 0) / 2**20:g} MiB/rank, "
                 f"seeds {st['seeds']} (bar: mean, dots: runs)", fontsize=8)
    ax = axes[1]
    for lab in labels:
        _cdf(ax, st["runs"][lab]["fct_s"], lab)
    ax.set_xlabel("transfer (message) completion time (ms)")
    ax.set_ylabel("CDF")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[2]                # pause time and the deepest queue, per variant (first seed)
    for i, lab in enumerate(labels):
        r = next(r for r in st["rows"] if r["variant"] == lab)
        ax.bar(i - 0.2, r["pause_time_all_s"] * 1e3, 0.4, color="C3",
               label="time paused, all ports (ms)" if i == 0 else None)
        res = st["runs"][lab]
        q = max(res["switch_queue_max_bytes"], default=0) / 1e6
        ax.bar(i + 0.2, q, 0.4, color="C7", label="deepest switch queue (MB)" if i == 0 else None)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, fontsize=8)
    ax.set_title("PFC pause time summed over every port, and the deepest switch queue seen",
                 fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_victim(runs: dict, path, *, window: float = 50e-6) -> Path:
    """The victim's goodput (sliding ``window``) and the pause time of the
    ports on its path, per mode."""
    plt = _plt()
    path = Path(path)
    fig, axes = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True)
    for i, (label, res) in enumerate(runs.items()):
        t = res["times"]
        t_ms = [x * 1e3 for x in t]
        axes[0].plot(t_ms, smooth_rate(t, res["acked_bytes"]["victim"], window), lw=0.9,
                     color=f"C{i}", label=f"victim, {label}")
        inc = [sum(v) for v in zip(*[b for n, b in res["acked_bytes"].items() if n != "victim"])]
        axes[0].plot(t_ms, smooth_rate(t, inc, window), lw=0.6, ls=":", color=f"C{i}",
                     label=f"6:1 incast total, {label}")
        axes[1].plot(t_ms, [p * 1e6 for p in res["paused_s"]["leaf0->spine0"]], lw=0.9,
                     color=f"C{i}", label=f"leaf0→spine0 (victim's uplink), {label}")
    axes[0].set_ylabel(f"goodput (Gbit/s, sliding {window * 1e6:g} µs)")
    axes[0].legend(fontsize=7)
    axes[0].set_title("PFC head-of-line blocking: the victim (leaf0 h0 → leaf2 h0) shares no "
                      "bottleneck with the 6:1 incast to leaf1 h0", fontsize=9)
    axes[1].set_ylabel("cumulative time paused (µs)")
    axes[1].set_xlabel("time (ms, virtual)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
