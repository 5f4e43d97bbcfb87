#!/usr/bin/env python3
"""How many QPs per peer, and how big a chunk: softnic's collectives with each setting,
in the same processes, calls alternating between the settings (so that the machine's
load falls on all of them alike).

    python tools/coll_qps.py -n 2 --qps 1 2 4 --chunks 256K 1M --zcopy 64K 1M
    python tools/coll_qps.py -n 2 --qps 4 --chunks 1M --zcopy 1M --min-chunks 1M 64K \
        -c broadcast allgather allreduce -b 64K -e 4M

For each collective and size, every setting's median time per call (the slowest rank's)
and its ratio to the first setting; each call follows a barrier, as in
tools/coll_bench.py.  This is how SOFTNIC_COLL_QPS's, SOFTNIC_COLL_CHUNK's and
SOFTNIC_COLL_MIN_CHUNK's defaults were chosen (docs/collectives.md).
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
    settings = [(q, c, z, m) for m in args.min_chunks for z in args.zcopy for c in args.chunks
                for q in args.qps]
    comms = [Communicator(rdv.rank, rdv.world_size, rdv.store, prefix=f"s{i}", qps=q, chunk=c,
                          zcopy=z, min_chunk=m, timeout=rdv.timeout)
             for i, (q, c, z, m) in enumerate(settings)]
    head = comms[0]
    n = rdv.world_size

    def call(comm, what, buf, out):
        if what == "allreduce":
            comm.allreduce(buf)
        elif what == "broadcast":
            comm.broadcast(buf, 0)
        else:                                   # allgather: each rank's share of the size
            comm.allgather(buf[:buf.size // n], out[:buf.size // n * n])

    for what in args.collective:
        for size in sizes(args.minbytes, args.maxbytes, args.factor):
            base = np.ones(size // 4, np.float32)
            bufs = [base.copy() for _ in comms]
            outs = [np.empty(size // 4, np.float32) for _ in comms]
            times = [[] for _ in comms]
            for it in range(args.iters + 1):
                order = list(range(len(comms)))
                if it % 2:
                    order.reverse()
                for i in order:
                    head.barrier()
                    t0 = time.perf_counter()
                    call(comms[i], what, bufs[i], outs[i])
                    if it:
                        times[i].append(time.perf_counter() - t0)
            meds = []
            for ts in times:
                t = np.array(ts)
                head.allreduce(t, "max")
                meds.append(statistics.median(t.tolist()))
            if rdv.rank == 0:
                cells = "  ".join(
                    f"qps {q} chunk {human(c)} zcopy {human(z)} min {human(m)}: "
                    f"{t * 1e3:8.2f} ms ({t / meds[0]:.2f})"
                    for (q, c, z, m), t in zip(settings, meds))
                print(f"{what:>9} {human(size):>8}  {cells}", flush=True)
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
    ap.add_argument("--min-chunks", type=size_arg, nargs="+", default=[1 << 20],
                    help="the smallest chunk a message below a slot is cut into")
    ap.add_argument("-c", "--collective", nargs="+", default=["allreduce"],
                    choices=("allreduce", "allgather", "broadcast"))
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
    print(f"# {', '.join(args.collective)}, {args.nproc} ranks, median per call; {time.strftime('%Y-%m-%d %H:%M')} "
          f"UTC, Python {sys.version.split()[0]}, load {load[0]:.2f}")
    return launch([sys.executable, "-u", os.path.abspath(__file__), "--worker"] + sys.argv[1:],
                  args.nproc)


if __name__ == "__main__":
    sys.exit(main())
