#!/usr/bin/env python3
"""What HPCC's controllers see and do over the steady half of an incast.

Runs ``softnic experiment incast`` in virtual time with every sender's HPCC
controller wrapped (a subclass put in the registry under the same name), and
records, for each ACK that computes a window (Algorithm 1's MeasureInflight
and ComputeWind), its most loaded hop's sample against the previous ACK's
record of that hop:

    tau      the hop's ts difference (the sample's span)
    tx       txRate / B, the link's use over tau
    q        min(qlen, prev qlen) / (B T), the queue term
    U        the EWMA after the sample
    step     cut (U >= eta), mi (incStage reached max_stage) or ai
    W        the window the ACK leaves

and prints, over the second half of the run: how often each step came, U's
and its terms' means and spreads, the window's mean, sd and harmonic mean
(a paced flow's throughput follows the harmonic mean: packets leave
(packet bytes) / R apart) and each flow's mean window.  The run is the
experiment's own (same seed, same figures); only the controller is watched.

    .venv/bin/python tools/hpcc_samples.py [--cc hpcc] [--senders 16] \\
        [--rate-gbps 25] [--mtu 4096] [--duration 20ms] [--delay 1us]
"""

from __future__ import annotations

import argparse
import statistics as st
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import congestion                                              # noqa: E402
from congestion.params import parse_value                      # noqa: E402
from softnic.experiments import bottleneck as ex               # noqa: E402


def _watched(records: list):
    class Watched(congestion.HPCC):
        def on_ack(self, *, now, acked_bytes, rtt, telemetry):
            prev = self.hops
            before = self.state()
            super().on_ack(now=now, acked_bytes=acked_bytes, rtt=rtt, telemetry=telemetry)
            after = self.state()
            if not telemetry or prev is None or len(prev) != len(telemetry):
                return
            best = None
            for old, new in zip(prev, telemetry):
                dt = new.ts - old.ts
                if dt <= 0 or new.rate_bps <= 0:
                    continue
                b = new.rate_bps / 8
                tx = (new.tx_bytes - old.tx_bytes) / dt / b
                q = min(new.qlen, old.qlen) / (b * self.t)
                if best is None or tx + q > best[1] + best[2]:
                    best = (dt, tx, q)
            if best is None:
                return
            # ComputeWind's branch: U (after this sample) at eta, or incStage at max_stage
            if after["u"] >= self.params["eta"]:
                step = "cut"
            elif before["inc_stage"] >= self.params["max_stage"]:
                step = "mi"
            else:
                step = "ai"
            records.append((now, id(self), step, after["u"], after["window"]) + best)
    return Watched


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cc", default="hpcc",
                    help="an hpcc spec, e.g. hpcc:expected_flows=100 (an N other than "
                         "the incast's flows)")
    ap.add_argument("--senders", type=int, default=16)
    ap.add_argument("--rate-gbps", type=float, default=25.0)
    ap.add_argument("--mtu", type=int, default=4096)
    ap.add_argument("--duration", default="20ms")
    ap.add_argument("--delay", default="1us", help="propagation per link")
    args = ap.parse_args(argv)
    name, _ = congestion.parse_spec(args.cc)
    if name != "hpcc":
        ap.error(f"--cc must be an hpcc spec, not {args.cc!r}")
    records: list = []
    congestion.CONTROLLERS["hpcc"] = _watched(records)
    duration = parse_value("time", args.duration)
    res = ex.incast(ex.IncastConfig(cc=args.cc, senders=args.senders, rate_gbps=args.rate_gbps,
                                    mtu=args.mtu, duration=duration,
                                    delay=parse_value("time", args.delay)))
    s = res["summary"]
    half = [r for r in records if r[0] > duration / 2]
    if not half:
        print("no window updates in the second half of the run")
        return 1
    n = len(half)
    print(f"incast {args.senders}:1 cc={args.cc} {args.rate_gbps:g} Gbit/s MTU {args.mtu} "
          f"{args.duration}: Jain {s['jain_steady']:.3f}, goodput {s['goodput_fraction']:.3f} "
          f"of the bottleneck")
    print(f"second half: {n} window updates, one per flow every "
          f"{st.mean(r[5] for r in half) * 1e6:.1f} us (tau)")
    for step in ("cut", "mi", "ai"):
        print(f"  {step:4s} {sum(r[2] == step for r in half) / n:6.1%}")
    u = [r[3] for r in half]
    tx = [r[6] for r in half]
    q = [r[7] for r in half]
    w = [r[4] for r in half]
    print(f"U {st.mean(u):.3f} (sd {st.pstdev(u):.3f}); tx term {st.mean(tx):.3f} "
          f"(sd {st.pstdev(tx):.3f}); queue term {st.mean(q):.3f}, above zero in "
          f"{sum(x > 0 for x in q) / n:.1%}")
    print(f"window: mean {st.mean(w):.0f} B, sd {st.pstdev(w):.0f}, harmonic mean "
          f"{st.harmonic_mean(w):.0f}, smallest {min(w):.0f}")
    flows: dict = {}
    for r in half:
        flows.setdefault(r[1], []).append(r[4])
    means = sorted(st.mean(v) for v in flows.values())
    print("each flow's mean window (B):", " ".join(f"{m:.0f}" for m in means))
    return 0


if __name__ == "__main__":
    sys.exit(main())
