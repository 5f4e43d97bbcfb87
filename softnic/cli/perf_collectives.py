"""``softnic perf allreduce`` (and ``allgather``, ``reducescatter``, ``broadcast``): the
collectives' benchmarks, as nccl-tests has them (``softnic.cli.perf`` registers every test
in ``TESTS`` here next to perftest's).

``softnic perf allreduce -n 4 -b 8 -e 1M -f 4`` runs 4 ranks on this machine
(as ``softnic launch`` does) and prints, like nccl-tests' all_reduce_perf, one
row per size: bytes, element count, type, reduction, time per call (``-i`` calls
back to back after a barrier, timed together as nccl-tests times them, over
``-i``; the slowest rank's), algorithm bandwidth (size / time), bus bandwidth
(algbw times nccl-tests' factor: 2(n-1)/n for allreduce, (n-1)/n for allgather
and reduce-scatter, 1 for broadcast: the traffic each link carries), and how
many elements came out wrong against numpy in one more call from fresh inputs.
The size is the whole buffer, as in nccl-tests: allgather's output,
reduce-scatter's input.  Bandwidths are in MB/s (nccl-tests prints GB/s; a NIC
in Python moves megabytes).

``--compare gloo`` opens torch's gloo backend over the same ranks and times it on
the same tensors, in turn with softnic's (half the calls each, then the other
half in the other order), and adds its time, its
bus bandwidth and the ratio softnic / gloo (below 1: softnic is faster).
"""

from __future__ import annotations

import argparse
import sys
import time

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# test -> (torch.distributed name, bus bandwidth factor as a function of n, has a reduction)
KINDS = {
    "allreduce": ("all_reduce", lambda n: 2 * (n - 1) / n, True),
    "allgather": ("all_gather", lambda n: (n - 1) / n, False),
    "reducescatter": ("reduce_scatter", lambda n: (n - 1) / n, True),
    "broadcast": ("broadcast", lambda n: 1.0, False),
}


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


