"""Congestion and loss experiments in virtual time.

``incast``: N senders write to one receiver through one output-queued switch
(finite buffer, RED/ECN marking, INT stamping).  Every sender's QP runs the
chosen controller; one more sender may join late.  Results: per-flow
throughput through the bottleneck over time, the bottleneck queue over time,
each sender's rate or window over time, and the summary figures (Jain's
fairness index at steady state, p50/p99 queue, goodput, drops,
retransmissions, and how long a late flow takes to reach its fair share).

``loss``: one flow over a lossy link, go-back-N against selective repeat,
goodput across loss rates.

Everything runs in the simulated fabric, so 100 Gbit/s links cost only CPU
time, the figures do not depend on this machine's speed, and the same seed
gives the same run.
"""

from __future__ import annotations

import json
import math
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from pathlib import Path

from ..core.device import Device, DeviceConfig
from ..core.enums import SendFlags, WCStatus, WROpcode as W
from ..core.qp import SendWR
from ..driver.faults import FaultModel
from ..wire.roce import psn_diff
from .rig import connect
from ..transport.sim import RED, WIRE_OVERHEAD, Fabric

ACK_BYTES = 12 + 4 + 4 + WIRE_OVERHEAD      # BTH + AETH + ICRC, with IP/UDP


def jain(xs) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    xs = list(xs)
    s2 = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * s2) if s2 > 0 else 0.0


def percentile(xs, p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return 0.0
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class IncastConfig:
    cc: str = "dcqcn"
    senders: int = 16
    rate_gbps: float = 25.0
    duration: float = 0.02           # seconds of virtual time
    late_join: float | None = None   # one more sender starts then (seconds)
    mtu: int = 4096
    msg: int = 256 << 10             # bytes per RDMA WRITE
    outstanding: int = 4             # WRITEs each sender keeps posted
    window: int = 128                # packets in flight per QP at most (the transport's cap)
    ack_every: int = 4               # packets per ACK request
    delay: float = 1e-6              # propagation per link (seconds)
    buffer: int = 2 << 20            # switch buffer per egress port (bytes)
    kmin: int = 5_000                # RED/ECN (DCQCN paper's switch settings)
    kmax: int = 200_000
    pmax: float = 0.01
    # switches stamp INT; None: only for controllers whose runs it can change
    # (HPCC reads it; Swift's on_ack sees the ACKs that carry it).  For none,
    # DCQCN and TIMELY a run is the same with and without it, and INT costs
    # a Hop and a Datagram copy per packet per port.
    int_telemetry: bool | None = None
    selective_repeat: bool = False
    bin: float = 20e-6               # sampling interval (seconds)
    seed: int = 1
    # lossless: the switch is a leaf of softnic.transport.clos with PFC
    # (XOFF/XON bytes per ingress; the buffer then only bounds nothing)
    pfc: bool = False
    xoff: int = 96_000
    xon: int = 64_000


@dataclass
class FlowSeries:
    name: str
    start: float
    tput_gbps: list = field(default_factory=list)       # per bin, through the bottleneck
    goodput_gbps: list = field(default_factory=list)    # per bin, newly acknowledged bytes
    inflight_kb: list = field(default_factory=list)     # per bin, sent and not acknowledged
    rate_gbps: list = field(default_factory=list)       # controller's pacing rate per bin
    window_kb: list = field(default_factory=list)       # controller's window per bin
    completed_bytes: int = 0


def cc_reads_int(spec: str) -> bool:
    """Whether INT stamping can change a run of controller ``spec``."""
    return spec.split(":")[0].strip().lower() not in ("none", "dcqcn", "timely", "")


def _flow_dict(f: FlowSeries) -> dict:
    return {"name": f.name, "start": f.start, "tput_gbps": f.tput_gbps,
            "goodput_gbps": f.goodput_gbps, "inflight_kb": f.inflight_kb,
            "rate_gbps": f.rate_gbps, "window_kb": f.window_kb,
            "completed_bytes": f.completed_bytes}


def incast(cfg: IncastConfig, *, progress: bool = False) -> dict:
    """Run one incast experiment; return a JSON-able dict of series and figures."""
    run = _IncastRun(cfg)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=run.nbins, unit="bin", desc=f"incast {cfg.cc} x{run.n}", leave=False)
    wall0 = time.perf_counter()
    for b in range(run.nbins):
        run.step(b * cfg.bin)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return run.result(time.perf_counter() - wall0)


