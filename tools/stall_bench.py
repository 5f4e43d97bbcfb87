#!/usr/bin/env python3
"""write_bw in the engine alone, under loss and path stalls, in virtual time.

Two engine devices in the virtual-time fabric; one RC QP keeps 16 WRITEs of
64 KiB in flight to one remote buffer (perftest's write_bw), MTU 4096,
timeout 11 (8.4 ms), selective repeat.  Both link directions run at 1 Gbit/s
with 20 us delay, lose 1 % of the datagrams (or none), and stall now and then:
datagrams sent during a stall arrive when it ends, in order, as when the
receiving process is descheduled on a loaded host (gaps between stalls
exponential, mean ``--gap``; lengths uniform 5-25 ms).  One JSON line per run:
virtual time, goodput, CPU time and the requester's counters.

    python tools/stall_bench.py --seeds 7,8
"""
import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from softnic.core.device import Device, DeviceConfig  # noqa: E402
from softnic.core.enums import SendFlags, WROpcode as W, WCStatus  # noqa: E402
from softnic.core.qp import SendWR  # noqa: E402
from softnic.driver.faults import FaultInjector, FaultModel  # noqa: E402
from softnic.experiments.rig import connect  # noqa: E402
from softnic.transport.sim import Fabric  # noqa: E402


class Stalls:
    """Stall periods [s, e): gaps exponential with mean ``gap``, lengths uniform in ``dur``."""
    def __init__(self, seed, gap, dur, horizon=1000.0):
        rng = random.Random(seed)
        self.periods = []
        t = 0.0
        while gap and t < horizon:
            t += rng.expovariate(1 / gap)
            d = rng.uniform(*dur)
            self.periods.append((t, t + d))
            t += d
        self.i = 0

    def release(self, t):
        ps = self.periods
        while self.i < len(ps) and ps[self.i][1] <= t:
            self.i += 1
        if self.i < len(ps) and ps[self.i][0] <= t:
            return ps[self.i][1]
        return t


class StallInjector:
    def __init__(self, inner, stalls):
        self.inner, self.stalls, self.last = inner, stalls, 0.0
        self.counters = inner.counters

    def apply(self, data, now):
        out = []
        for t, d in self.inner.apply(data, now):
            t = max(self.stalls.release(t), self.last)
            self.last = t
            out.append((t, d))
        return out


def run(loss, seed=7, n=2000, size=65536, depth=16, timeout=11, rate=1e9, delay=20e-6,
        gap=0.05, dur=(0.005, 0.025), sr=True):
    cfg = DeviceConfig(selective_repeat=sr, min_timer=1e-3)
    a = Device("a", "10.0.0.1", config=cfg)
    b = Device("b", "10.0.0.2", config=cfg)
    fabric = Fabric(seed, default_delay=delay)
    fabric.attach(a)
    fabric.attach(b)
    for src, dst, k in ((a, b, 1), (b, a, 2)):
        inj = FaultInjector(FaultModel(loss=loss, rate_bps=rate), random.Random(seed * 10 + k))
        fabric.set_injector(src.address, dst.address,
                            StallInjector(inj, Stalls(seed + 1000 * k, gap, dur)))
    ea, eb = connect(a, b, mtu=4096, timeout=timeout, retry_cnt=7,
                     endpoint_args=dict(buf_size=size, max_send_wr=depth + 1, cq_depth=depth + 16))
    posted = done = 0
    bad = 0
    def post():
        nonlocal posted
        a.post_send(ea.qp, SendWR(posted, W.RDMA_WRITE, [ea.sge(0, size)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
        posted += 1
    for _ in range(depth):
        post()
    def stop():
        nonlocal done, bad
        new = False
        for w in a.poll_cq(ea.send_cq, 64):
            done += 1
            bad += w.status != WCStatus.SUCCESS
            if posted < n:
                post()
                new = True
        if new:
            fabric.flush()
        return done == n or bad
    c0 = time.process_time()
    fabric.run(until=600.0, stop=stop)
    cpu = time.process_time() - c0
    c = a.counters
    return dict(loss=loss, ok=done == n and not bad, virtual_s=fabric.now,
                MBps=n * size / fabric.now / 1e6, cpu_s=cpu, sent=c["sent_pkts"],
                rexmit=c["retransmitted_pkts"], timeouts=c["timeouts"], probes=c["loss_probes"],
                rexmit_lost=c["rexmit_lost"], dup_req=b.counters["duplicate_request"],
                dropped=sum(fabric.link_counters(x.address, y.address)["dropped_loss"]
                            for x, y in ((a, b), (b, a))))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tag", default="", help="label copied into each line")
    ap.add_argument("--seeds", default="7", help="comma-separated seeds")
    ap.add_argument("--gap", type=float, default=0.05, help="mean seconds between stalls (0: none)")
    ap.add_argument("--n", type=int, default=2000, help="WRITEs per run")
    ap.add_argument("--gbn", action="store_true", help="go-back-N instead of selective repeat")
    args = ap.parse_args()
    for s in map(int, args.seeds.split(",")):
        for loss in (0.01, 0.0):
            r = run(loss, seed=s, n=args.n, gap=args.gap, sr=not args.gbn)
            r.update(tag=args.tag, seed=s, gap=args.gap)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                              for k, v in r.items()}), flush=True)