def _arguments(kind: str):
    def add(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("-n", "--nproc", type=int, default=2, help="ranks (default 2)")
        ap.add_argument("-b", "--minbytes", type=size_arg, default=8, help="smallest size (8)")
        ap.add_argument("-e", "--maxbytes", type=size_arg, default=1 << 20,
                        help="largest size (1M)")
        ap.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier (2)")
        ap.add_argument("-d", "--datatype", default="float32", help="numpy dtype (float32)")
        if KINDS[kind][2]:
            ap.add_argument("-o", "--op", default="sum", choices=("sum", "prod", "min", "max"))
        if kind == "broadcast":
            ap.add_argument("-r", "--root", type=int, default=0, help="root rank (0)")
        ap.add_argument("-w", "--warmup-iters", type=int, default=1)
        ap.add_argument("-i", "--iters", type=int, default=5,
                        help="timed calls per size, back to back (5)")
        if kind == "allreduce":
            ap.add_argument("-a", "--algorithm", default="auto",
                            choices=("auto", "ring", "rd", "hd", "tree", "ptree"))
        ap.add_argument("--compare", choices=("gloo",),
                        help="also time torch's gloo backend on the same tensors")
        ap.add_argument("--faults", help="fault model on every rank's device, e.g. 'loss=0.01'")
        ap.add_argument("--seed", type=int, help="seed of the fault model")
    return add


def _run(args) -> int:
    import numpy as np
    if args.stepfactor < 2:
        print("softnic perf: --stepfactor must be at least 2", file=sys.stderr)
        return 2
    from ..collectives.communicator import DTYPES
    try:
        dtype = np.dtype(args.datatype)
    except TypeError:
        dtype = None
    if dtype is None or dtype not in DTYPES:
        print(f"softnic perf: datatype {args.datatype!r} is not one of "
              f"{', '.join(d.name for d in DTYPES)}", file=sys.stderr)
        return 2
    if getattr(args, "root", 0) not in range(args.nproc):
        print(f"softnic perf: root {args.root} outside 0..{args.nproc - 1}", file=sys.stderr)
        return 2
    if args.compare:
        import importlib.util
        if importlib.util.find_spec("torch") is None:
            print("softnic perf: --compare gloo needs torch (pip install -e '.[torch]')",
                  file=sys.stderr)
            return 2
    from .launch import launch
    worker = [sys.executable, "-u", "-m", "softnic.cli.perf_collectives", "--worker",
              args.perf_test, "-b", str(args.minbytes), "-e", str(args.maxbytes),
              "-f", str(args.stepfactor), "-d", args.datatype, "-w", str(args.warmup_iters),
              "-i", str(args.iters), "-n", str(args.nproc)]
    if hasattr(args, "op"):
        worker += ["-o", args.op]
    if hasattr(args, "root"):
        worker += ["-r", str(args.root)]
    if hasattr(args, "algorithm"):
        worker += ["-a", args.algorithm]
    if args.compare:
        worker += ["--compare", args.compare]
    return launch(worker, args.nproc, faults=args.faults, seed=args.seed)


def _worker(args) -> int:
    import numpy as np

    kind = args.perf_test
    _, factor, reduces = KINDS[kind]
    dtype = np.dtype(args.datatype)
    if dtype is None or dtype not in _dtypes():
        print(f"softnic perf: datatype {dtype} not supported", file=sys.stderr)
        return 2
    op = getattr(args, "op", "sum")
    root = getattr(args, "root", 0)
    algo = getattr(args, "algorithm", "auto")
    algo = None if algo == "auto" else algo
    comm, gloo = _open(args.compare)
    n, r = comm.world_size, comm.rank
    out = print if r == 0 else (lambda *a, **k: None)
    _print_header(out, kind, comm, algo, root, gloo is not None)
    size = max(args.minbytes, dtype.itemsize * (n if kind in ("allgather",
                                                                "reducescatter") else 1))
    total_bw = 0.0
    rows = 0
    while size <= args.maxbytes:
        count = size // dtype.itemsize
        if kind in ("allgather", "reducescatter"):
            count -= count % n
        nbytes = count * dtype.itemsize
        expected, src, bufs = _case(kind, comm, count, dtype, op, root)
        sides = [("softnic", _softnic_call(kind, comm, src, bufs[0], op, algo, root), bufs[0])]
        if gloo is not None:
            sides.append(("gloo", _gloo_call(kind, gloo, src, bufs[1], op, root), bufs[1]))
        res = _time(args, comm, kind, sides, src, expected, nbytes, factor(n))
        st, algbw, busbw, w = res["softnic"]
        total_bw += busbw
        rows += 1
        line = (f"  {nbytes:>10} {count:>12} {dtype.name:>8} "
                f"{op if reduces else 'none':>6} {st * 1e6:>10.1f} {algbw:>8.2f} "
                f"{busbw:>8.2f} {w:>7}")
        if "gloo" in res:
            gt, _, gbus, gw = res["gloo"]
            line += f" {gt * 1e6:>10.1f} {gbus:>8.2f} {st / gt:>12.2f}"
            if gw:
                line += f"  (gloo #wrong {gw})"
        out(line)
        size *= args.stepfactor
    out(f"# Avg bus bandwidth    : {total_bw / max(1, rows):.2f} MB/s")
    comm.barrier()
    if gloo is not None:
        import torch.distributed as dist
        dist.destroy_process_group()
    else:
        comm.close()
    return 0


def _dtypes():
    from ..collectives import DTYPES
    return DTYPES


def _open(compare):
    """This rank's communicator, and (``--compare gloo``) a gloo group beside it: then
    softnic's runs as torch's process group, so both start from one rendezvous."""
    from ..collectives import Communicator
    if not compare:
        return Communicator.from_env(), None
    import os

    import torch
    import torch.distributed as dist

    from ..collectives import torch_backend
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(torch_backend.BACKEND)
    comm = dist.group.WORLD.comm         # softnic's collectives, called here directly
    return comm, dist.new_group(backend="gloo")


def _print_header(out, kind, comm, algo, root, gloo: bool) -> None:
    t = comm.transport
    out(f"# softnic {kind}: {comm.world_size} ranks, {t.device} each, {t.nqp} QP(s) per peer, "
        f"chunk {t.chunk} B x {t.slots} slots" + (f", algorithm {algo or 'auto'}"
                                                  if kind == "allreduce" else "")
        + (f", root {root}" if kind == "broadcast" else ""))
    out("#")
    head = (f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'time':>10} "
            f"{'algbw':>8} {'busbw':>8} {'#wrong':>7}")
    units = (f"# {'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'(us)':>10} {'(MB/s)':>8} "
             f"{'(MB/s)':>8} {'':>7}")
    if gloo:
        head += f" {'gloo time':>10} {'busbw':>8} {'softnic/gloo':>12}"
        units += f" {'(us)':>10} {'(MB/s)':>8} {'':>12}"
    out(head)
    out(units)


