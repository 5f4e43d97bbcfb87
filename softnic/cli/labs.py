"""Lab scenarios: small, deterministic RC runs in the simulated fabric for students.

Each lab builds two NICs joined by a simulated link, does one thing worth
seeing, and returns what happened: the packet trace (for a ladder diagram),
the work completions, and the NICs' counters.  ``softnic lab N`` prints them;
``docs/labs/`` says what to look for and why.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..core.device import Device, DeviceConfig
from ..core.enums import SendFlags, WCStatus, WROpcode as W
from ..core.qp import RecvWR, SendWR
from ..driver.faults import FaultModel
from ..experiments.rig import connect
from ..transport.sim import Fabric


@dataclass
class LabRun:
    title: str
    fabric: Fabric
    devices: tuple
    completions: list = field(default_factory=list)    # (device name, WC)
    notes: list = field(default_factory=list)          # lines worth printing
    ladder: bool = True                                # print the packet ladder


def _setup(seed: int = 1, faults: FaultModel = FaultModel(), *, mtu: int = 1024,
           selective_repeat: bool = False, psn: int = 0, **bring_up):
    cfg = DeviceConfig(selective_repeat=selective_repeat, min_timer=100e-6)
    a, b = Device("softnic0", "10.0.0.1", config=cfg), Device("softnic1", "10.0.0.2", config=cfg)
    fabric = Fabric(seed, default_faults=faults, default_delay=5e-6, default_rate_bps=10e9,
                    trace=True)
    fabric.attach(a)
    fabric.attach(b)
    ea, eb = connect(a, b, mtu=mtu, psn_a=psn, psn_b=psn, timeout=bring_up.pop("timeout", 7),
                     endpoint_args=dict(buf_size=1 << 16), **bring_up)
    return fabric, a, b, ea, eb


def _collect(run: LabRun, ea, eb, want: int, until: float = 1.0) -> None:
    a, b = ea.dev, eb.dev

    def done():
        for dev, ep in ((a, ea), (b, eb)):
            for cq in (ep.send_cq, ep.recv_cq):
                run.completions += [(dev.name, wc) for wc in dev.poll_cq(cq, 16)]
        return len(run.completions) >= want

    run.fabric.run(until=until, stop=done, max_events=200_000)


def segmentation(seed: int = 1) -> LabRun:
    """Lab 1: a 5000-byte WRITE at path MTU 1024 starting 2 PSNs before the 24-bit wrap."""
    fabric, a, b, ea, eb = _setup(seed, psn=0xFFFFFE)
    run = LabRun("segmentation and the PSN sequence", fabric, (a, b))
    ea.buf.view[:5000] = bytes(range(250)) * 20
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 5000)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr + 8192, rkey=eb.mr.rkey))
    _collect(run, ea, eb, 1)
    run.notes.append(f"5000 bytes at MTU 1024 -> {-(-5000 // 1024)} packets; first PSN 0xfffffe")
    run.notes.append("bytes landed: " + str(bytes(eb.buf.view[8192:13192]) ==
                                            bytes(ea.buf.view[:5000])))
    return run


def _one_loss(selective_repeat: bool, seed: int) -> LabRun:
    from ..testing.droplist import DropList
    fabric, a, b, ea, eb = _setup(seed, selective_repeat=selective_repeat)
    mode = "selective repeat" if selective_repeat else "go-back-N"
    run = LabRun(f"one lost packet, {mode}", fabric, (a, b))
    DropList({3}).install(fabric, a.address, b.address)       # the 4th datagram a sends
    ea.buf.view[:16384] = bytes(range(256)) * 64
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 16384)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr + 16384, rkey=eb.mr.rkey))
    _collect(run, ea, eb, 1)
    run.notes.append(f"data packets sent: {a.counters['sent_pkts']} for 16 needed "
                     f"({a.counters['retransmitted_pkts']} resent)")
    run.notes.append("bytes landed: " + str(bytes(eb.buf.view[16384:32768]) ==
                                            bytes(ea.buf.view[:16384])))
    return run


def loss_recovery(seed: int = 1) -> list[LabRun]:
    """Lab 2: a 16 KiB WRITE loses its 4th packet, under go-back-N then selective repeat."""
    return [_one_loss(False, seed), _one_loss(True, seed)]


def rnr(seed: int = 1) -> LabRun:
    """Lab 3: a SEND arrives before the receiver posted a receive buffer."""
    fabric, a, b, ea, eb = _setup(seed, min_rnr_timer=14, rnr_retry=7)   # 1.28 ms RNR timer
    run = LabRun("receiver not ready: the RNR NAK", fabric, (a, b))
    a.post_send(ea.qp, SendWR(1, W.SEND, [ea.sge(0, 100)], SendFlags.SIGNALED))
    fabric.run(until=3e-3, max_events=10_000)         # two RNR rounds with no receive posted
    b.post_recv(eb.qp, RecvWR(9, [eb.sge(4096, 4096)]))
    run.notes.append(f"receive posted at t = {fabric.now * 1e3:.3f} ms")
    _collect(run, ea, eb, 2, until=0.1)
    run.notes.append(f"rcvd_rnr_err at the requester: {a.counters['rcvd_rnr_err']}, "
                     f"send_rnr_err at the responder: {b.counters['send_rnr_err']}")
    return run


def protection(seed: int = 1) -> LabRun:
    """Lab 4: an RDMA WRITE with a wrong rkey, then a WRITE behind it."""
    fabric, a, b, ea, eb = _setup(seed)
    run = LabRun("a protection error and its work completion", fabric, (a, b))
    before = bytes(eb.buf.view)
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 64)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey ^ 0x5A))
    a.post_send(ea.qp, SendWR(2, W.RDMA_WRITE, [ea.sge(0, 64)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    _collect(run, ea, eb, 2)
    run.notes.append(f"target memory untouched: {bytes(eb.buf.view) == before}")
    run.notes.append(f"QP states: requester {ea.qp.state.name}, responder {eb.qp.state.name}")
    return run


def atomic_once(seed: int = 1) -> LabRun:
    """Lab 5: FETCH_AND_ADD over a link that duplicates every packet and loses some."""
    faults = FaultModel(duplicate=1.0, loss=0.2, jitter=20e-6)
    fabric, a, b, ea, eb = _setup(seed, faults)
    run = LabRun("an atomic under duplication runs once", fabric, (a, b))
    eb.buf.view[64:72] = (1000).to_bytes(8, sys.byteorder)
    for i in range(3):
        a.post_send(ea.qp, SendWR(i + 1, W.ATOMIC_FETCH_AND_ADD, [ea.sge(8 * i, 8)],
                                  SendFlags.SIGNALED, remote_addr=eb.buf.addr + 64,
                                  rkey=eb.mr.rkey, compare_add=1))
    _collect(run, ea, eb, 3)
    final = int.from_bytes(eb.buf.view[64:72], sys.byteorder)
    olds = [int.from_bytes(ea.buf.view[8 * i:8 * i + 8], sys.byteorder) for i in range(3)]
    run.notes.append(f"value: 1000 -> {final} after 3 fetch-adds of 1; returned {olds}")
    run.notes.append(f"duplicate requests seen by the responder: "
                     f"{b.counters['duplicate_request']}, answered from the stored original "
                     f"value: {b.counters['atomic_replayed']}")
    return run


def _ecn_run(cc: str, seed: int, *, until: float = 10e-3):
    """Two senders WRITE 1 MiB each to one receiver through a switch (10 Gbit/s
    links, 512 KB buffer, ECN marking from 5 KB); return the run and its timeline."""
    from ..transport.sim import RED
    rate = 10e9
    cfg = DeviceConfig(cc=cc, line_rate_bps=rate, base_rtt=12e-6, min_timer=200e-6)
    fabric = Fabric(seed)
    sw = fabric.add_switch("sw", buffer_bytes=512_000, red=RED(5_000, 200_000, 0.01))
    devs = [Device(f"softnic{i}", f"10.0.0.{i + 1}", config=cfg) for i in range(3)]
    for d in devs:
        fabric.attach(d)
        fabric.connect(d.address, sw, rate_bps=rate, delay=2e-6)
    recv = devs[2]
    eps = [connect(d, recv, mtu=1024, timeout=8, endpoint_args=dict(buf_size=1 << 20))
           for d in devs[:2]]
    run = LabRun(f"two senders, one receiver, cc={cc}", fabric, tuple(devs), ladder=False)
    for d, (ea, eb) in zip(devs, eps):
        d.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 1 << 20)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    port = sw.port(recv.address)
    qp0 = eps[0][0].qp
    timeline = []          # (time, queue bytes, marks, CNPs, sender 0's rate, alpha, stage)
    last = None
    t, step = 0.0, 5e-6
    done = [False, False]
    while t < until and not all(done):
        t += step
        fabric.run(until=t)
        for i, (d, (ea, eb)) in enumerate(zip(devs, eps)):
            for wc in d.poll_cq(ea.send_cq, 4):
                run.completions.append((d.name, wc))
                run.notes.append(f"{d.name}'s WRITE completed at {t * 1e6:.0f} us")
                done[i] = True
        cc0 = qp0.cc
        row = (t, port.qlen(t), port.counters["marked"], recv.counters["np_cnp_sent"],
               cc0.rate if cc0 is not None else None,
               getattr(cc0, "alpha", None), cc0.stage() if hasattr(cc0, "stage") else None)
        if last is None or row[2:] != last[2:]:
            timeline.append(row)
        last = row
    return run, timeline, port


def ecn_reaction(seed: int = 1) -> list[LabRun]:
    """Lab 6: DCQCN reacting to ECN marks: marks -> CNPs -> rate cuts -> recovery."""
    run, timeline, port = _ecn_run("dcqcn", seed)
    run.notes.append("time      queue    ECN marks  CNPs   softnic0 rate   alpha   stage")
    shown = timeline if len(timeline) <= 40 else timeline[:28] + [None] + timeline[-10:]
    for row in shown:
        if row is None:
            run.notes.append(f"   ... {len(timeline) - 38} more rows ...")
            continue
        t, q, marks, cnps, rate, alpha, stage = row
        run.notes.append(f"{t * 1e6:6.0f} us {q / 1e3:6.1f} KB {marks:6d} {cnps:8d}   "
                         f"{rate / 1e9:6.3f} Gbit/s  {alpha:6.4f}  {stage}")
    run.notes.append(_queue_note(port))
    base, _, bport = _ecn_run("none", seed)
    base.notes.append("the same transfers with no controller: " + _queue_note(bport))
    base.notes.append(f"ECN marks: {bport.counters['marked']} (no controller: the packets "
                      f"are not ECN-capable, so the switch never marks them)")
    return [run, base]


def _queue_note(port) -> str:
    from ..experiments.bottleneck import percentile
    qs = [q for _, q in port.samples]
    return (f"bottleneck queue: median {percentile(qs, 50) / 1e3:.1f} KB, at most "
            f"{port.counters['max_qlen'] / 1e3:.1f} KB; {port.counters['dropped']} dropped")


LABS = {1: segmentation, 2: loss_recovery, 3: rnr, 4: protection, 5: atomic_once,
        6: ecn_reaction}


def run_lab(n: int, seed: int = 1) -> list[LabRun]:
    if n not in LABS:
        raise ValueError(f"no lab {n} (labs: {sorted(LABS)})")
    r = LABS[n](seed)
    return r if isinstance(r, list) else [r]


def describe(run: LabRun) -> str:
    lines = [f"== {run.title} =="]
    for name, wc in run.completions:
        lines.append(f"  {name} completion: wr_id {wc.wr_id} {wc.opcode.name} "
                     f"{wc.status.name}" + (f" byte_len {wc.byte_len}"
                                            if wc.status == WCStatus.SUCCESS else ""))
    lines += ["  " + n for n in run.notes]
    for d in run.devices:
        c = {k: v for k, v in d.counters.items() if v}
        lines.append(f"  {d.name} counters: " + ", ".join(f"{k}={v}" for k, v in c.items()))
    return "\n".join(lines)
