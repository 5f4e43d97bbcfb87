"""``softnic experiment``: congestion and loss experiments in virtual time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _size(text: str) -> int:
    """``64KB``, ``2MiB``, ``4096`` -> bytes."""
    return int(_unit("size", text))


def _time(text: str) -> float:
    """``20ms``, ``55us``, ``0.01`` -> seconds."""
    return float(_unit("time", text))


def _unit(kind: str, text: str):
    from congestion.params import parse_value
    try:
        return parse_value(kind, text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="experiment", required=True)
    i = sub.add_parser("incast", help="N senders to one receiver through one switch",
                       description="N:1 incast through an output-queued switch with a finite "
                       "buffer, RED/ECN marking and INT; every sender runs --cc.  Writes "
                       "OUT/incast-CC.json and OUT/incast-CC.png and prints the figures.")
    i.add_argument("--cc", default="dcqcn",
                   help="controller spec: none, dcqcn, timely, swift, hpcc, with optional "
                   "parameters, e.g. 'dcqcn:g=0.0039' (several: comma-free list with '+', "
                   "e.g. dcqcn+hpcc+swift)")
    i.add_argument("--senders", type=int, default=16)
    i.add_argument("--rate-gbps", type=float, default=25.0, help="every link's rate")
    i.add_argument("--duration", type=_time, default=0.02, help="virtual time, e.g. 20ms")
    i.add_argument("--late-join", type=_time, default=None,
                   help="one more sender starts at this time, e.g. 10ms")
    i.add_argument("--msg", type=_size, default=256 << 10, help="bytes per WRITE")
    i.add_argument("--mtu", type=int, default=4096, choices=(256, 512, 1024, 2048, 4096))
    i.add_argument("--buffer", type=_size, default=2 << 20, help="switch buffer per port")
    i.add_argument("--kmin", type=_size, default=5_000)
    i.add_argument("--kmax", type=_size, default=200_000)
    i.add_argument("--pmax", type=float, default=0.01)
    i.add_argument("--delay", type=_time, default=1e-6, help="propagation per link")
    i.add_argument("--window", type=int, default=128, help="transport window (packets)")
    i.add_argument("--selective-repeat", action="store_true")
    i.add_argument("--seed", type=int, default=1)
    i.add_argument("--out", default="results", help="directory for JSON and PNG")
    i.add_argument("--no-progress", action="store_true")
    lo = sub.add_parser("loss", help="go-back-N against selective repeat under random loss",
                        description="One RC flow of RDMA WRITEs over a lossy link, each "
                        "recovery mode at each loss rate.  Writes OUT/loss.json and "
                        "OUT/loss.png and prints a table.")
    lo.add_argument("--losses", default="0,0.001,0.005,0.01,0.02,0.05",
                    help="comma-separated loss probabilities (each direction)")
    lo.add_argument("--rate-gbps", type=float, default=10.0)
    lo.add_argument("--delay", type=_time, default=150e-6, help="one-way propagation delay")
    lo.add_argument("--total", type=_size, default=8 << 20, help="bytes per run")
    lo.add_argument("--msg", type=_size, default=1 << 20)
    lo.add_argument("--window", type=int, default=128)
    lo.add_argument("--mtu", type=int, default=4096, choices=(256, 512, 1024, 2048, 4096))
    lo.add_argument("--seed", type=int, default=1)
    lo.add_argument("--out", default="results")
    lo.add_argument("--no-progress", action="store_true")


def main(args) -> int:
    from . import experiments as ex
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    if args.experiment == "loss":
        losses = [float(x) for x in args.losses.split(",")]
        rows = ex.loss_sweep(losses, progress=progress, total=args.total, msg=args.msg,
                             rate=args.rate_gbps * 1e9, delay=args.delay, window=args.window,
                             mtu=args.mtu, seed=args.seed)
        print(f"one RC flow, {args.rate_gbps:g} Gbit/s, RTT {2 * args.delay * 1e6:g} us, "
              f"window {args.window} packets, MTU {args.mtu}, {args.total >> 20} MiB per run\n")
        print("| recovery | loss | goodput Gbit/s | vs lossless | retransmitted | timeouts |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            vs = f"{r['vs_lossless']:.3f}" if r["vs_lossless"] is not None else "n/a"
            print(f"| {r['mode']} | {r['loss']:.1%} | {r['goodput_gbps']:.3f} | {vs} | "
                  f"{r['retransmitted_pkts']} | {r['timeouts']} |"
                  + ("" if r["ok"] else " INCOMPLETE"))
        j = ex.write_json(rows, out / "loss.json")
        p = ex.plot_loss(rows, out / "loss.png")
        print(f"\nwrote {j} and {p}")
        return 0 if all(r["ok"] for r in rows) else 1
    rc = 0
    for spec in args.cc.split("+"):
        cfg = ex.IncastConfig(cc=spec, senders=args.senders, rate_gbps=args.rate_gbps,
                              duration=args.duration, late_join=args.late_join, mtu=args.mtu,
                              msg=args.msg, buffer=args.buffer, kmin=args.kmin,
                              kmax=args.kmax, pmax=args.pmax, delay=args.delay,
                              window=args.window, selective_repeat=args.selective_repeat,
                              seed=args.seed)
        try:
            res = ex.incast(cfg, progress=progress)
        except ValueError as e:
            print(f"softnic experiment incast: {e}", file=sys.stderr)
            return 2
        s = res["summary"]
        stem = "incast-" + spec.split(":")[0]
        j = ex.write_json(res, out / f"{stem}.json")
        p = ex.plot_incast(res, out / f"{stem}.png")
        late = s["late_flow_converged_after_s"]
        print(f"incast {s['senders']}:1  cc={spec}  {args.rate_gbps:g} Gbit/s  "
              f"{args.duration * 1e3:g} ms virtual ({s['wall_s']:.1f} s wall)")
        print(f"  Jain's fairness (steady state, t > {s['steady_from_s'] * 1e3:g} ms): "
              f"{s['jain_steady']:.3f}")
        print(f"  bottleneck queue: p50 {s['queue_p50_kb']:.1f} KB  p99 {s['queue_p99_kb']:.1f} KB"
              f"  max {s['queue_max_kb']:.1f} KB  (steady p50 {s['queue_steady_p50_kb']:.1f}, "
              f"p99 {s['queue_steady_p99_kb']:.1f})")
        print(f"  goodput {s['goodput_gbps']:.2f} Gbit/s ({s['goodput_fraction']:.1%} of the "
              f"bottleneck; steady state {s['steady_total_goodput_gbps']:.2f})  drops {s['switch_drops']}  retransmitted {s['retransmitted_pkts']}"
              f"  timeouts {s['timeouts']}  ECN marks {s['ecn_marked']}  CNPs {s['cnps_sent']}")
        if args.late_join is not None:
            print("  late flow reached its fair share after "
                  + (f"{late * 1e3:.2f} ms" if late is not None else "— never, in this run"))
        print(f"  wrote {j} and {p}")
        if s["wc_errors"]:
            rc = 1
    return rc
