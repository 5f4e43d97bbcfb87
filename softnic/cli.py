"""The ``softnic`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="softnic", description="A software RDMA NIC.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="two NICs in the simulated fabric over a lossy link")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--faults", default=None,
                   help="fault model, e.g. 'loss=0.02,dup=0.01' (default: the demo's)")
    d.add_argument("--mtu", type=int, default=1024, choices=(256, 512, 1024, 2048, 4096))
    d.add_argument("--selective-repeat", action="store_true",
                   help="recover from loss with selective repeat instead of go-back-N")
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        from . import demo
        ok = demo.run(seed=args.seed, faults=args.faults or demo.DEFAULT_FAULTS, mtu=args.mtu,
                      selective_repeat=args.selective_repeat)
        return 0 if ok else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