_UFUNCS = {"sum": "add", "prod": "multiply", "min": "minimum", "max": "maximum"}


def _case(kind, comm, count, dtype, op, root):
    """One size's inputs: (the result this rank must see, its source, two output
    buffers: softnic's and gloo's).  Small integers, so every reduction is exact and
    checkable in any order."""
    import numpy as np
    n, r = comm.world_size, comm.rank
    ufunc = getattr(np, _UFUNCS[op])
    part = count // n
    inputs = [((np.arange(count) + k) % 3 + 1).astype(dtype) for k in range(n)]
    if kind == "allreduce":
        expected = inputs[0].copy()
        for k in range(1, n):
            ufunc(expected, inputs[k], out=expected)
    elif kind == "reducescatter":
        full = inputs[0].copy()
        for k in range(1, n):
            ufunc(full, inputs[k], out=full)
        expected = full[r * part:(r + 1) * part]
    elif kind == "allgather":
        expected = np.concatenate([inputs[k][k * part:(k + 1) * part] for k in range(n)])
    else:
        expected = inputs[root]
    if kind == "allgather":
        src = inputs[r][r * part:(r + 1) * part].copy()
        bufs = [np.empty(count, dtype) for _ in range(2)]
    elif kind == "reducescatter":
        src = inputs[r].copy()
        bufs = [np.empty(part, dtype) for _ in range(2)]
    else:
        src = inputs[r]
        bufs = [inputs[r].copy() for _ in range(2)]
    return expected, src, bufs


def _softnic_call(kind, comm, src, b, op, algo, root):
    def call():
        if kind == "allreduce":
            comm.allreduce(b, op, algo)
        elif kind == "broadcast":
            comm.broadcast(b, root)
        elif kind == "allgather":
            comm.allgather(src, b)
        else:
            comm.reduce_scatter(src, b, op)
    return call


def _gloo_call(kind, gloo, src, b, op, root):
    import torch
    import torch.distributed as dist
    gop = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
           "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
    tb, tsrc = torch.from_numpy(b), torch.from_numpy(src)

    def call():
        if kind == "allreduce":
            dist.all_reduce(tb, op=gop, group=gloo)
        elif kind == "broadcast":
            dist.broadcast(tb, src=root, group=gloo)
        elif kind == "allgather":
            dist.all_gather_into_tensor(tb, tsrc, group=gloo)
        else:
            dist.reduce_scatter_tensor(tb, tsrc, op=gop, group=gloo)
    return call


def _time(args, comm, kind, sides, src, expected, nbytes, bus_factor):
    """Time each side as nccl-tests does (common.cu's ``BenchTime``): untimed warm-up
    calls, then a barrier and ``iters`` calls back to back, timed together; a call's
    time is their total over ``iters``, the slowest rank's.  The sides take turns in
    two rounds of half the calls each (this side first, then the other), then each
    makes one more call from fresh inputs, whose result is checked (``#wrong``, as
    nccl-tests' check).  {side: (time, algbw, busbw, wrong elements)}."""
    import numpy as np

    def fresh(b):
        if kind in ("allreduce", "broadcast"):
            b[:] = src

    for _, fn, b in sides:
        for _ in range(args.warmup_iters):
            fresh(b)
            fn()
    spent = {name: 0.0 for name, _, _ in sides}
    for rnd, k in enumerate((args.iters - args.iters // 2, args.iters // 2)):
        for name, fn, b in (sides if rnd == 0 else sides[::-1]):
            if not k:
                continue
            fresh(b)
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            spent[name] += time.perf_counter() - t0
    wrong = {}
    for name, fn, b in sides:
        fresh(b)
        comm.barrier()
        fn()
        wrong[name] = int(np.count_nonzero(b != expected))
    res = {}
    for name in spent:
        tt = np.array([spent[name] / max(1, args.iters)], np.float64)
        comm.allreduce(tt, "max")
        w = np.array([wrong[name]], np.int64)
        comm.allreduce(w, "sum")
        algbw = nbytes / tt[0] / 1e6
        res[name] = (tt[0], algbw, algbw * bus_factor, int(w[0]))
    return res


# name -> (add the test's options, run it from the command line, its per-rank worker or None)
TESTS = {kind: (_arguments(kind), _run, _worker) for kind in KINDS}


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