class _IncastRun:
    """One incast experiment: the fabric (a switch, or a PFC leaf), the receiver and
    its senders, stepped one sampling bin at a time."""

    def __init__(self, cfg: IncastConfig):
        self.cfg = cfg
        rate = cfg.rate_gbps * 1e9
        pkt = cfg.mtu + 12 + 4 + WIRE_OVERHEAD
        base_rtt = 4 * cfg.delay + 2 * pkt * 8 / rate + 2 * ACK_BYTES * 8 / rate
        self.n = n = cfg.senders + (1 if cfg.late_join is not None else 0)
        # No link of this fabric corrupts, so every ICRC would check: receivers do not
        # check (check_icrc=False) and senders append zeros (icrc=False) - the same run
        # (tests/test_sim_icrc.py).  Controllers are told the path as the fabric
        # knows it: the line rate, the base RTT and the flows sharing the bottleneck.
        dcfg = DeviceConfig(cc=cfg.cc, line_rate_bps=rate, base_rtt=base_rtt, window=cfg.window,
                            ack_every=cfg.ack_every, selective_repeat=cfg.selective_repeat,
                            min_timer=max(200e-6, 20 * base_rtt), check_icrc=False,
                            icrc=False, expected_flows=n)
        self.fabric = Fabric(cfg.seed)
        join = self._build_network(rate)
        self.recv = recv = Device("recv", "10.0.0.1", config=dcfg)
        self.fabric.attach(recv)
        join(recv.address)
        self.flows = []
        for i in range(n):
            dev = Device(f"s{i}", f"10.0.1.{i + 1}", config=dcfg)
            self.fabric.attach(dev)
            join(dev.address)
            ea, eb = connect(dev, recv, mtu=cfg.mtu, timeout=8, endpoint_args=dict(
                buf_size=cfg.msg, max_send_wr=cfg.outstanding + 1, cq_depth=256))
            start = cfg.late_join if (cfg.late_join is not None and i == n - 1) else 0.0
            # (WRs posted, acknowledged PSN at the last sample, the device's address)
            self.flows.append((dev, ea, eb, FlowSeries(f"s{i}", start),
                               [0, ea.qp.comp.acked_psn, dev.address]))
        if cfg.pfc:
            self.port = self.net.leaves[0].down[recv.address]
            self.nics = [self.net.nic[fl[0].address] for fl in self.flows]
        else:
            self.port = self.sw.port(recv.address)
            self.nics = []
        self.nbins = int(round(cfg.duration / cfg.bin))
        self.times: list = []
        self.pause_t: list = []
        self.prev_tx: dict = {}
        self.errors = 0
        self.touched: dict = {}     # devices posted to since the fabric last ran (in order)
        self.waiting = n            # flows not yet started

    def _build_network(self, rate: float):
        """The bottleneck: one switch, or (``pfc``) a lossless leaf; returns how a host
        joins it."""
        cfg, fabric = self.cfg, self.fabric
        int_telemetry = cfg.int_telemetry
        if int_telemetry is None:
            int_telemetry = cc_reads_int(cfg.cc)
        red = RED(cfg.kmin, cfg.kmax, cfg.pmax)
        if cfg.pfc:
            from ..transport.clos import PFC, LeafSpineConfig
            self.net = net = fabric.add_leaf_spine(LeafSpineConfig(
                leaves=1, hosts_per_leaf=self.n + 1, spines=1, host_rate_bps=rate,
                delay=cfg.delay, buffer_bytes=cfg.buffer, red=red, int_telemetry=int_telemetry,
                pfc=PFC(cfg.xoff, cfg.xon), sample_interval=cfg.bin / 20))
            return lambda address: net.connect(address, 0)
        self.sw = sw = fabric.add_switch("sw", buffer_bytes=cfg.buffer, red=red,
                                         int_telemetry=int_telemetry)
        return lambda address: fabric.connect(address, sw, rate_bps=rate, delay=cfg.delay)

    def _post(self, dev, ea, eb, k):
        cfg = self.cfg
        self.touched[dev.address] = None
        for _ in range(k):
            dev.post_send(ea.qp, SendWR(0, W.RDMA_WRITE, [ea.sge(0, cfg.msg)], SendFlags.SIGNALED,
                                        remote_addr=eb.buf.addr, rkey=eb.mr.rkey))

    def step(self, t: float) -> None:
        """Start the flows due at ``t``, run one bin, and sample every flow."""
        cfg = self.cfg
        if self.waiting:
            for dev, ea, eb, fs, posted in self.flows:
                if posted[0] == 0 and t >= fs.start:
                    self._post(dev, ea, eb, cfg.outstanding)
                    posted[0] = cfg.outstanding
                    if posted[0]:
                        self.waiting -= 1
        # only a device the driver posted to has output the fabric has not drained
        self.fabric.flush(self.touched)
        self.touched.clear()
        self.fabric.run(until=t + cfg.bin, flush=False)
        self.times.append(round(t + cfg.bin, 9))
        self._sample(t)
        if self.nics:
            self.pause_t.append(sum(p.paused_for(t + cfg.bin) for p in self.nics))

    def _sample(self, t) -> None:
        """Every flow's bin: repost what completed, and record its series."""
        cfg = self.cfg
        mtu, bin_ = cfg.mtu, cfg.bin
        repost = t + bin_ < cfg.duration
        tx_by_src = self.port.tx_by_src
        prev_tx = self.prev_tx
        for dev, ea, eb, fs, posted in self.flows:
            wcs = ea.send_cq.poll(64)
            if wcs:
                ok = 0
                for wc in wcs:
                    if wc.status != WCStatus.SUCCESS:
                        self.errors += 1
                    else:
                        ok += 1
                fs.completed_bytes += ok * cfg.msg
                if ok and repost:
                    self._post(dev, ea, eb, ok)
            qp = ea.qp
            acked_psn = qp.comp.acked_psn
            started = posted[0]
            if started:
                fs.goodput_gbps.append(psn_diff(acked_psn, posted[1]) * mtu * 8 / bin_ / 1e9)
                fs.inflight_kb.append(psn_diff(qp.req.max_sent_psn, acked_psn) * mtu / 1e3)
            else:
                fs.goodput_gbps.append(0.0)
                fs.inflight_kb.append(0.0)
            posted[1] = acked_psn
            address = posted[2]
            tx = tx_by_src.get(address, 0)
            fs.tput_gbps.append((tx - prev_tx.get(address, 0)) * 8 / bin_ / 1e9)
            prev_tx[address] = tx
            cc = qp.cc
            if cc is not None and started:
                fs.rate_gbps.append(None if cc.rate is None else cc.rate / 1e9)
                fs.window_kb.append(None if cc.window is None else cc.window / 1e3)
            else:
                fs.rate_gbps.append(None)
                fs.window_kb.append(None)

    def result(self, wall: float) -> dict:
        """The series and the figures (steady state: the second half of the run, or of
        what follows a late join)."""
        cfg, n, port, times, pause_t = self.cfg, self.n, self.port, self.times, self.pause_t
        series = [fl[3] for fl in self.flows]
        steady_from = cfg.duration * 0.5
        if cfg.late_join is not None:
            steady_from = max(steady_from, cfg.late_join + (cfg.duration - cfg.late_join) * 0.5)
        # the bins' times and the queue's samples are in time order (the fabric's
        # events are): what follows steady_from is a tail of each
        first = bisect_right(times, steady_from)
        steady = range(first, len(times))
        means = [sum(f.goodput_gbps[first:]) / max(1, len(steady)) for f in series]
        # sorted once here: percentile() sorts each time, in linear time when sorted
        q_all = sorted(map(itemgetter(1), port.samples))
        q_steady = sorted(map(itemgetter(1), port.samples[
            bisect_right(port.samples, steady_from, key=itemgetter(0)):]))
        pc = port.stats(self.fabric.now) if cfg.pfc else port.counters
        goodput = sum(sum(f.goodput_gbps) for f in series) * cfg.bin / cfg.duration
        late = None
        if cfg.late_join is not None:
            late = convergence_time(times, series[-1].goodput_gbps, cfg.late_join,
                                    cfg.rate_gbps / n)
        every = max(1, len(port.samples) // 4000)
        return {
            "config": asdict(cfg),
            "times": times,
            "flows": [_flow_dict(f) for f in series],
            "senders_paused_s": pause_t,
            "queue": {"t": [t for t, _ in port.samples[::every]],
                      "bytes": [q for _, q in port.samples[::every]]},
            "summary": {
                "cc": cfg.cc, "senders": n,
                "jain_steady": jain(means),
                "steady_from_s": steady_from,
                "steady_goodput_gbps": means,
                "steady_total_goodput_gbps": sum(means),
                "queue_p50_kb": percentile(q_all, 50) / 1e3,
                "queue_p99_kb": percentile(q_all, 99) / 1e3,
                "queue_steady_p50_kb": percentile(q_steady, 50) / 1e3,
                "queue_steady_p99_kb": percentile(q_steady, 99) / 1e3,
                "queue_max_kb": pc["max_qlen"] / 1e3,
                "switch_drops": pc["dropped"],
                "ecn_marked": pc["marked"],
                "cnps_sent": self.recv.counters["np_cnp_sent"],
                "retransmitted_pkts": sum(d.counters["retransmitted_pkts"] for d, *_ in self.flows),
                "timeouts": sum(d.counters["timeouts"] for d, *_ in self.flows),
                "goodput_gbps": goodput,
                "goodput_fraction": goodput / cfg.rate_gbps,
                "wc_errors": self.errors,
                "late_flow_converged_after_s": late,
                "pause_frames": self.net.pause_frames_sent() if cfg.pfc else 0,
                "senders_paused_s": pause_t[-1] if pause_t else 0.0,
                "senders_paused_steady_s": (pause_t[-1] - pause_t[steady[0] - 1]
                                            if pause_t and steady and steady[0] else 0.0),
                "wall_s": wall,
                "events": self.fabric.events_processed,
                "all_events": self.fabric.events_processed + self.fabric.hops_processed,
            },
        }


def convergence_time(times, tput, join: float, fair: float, *, band: float = 0.25,
                     smooth: int = 10, hold: float = 1e-3):
    """Seconds after ``join`` until the flow's throughput (mean of ``smooth``
    bins) enters ``fair`` +- ``band`` and stays there for ``hold`` seconds (or to
    the end of the run, if that is sooner).  None if it never does."""
    sm = []
    for i in range(len(tput)):
        w = tput[max(0, i - smooth + 1):i + 1]
        sm.append(sum(w) / len(w))
    lo, hi = fair * (1 - band), fair * (1 + band)
    start = None
    for t, x in zip(times, sm):
        if t <= join + (times[1] - times[0]) * smooth:
            continue
        if lo <= x <= hi:
            if start is None:
                start = t
            if t - start >= hold:
                return start - join
        else:
            start = None
    if start is not None:
        return start - join
    return None


# ---------------------------------------------------------------- loss


def goodput_under_loss(loss: float, selective_repeat: bool, *, total: int = 8 << 20,
                       msg: int = 1 << 20, rate: float = 10e9, delay: float = 150e-6,
                       window: int = 128, mtu: int = 4096, seed: int = 1) -> dict:
    """One RC QP streams RDMA WRITEs over a rate-limited link losing ``loss`` of
    the packets in both directions; goodput in virtual time.  ValueError if
    ``total`` holds no whole message of ``msg`` bytes."""
    if msg <= 0 or total < msg:
        raise ValueError(f"total ({total} B) must hold at least one message of msg ({msg} B)")
    cfg = DeviceConfig(selective_repeat=selective_repeat, window=window, min_timer=100e-6)
    a = Device("a", "10.0.0.1", config=cfg)
    b = Device("b", "10.0.0.2", config=cfg)
    fabric = Fabric(seed, default_faults=FaultModel(loss=loss), default_delay=delay,
                    default_rate_bps=rate)
    fabric.attach(a)
    fabric.attach(b)
    n = total // msg
    ea, eb = connect(a, b, mtu=mtu, timeout=8, endpoint_args=dict(
        buf_size=msg, max_send_wr=n + 1, cq_depth=n + 16))
    for i in range(n):
        a.post_send(ea.qp, SendWR(i, W.RDMA_WRITE, [ea.sge(0, msg)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    got = []

    def done() -> bool:
        got.extend(a.poll_cq(ea.send_cq, 64))
        return len(got) == n

    t0 = time.perf_counter()
    fabric.run(until=600.0, stop=done)
    wall = time.perf_counter() - t0
    ok = len(got) == n and all(w.status == WCStatus.SUCCESS for w in got)
    sent = a.counters["sent_pkts"]
    useful = n * -(-msg // mtu)
    return dict(loss=loss, mode="selective repeat" if selective_repeat else "go-back-N",
                ok=ok, virtual_s=fabric.now, goodput_gbps=total * 8 / fabric.now / 1e9,
                data_pkts_sent=sent, useful_pkts=useful, overhead=sent / useful - 1,
                retransmitted_pkts=a.counters["retransmitted_pkts"],
                timeouts=a.counters["timeouts"], wall_s=wall, events=fabric.events_processed)


def loss_sweep(losses, *, progress: bool = False, **kw) -> list[dict]:
    rows = []
    runs = [(sr, loss) for sr in (False, True) for loss in losses]
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(runs), unit="run", desc="loss sweep", leave=False)
    for sr, loss in runs:
        rows.append(goodput_under_loss(loss, sr, **kw))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    base = {r["mode"]: r["goodput_gbps"] for r in rows if r["loss"] == 0}
    for r in rows:
        r["vs_lossless"] = r["goodput_gbps"] / base[r["mode"]] if r["mode"] in base else None
    return rows


# ---------------------------------------------------------------- plots


def plot_incast(res: dict, path: str | Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    t_ms = [t * 1e3 for t in res["times"]]
    fig, axes = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    ax = axes[0]
    k = 5
    for f in res["flows"]:
        ax.plot(t_ms, _smooth(f["goodput_gbps"], k), lw=0.8,
                label=f["name"] + (" (late)" if f["start"] > 0 else ""))
    ax.set_ylabel(f"per-flow goodput (Gbit/s,\nsliding {k * res['config']['bin'] * 1e6:g} µs "
                  "window)")
    s = res["summary"]
    ax.set_title(f"incast {s['senders']}:1, cc={s['cc']}, {res['config']['rate_gbps']:g} Gbit/s "
                 f"{'lossless (PFC) ' if res['config'].get('pfc') else ''}"
                 f"— Jain {s['jain_steady']:.3f}, queue p99 {s['queue_p99_kb']:.0f} KB, "
                 f"goodput {s['goodput_fraction']:.2f}")
    if len(res["flows"]) <= 17:
        ax.legend(fontsize=6, ncol=6, loc="upper right")
    ax = axes[1]
    ax.plot([t * 1e3 for t in res["queue"]["t"]], [q / 1e3 for q in res["queue"]["bytes"]],
            lw=0.6, color="k")
    ax.axhline(res["config"]["buffer"] / 1e3, color="r", ls="--", lw=0.6, label="buffer")
    ax.axhline(res["config"]["kmin"] / 1e3, color="g", ls=":", lw=0.6, label="Kmin")
    ax.axhline(res["config"]["kmax"] / 1e3, color="g", ls="--", lw=0.6, label="Kmax")
    ax.set_ylabel("bottleneck queue (KB)")
    ax.legend(fontsize=7, loc="upper left")
    if any(res.get("senders_paused_s") or ()):
        ax2 = ax.twinx()
        ax2.plot(t_ms, [p * 1e6 for p in res["senders_paused_s"]], color="r", lw=0.8,
                 label=f"senders paused by PFC, summed ({s['pause_frames']} PAUSE frames)")
        ax2.set_ylabel("cumulative pause (µs)", color="r")
        ax2.legend(fontsize=7, loc="lower right")
    ax = axes[2]
    plotted = False
    for f in res["flows"]:
        if any(r is not None for r in f["rate_gbps"]):
            ax.plot(t_ms, [float("nan") if r is None else r for r in f["rate_gbps"]], lw=0.8)
            plotted = True
    if plotted:
        ax.set_ylabel("sender pacing rate (Gbit/s)")
    else:
        for f in res["flows"]:
            ax.plot(t_ms, [float("nan") if w is None else w for w in f["window_kb"]], lw=0.8)
        if any(w is not None for f in res["flows"] for w in f["window_kb"]):
            ax.set_ylabel("sender window (KB)")
        else:
            ax.cla()
            for f in res["flows"]:
                ax.plot(t_ms, f["inflight_kb"], lw=0.8)
            ax.set_ylabel("no controller: bytes in flight (KB)")
    ax.set_xlabel("time (ms, virtual)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_loss(rows: list[dict], path: str | Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in ("go-back-N", "selective repeat"):
        rs = [r for r in rows if r["mode"] == mode]
        ax.plot([r["loss"] * 100 for r in rs], [r["goodput_gbps"] for r in rs], "o-", label=mode)
    ax.set_xlabel("packet loss, each direction (%)")
    ax.set_ylabel("goodput (Gbit/s)")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("RDMA WRITE goodput under random loss")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _smooth(xs, k):
    out = []
    for i in range(len(xs)):
        w = xs[max(0, i - k + 1):i + 1]
        out.append(sum(w) / len(w))
    return out


def write_json(obj, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(obj, indent=1))
    return path
