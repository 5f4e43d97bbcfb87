#!/usr/bin/env python3
"""How many QPs per peer, and how big a chunk: softnic's collectives with each setting,
in the same processes, calls alternating between the settings (so that the machine's
load falls on all of them alike).

    python tools/coll_qps.py -n 2 --qps 1 2 4 --chunks 256K 1M --zcopy 64K 1M

For each size, every setting's median time per allreduce (the slowest rank's) and its
ratio to the first setting.  This is how SOFTNIC_COLL_QPS's and SOFTNIC_COLL_CHUNK's
defaults were chosen (docs/collectives.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
from coll_bench import human, size_arg, sizes  # noqa: E402


def worker(args) -> int:
    import numpy as np

    from softnic.collectives import Communicator
    from softnic.collectives.rendezvous import from_env
    rdv = from_env()
    settings = [(q, c, z) for z in args.zcopy for c in args.chunks for q in args.qps]
    comms = [Communicator(rdv.rank, rdv.world_size, rdv.store, prefix=f"s{i}", qps=q, chunk=c,
                          zcopy=z, timeout=rdv.timeout)
             for i, (q, c, z) in enumerate(settings)]
    head = comms[0]
    for size in sizes(args.minbytes, args.maxbytes, args.factor):
        base = np.ones(size // 4, np.float32)
        bufs = [base.copy() for _ in comms]
        times = [[] for _ in comms]
        for it in range(args.iters + 1):
            order = list(range(len(comms)))
            if it % 2:
                order.reverse()
            for i in order:
                head.barrier()
                t0 = time.perf_counter()
                comms[i].allreduce(bufs[i])
                if it:
                    times[i].append(time.perf_counter() - t0)
        meds = []
        for ts in times:
            t = np.array(ts)
            head.allreduce(t, "max")
            meds.append(statistics.median(t.tolist()))
        if rdv.rank == 0:
            cells = "  ".join(f"qps {q} chunk {human(c)} zcopy {human(z)}: {m * 1e3:8.2f} ms "
                              f"({m / meds[0]:.2f})" for (q, c, z), m in zip(settings, meds))
            print(f"{human(size):>8}  {cells}", flush=True)
    for c in comms:
        c.transport.close()
    rdv.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--nproc", type=int, default=2)
    ap.add_argument("--qps", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--chunks", type=size_arg, nargs="+", default=[256 << 10])
    ap.add_argument("--zcopy", type=size_arg, nargs="+", default=[64 << 10],
                    help="sends of at least this size leave from the caller's memory")
    ap.add_argument("-b", "--minbytes", type=size_arg, default=256 << 10)
    ap.add_argument("-e", "--maxbytes", type=size_arg, default=16 << 20)
    ap.add_argument("-f", "--factor", type=int, default=4)
    ap.add_argument("-i", "--iters", type=int, default=8)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from softnic.cli.launch import launch
    load = os.getloadavg()
    print(f"# allreduce, {args.nproc} ranks, median per call; {time.strftime('%Y-%m-%d %H:%M')} "
          f"UTC, Python {sys.version.split()[0]}, load {load[0]:.2f}")
    return launch([sys.executable, "-u", os.path.abspath(__file__), "--worker"] + sys.argv[1:],
                  args.nproc)


if __name__ == "__main__":
    sys.exit(main())
