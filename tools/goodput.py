#!/usr/bin/env python3
"""Goodput under random loss in the simulated fabric: go-back-N vs selective repeat.

One RC QP streams RDMA WRITEs over a rate-limited link whose bandwidth-delay
product is about 100 packets; both directions lose packets at random with the
same probability.  Goodput is payload bytes delivered per second of virtual
time, so the figures do not depend on how fast this machine runs Python.

    python tools/goodput.py                 # the table
    python tools/goodput.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from softnic.experiments.bottleneck import goodput_under_loss as measure  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-mib", type=int, default=32)
    ap.add_argument("--msg-kib", type=int, default=1024)
    ap.add_argument("--rate-gbps", type=float, default=10.0)
    ap.add_argument("--delay-us", type=float, default=150.0, help="one-way propagation delay")
    ap.add_argument("--window", type=int, default=128, help="packets in flight at most")
    ap.add_argument("--mtu", type=int, default=4096)
    ap.add_argument("--losses", default="0,0.001,0.01,0.05")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    rate = args.rate_gbps * 1e9
    delay = args.delay_us * 1e-6
    bdp = rate * 2 * delay / 8 / (args.mtu + 60)
    print(f"link {args.rate_gbps:g} Gbit/s, RTT {2 * args.delay_us:g} us, BDP ~{bdp:.0f} packets "
          f"of {args.mtu} B, window {args.window} packets, {args.total_mib} MiB as "
          f"{args.msg_kib} KiB WRITEs, loss both ways, seed {args.seed}\n")
    rows = []
    for sr in (False, True):
        for loss in (float(x) for x in args.losses.split(",")):
            rows.append(measure(loss, sr, total=args.total_mib << 20, msg=args.msg_kib << 10,
                                rate=rate, delay=delay, window=args.window, mtu=args.mtu,
                                seed=args.seed))
            print(f"  measured {rows[-1]['mode']} at {loss:.1%}", file=sys.stderr)
    base = {r["mode"]: r["goodput_gbps"] for r in rows if r["loss"] == 0}
    print("| recovery | loss | goodput Gbit/s | vs lossless | data pkts sent / needed | timeouts |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['loss']:.1%} | {r['goodput_gbps']:.3f} | "
              + (f"{r['goodput_gbps'] / base[r['mode']]:.3f} | " if r["mode"] in base
                 else "n/a (no 0 % run) | ")
              + f"{r['data_pkts_sent']} / {r['useful_pkts']} | {r['timeouts']} |"
              + ("" if r["ok"] else " INCOMPLETE"))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
