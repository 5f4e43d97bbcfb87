#!/usr/bin/env python3
"""softnic's torch.distributed backend against gloo, in the same processes.

    python tools/coll_bench.py -n 2                     # 1 KiB .. 64 MiB, the four collectives
    python tools/coll_bench.py -n 4 -e 4M -c all_reduce

Starts ``-n`` ranks on this machine (``softnic launch``); every rank opens the
"softnic" process group and a gloo group over the same ranks.  For each
collective and size, both backends run on the same tensors, alternating in
rounds (softnic, gloo, softnic, gloo, ...), each call started together on every
rank (a barrier on the other backend first) and timed alone.  The time of a call
is the slowest rank's; the table gives the median over the calls, and the ratio
softnic / gloo (below 1: softnic is faster).  Results are checked.  ``--json``
also keeps, per backend, the median spread of the ranks' starts (``start_skew``)
and the median time from the last rank's start to the last rank's end
(``from_last_start``): what a call costs once every rank is in it.

Sizes are the whole buffer: all_reduce's and broadcast's tensor, all_gather's
output (each rank gives size / n), reduce_scatter's input (each rank gets
size / n); float32.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_arg(text: str) -> int:
    t = text.strip().upper().removesuffix("B")
    return int(t[:-1]) * UNITS[t[-1]] if t[-1:] in UNITS else int(t)


def human(n: int) -> str:
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def fmt_t(s: float) -> str:
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def iters_for(nbytes: int, budget: float, lo: int, hi: int) -> int:
    # a rough guess of a call's time at 200 MB/s plus 300 us, to keep each size short
    guess = 3e-4 + nbytes / 2e8
    return max(lo, min(hi, int(budget / guess)))


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    import softnic.collectives.torch_backend  # noqa: F401  registers "softnic"
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("softnic")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {"softnic": dist.group.WORLD, "gloo": gloo}
    rows = []
    for coll in args.collectives:
        for size in sizes(args.minbytes, args.maxbytes, args.factor):
            count = size // 4
            if coll in ("all_gather", "reduce_scatter"):
                count -= count % n
            part = count // n
            base = torch.arange(count, dtype=torch.float32) % 7 + rank
            want = None
            if coll == "all_reduce":
                want = torch.arange(count, dtype=torch.float32) % 7 * n + n * (n - 1) / 2
            times = {"softnic": [], "gloo": []}
            stamps = {"softnic": [], "gloo": []}     # (start, end) per timed call
            iters = max(args.min_iters,
                        iters_for(size, args.budget, args.min_iters, args.iters) // args.loop)
            bufs = {}
            for name in groups:
                if coll == "all_reduce":
                    bufs[name] = base.clone()
                elif coll == "broadcast":
                    bufs[name] = base.clone()
                elif coll == "all_gather":
                    bufs[name] = (base[rank * part:(rank + 1) * part].clone(),
                                  torch.empty(part * n))
                else:
                    bufs[name] = (base.clone(), torch.empty(part))

            def call(name):
                g = groups[name]
                b = bufs[name]
                if coll == "all_reduce":
                    dist.all_reduce(b, group=g)
                elif coll == "broadcast":
                    dist.broadcast(b, src=0, group=g)
                elif coll == "all_gather":
                    dist.all_gather_into_tensor(b[1], b[0], group=g)
                else:
                    dist.reduce_scatter_tensor(b[1], b[0], group=g)

            loop = args.loop
            for it in range(iters + args.warmup):
                for name in (("softnic", "gloo") if it % 2 == 0 else ("gloo", "softnic")):
                    if coll == "all_reduce":
                        bufs[name].copy_(base)
                    other = "gloo" if name == "softnic" else "softnic"
                    dist.barrier(group=groups[other])
                    t0 = time.perf_counter()
                    for _ in range(loop):
                        call(name)
                    t1 = time.perf_counter()
                    if it >= args.warmup:
                        times[name].append((t1 - t0) / loop)
                        stamps[name].append((t0, t1))
            # check the results of one more call of each
            for name in groups:
                if coll == "all_reduce":
                    bufs[name].copy_(base)
                call(name)
            for name in groups:
                b = bufs[name]
                if coll == "all_reduce":
                    ok = torch.equal(b, want)
                elif coll == "broadcast":
                    ok = torch.equal(b, torch.arange(count, dtype=torch.float32) % 7)
                elif coll == "all_gather":
                    ok = torch.equal(b[1], torch.cat([
                        (torch.arange(count, dtype=torch.float32) % 7 + k)[k * part:(k + 1) * part]
                        for k in range(n)]))
                else:
                    full = torch.arange(count, dtype=torch.float32) % 7 * n + n * (n - 1) / 2
                    # reduce_scatter ran on a buffer all_reduce never touched: check it
                    ok = torch.equal(b[1], full[rank * part:(rank + 1) * part])
                if not ok:
                    raise SystemExit(f"rank {rank}: {name} {coll} {size} B gave a wrong result")
            # the slowest rank's time for each call; and, from every rank's start and
            # end (one clock: the ranks share this machine), how far apart the ranks
            # started and the time from the last start to the last end
            med, skew, late = {}, {}, {}
            for name in groups:
                t = torch.tensor(times[name], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
                med[name] = statistics.median(t.tolist())
                st = torch.tensor(stamps[name], dtype=torch.float64)
                every = [torch.zeros_like(st) for _ in range(n)]
                dist.all_gather(every, st, group=gloo)
                a = torch.stack(every)                      # rank, call, (start, end)
                starts = a[:, :, 0]
                skew[name] = statistics.median(
                    (starts.max(0).values - starts.min(0).values).tolist())
                late[name] = statistics.median(
                    (a[:, :, 1].max(0).values - starts.max(0).values).tolist()) / args.loop
            rows.append({"collective": coll, "bytes": size, "iters": iters,
                         "softnic": med["softnic"], "gloo": med["gloo"],
                         "ratio": med["softnic"] / med["gloo"],
                         "start_skew": skew, "from_last_start": late})
            if rank == 0:
                r = rows[-1]
                print(f"| {coll} | {human(size)} | {fmt_t(r['softnic'])} | {fmt_t(r['gloo'])} "
                      f"| {r['ratio']:.2f} |", flush=True)
    if rank == 0 and rows:
        ahead = [r for r in rows if r["ratio"] < 1]
        print(f"# softnic faster in {len(ahead)} of {len(rows)} cells; ratio median "
              f"{statistics.median(r['ratio'] for r in rows):.2f}, worst "
              f"{max(r['ratio'] for r in rows):.2f}", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"world": n, "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--nproc", type=int, default=2)
    ap.add_argument("-b", "--minbytes", type=size_arg, default=1 << 10)
    ap.add_argument("-e", "--maxbytes", type=size_arg, default=64 << 20)
    ap.add_argument("-f", "--factor", type=int, default=4)
    ap.add_argument("-c", "--collectives", nargs="+", choices=COLLS, default=list(COLLS))
    ap.add_argument("-i", "--iters", type=int, default=40, help="most timed calls per size")
    ap.add_argument("--min-iters", type=int, default=5, help="fewest timed calls per size")
    ap.add_argument("--budget", type=float, default=1.0,
                    help="seconds per size and backend, roughly (sets the calls per size)")
    ap.add_argument("-w", "--warmup", type=int, default=2)
    ap.add_argument("-l", "--loop", type=int, default=1,
                    help="calls per timed sample, back to back after the barrier (as "
                         "nccl-tests times its iterations); 1: each call alone")
    ap.add_argument("--json", help="rank 0 writes the rows here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(ROOT))
    from softnic.cli.launch import launch
    load = os.getloadavg()
    print(f"# softnic vs gloo, {args.nproc} ranks on {os.cpu_count()} CPUs, float32, "
          f"median per call (slowest rank)")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{platform.python_implementation()} {platform.python_version()} "
          f"({sys.executable}), load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"SOFTNIC_COLL_QPS={os.environ.get('SOFTNIC_COLL_QPS', 'default')}")
    print(f"# command: {' '.join([os.path.relpath(sys.executable)] + sys.argv)}")
    cpus = os.cpu_count() or 1
    if args.nproc > cpus:
        print(f"# NOTE: {args.nproc} ranks on {cpus} CPUs oversubscribe them "
              f"({args.nproc / cpus:g} ranks per CPU, each with its application thread, its "
              f"device's progress thread and gloo's threads): every wait for a peer is also "
              f"a wait for a CPU, for both backends")
    if args.loop > 1:
        print(f"# per size: {args.min_iters} to {args.iters} timed samples per backend, each "
              f"{args.loop} calls back to back after a barrier (the time per call: the sample "
              f"/ {args.loop}); about {args.budget:g} s each, after {args.warmup} untimed; "
              f"softnic / gloo below 1: softnic is faster")
    else:
        print(f"# per size: {args.min_iters} to {args.iters} timed calls per backend (fewer "
              f"for big sizes, about {args.budget:g} s each), after {args.warmup} untimed; "
              f"softnic / gloo below 1: softnic is faster")
    print("| collective | bytes | softnic | gloo | softnic / gloo |")
    print("|---|---:|---:|---:|---:|")
    sys.stdout.flush()
    argv = [a for a in sys.argv[1:]]
    rc = launch([sys.executable, "-u", os.path.abspath(__file__), "--worker"] + argv,
                args.nproc)
    load = os.getloadavg()
    print(f"# load after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
