"""``softnic perf allreduce``: the collectives' benchmark (``softnic.perf`` registers
every test in ``TESTS`` here next to perftest's).

``softnic perf allreduce -n 4 -b 8 -e 1M -f 4`` runs 4 ranks on this machine
(as ``softnic launch`` does) and prints, like nccl-tests' all_reduce_perf, one
row per size: bytes, element count, type, reduction, time per call (the slowest
rank's mean), algorithm bandwidth (size / time) and bus bandwidth (algbw *
2(n-1)/n, the traffic each link carries in a ring), and how many elements came
out wrong against numpy.  Bandwidths are in MB/s (nccl-tests prints GB/s; a
NIC in Python moves megabytes).
"""

from __future__ import annotations

import argparse
import sys
import time

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_arg(text: str) -> int:
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
    try:
        n = int(t[:-1] if unit else t) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 8, 64K, 4M)") from None
    if n < 0:
        raise argparse.ArgumentTypeError("sizes are not negative")
    return n


def _allreduce_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-n", "--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("-b", "--minbytes", type=size_arg, default=8, help="smallest size (8)")
    ap.add_argument("-e", "--maxbytes", type=size_arg, default=1 << 20, help="largest size (1M)")
    ap.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier (2)")
    ap.add_argument("-d", "--datatype", default="float32", help="numpy dtype (float32)")
    ap.add_argument("-o", "--op", default="sum", choices=("sum", "prod", "min", "max"))
    ap.add_argument("-w", "--warmup-iters", type=int, default=1)
    ap.add_argument("-i", "--iters", type=int, default=5, help="timed calls per size (5)")
    ap.add_argument("-a", "--algorithm", choices=("auto", "ring", "rd"), default="auto")
    ap.add_argument("--faults", help="fault model on every rank's device, e.g. 'loss=0.01'")
    ap.add_argument("--seed", type=int, help="seed of the fault model")


def _allreduce(args) -> int:
    import numpy as np
    if args.stepfactor < 2:
        print("softnic perf: --stepfactor must be at least 2", file=sys.stderr)
        return 2
    from .collectives.communicator import DTYPES
    try:
        dtype = np.dtype(args.datatype)
    except TypeError:
        dtype = None
    if dtype is None or dtype not in DTYPES:
        print(f"softnic perf: datatype {args.datatype!r} is not one of "
              f"{', '.join(d.name for d in DTYPES)}", file=sys.stderr)
        return 2
    from .launch import launch
    worker = [sys.executable, "-u", "-m", "softnic.perf_collectives", "--worker", "allreduce",
              "-b", str(args.minbytes), "-e", str(args.maxbytes), "-f", str(args.stepfactor),
              "-d", args.datatype, "-o", args.op, "-w", str(args.warmup_iters),
              "-i", str(args.iters), "-a", args.algorithm, "-n", str(args.nproc)]
    return launch(worker, args.nproc, faults=args.faults, seed=args.seed)


def _allreduce_worker(args) -> int:
    import numpy as np

    from .collectives import DTYPES, Communicator
    dtype = np.dtype(args.datatype)
    if dtype is None or dtype not in DTYPES:
        print(f"softnic perf: datatype {dtype} not supported", file=sys.stderr)
        return 2
    comm = Communicator.from_env()
    n, r = comm.world_size, comm.rank
    algo = None if args.algorithm == "auto" else args.algorithm
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[args.op]
    out = print if r == 0 else (lambda *a, **k: None)
    out(f"# softnic allreduce: {n} ranks, {comm.transport.device} each, chunk "
        f"{comm.transport.chunk} B x {comm.transport.slots} slots, algorithm {args.algorithm}")
    out("#")
    out(f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'time':>10} {'algbw':>8} "
        f"{'busbw':>8} {'#wrong':>7}")
    out(f"# {'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'(us)':>10} {'(MB/s)':>8} "
        f"{'(MB/s)':>8} {'':>7}")
    size = max(args.minbytes, dtype.itemsize)
    total_bw = 0.0
    rows = 0
    while size <= args.maxbytes:
        count = size // dtype.itemsize
        # small integers, so every reduction is exact and checkable in any order
        inputs = [((np.arange(count) + k) % 3 + 1).astype(dtype) for k in range(n)]
        expected = inputs[0].copy()
        for k in range(1, n):
            ufunc(expected, inputs[k], out=expected)
        for _ in range(args.warmup_iters):
            comm.allreduce(inputs[r].copy(), args.op, algo)
        comm.barrier()
        bufs = [inputs[r].copy() for _ in range(args.iters)]
        t0 = time.perf_counter()
        for b in bufs:
            comm.allreduce(b, args.op, algo)
        dt = (time.perf_counter() - t0) / max(1, args.iters)
        wrong = sum(int(np.count_nonzero(b != expected)) for b in bufs)
        # the slowest rank's time is the collective's time
        t = np.array([dt], np.float64)
        comm.allreduce(t, "max")
        w = np.array([wrong], np.int64)
        comm.allreduce(w, "sum")
        algbw = count * dtype.itemsize / t[0] / 1e6
        busbw = algbw * 2 * (n - 1) / n
        total_bw += busbw
        rows += 1
        out(f"  {count * dtype.itemsize:>10} {count:>12} {dtype.name:>8} {args.op:>6} "
            f"{t[0] * 1e6:>10.1f} {algbw:>8.2f} {busbw:>8.2f} {int(w[0]):>7}")
        size *= args.stepfactor
    out(f"# Avg bus bandwidth    : {total_bw / max(1, rows):.2f} MB/s")
    comm.barrier()
    comm.close()
    return 0


# name -> (add the test's options, run it from the command line, its per-rank worker or None)
TESTS = {
    "allreduce": (_allreduce_arguments, _allreduce, _allreduce_worker),
}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="perf_test", required=True, metavar="TEST")
    for name, (arguments, _, _) in TESTS.items():
        arguments(sub.add_parser(name, help=f"{name} benchmark"))


def main(args) -> int:
    return TESTS[args.perf_test][1](args)


def _worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="softnic perf --worker")
    sub = ap.add_subparsers(dest="perf_test", required=True)
    for name, (arguments, _, worker) in TESTS.items():
        if worker is not None:
            arguments(sub.add_parser(name))
    args = ap.parse_args(argv)
    return TESTS[args.perf_test][2](args)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"]:
        sys.exit("run as: softnic perf TEST ...")
    sys.exit(_worker_main(sys.argv[2:]))
