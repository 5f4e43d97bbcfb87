"""One rank of the collectives correctness run (started by tests/test_collectives.py
through ``softnic launch``).  Every rank can compute every rank's input, so each
result is checked against numpy on the spot.  Prints ``rank R ok N`` at the end.

    python tests/collectives_worker.py [--big] [--die-after N]
"""

import argparse
import os
import sys

import numpy as np

from softnic.collectives import Communicator

INT_TYPES = ("int8", "uint8", "int32", "int64", "uint64")
FLOAT_TYPES = ("float16", "float32", "float64", "complex64")


def inputs(case: int, world: int, count: int, dtype, op: str) -> list:
    """Every rank's input for one case, the same on every rank."""
    out = []
    for r in range(world):
        rng = np.random.default_rng([case, r])
        if dtype.kind in "iu":
            hi = 3 if op == "prod" else 100
            a = rng.integers(0, hi, count).astype(dtype)
        elif dtype.kind == "c":
            a = (rng.uniform(0.5, 1.5, count) + 1j * rng.uniform(0.5, 1.5, count)).astype(dtype)
        else:
            a = rng.uniform(0.5, 1.5, count).astype(dtype)
        out.append(a)
    return out


def reduce(arrays, op: str):
    f = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    acc = arrays[0].copy()
    for a in arrays[1:]:
        f(acc, a, out=acc)
    return acc


def check(got, want, what: str) -> None:
    if got.dtype.kind in "fc":
        tol = 2e-2 if got.dtype == np.float16 else 1e-5
        ok = np.allclose(got, want, rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, want)
    if not ok:
        bad = np.flatnonzero(~np.isclose(got, want) if got.dtype.kind in "fc" else got != want)
        raise AssertionError(f"{what}: {bad.size} wrong elements, first at {bad[:5]}: "
                             f"got {got[bad[:5]]}, want {want[bad[:5]]}")


def _verbs_pkg() -> str:
    from softnic.collectives import _verbs
    return _verbs.PKG


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", action="store_true", help="also sizes above the ring threshold")
    ap.add_argument("--quick", action="store_true", help="a few dtypes, ops and sizes")
    ap.add_argument("--die-after", type=int, help="rank 1 exits abruptly after N allreduces")
    args = ap.parse_args()
    comm = Communicator.from_env()
    r, n = comm.rank, comm.world_size
    checks = 0
    case = 0
    if args.die_after is not None:
        for i in range(args.die_after + 100):
            if r == 1 and i == args.die_after:
                os._exit(3)
            comm.allreduce(np.ones(1000, np.float32))
        return 0
    counts = [0, 1, 13, 1000] + ([40_000] if args.big else [])
    types = ("int64", "float32") if args.quick else INT_TYPES + FLOAT_TYPES
    if args.quick:
        counts = [1, 300] + ([40_000] if args.big else [])
    for dtype in map(np.dtype, types):
        ops = ("sum", "prod") if dtype.kind == "c" else ("sum", "prod", "min", "max")
        if args.quick:
            ops = ("sum", "max") if dtype.kind == "f" else ("prod", "min")
        for op in ops:
            for count in counts:
                if count == 40_000 and dtype.name not in ("float32", "int64"):
                    continue
                case += 1
                xs = inputs(case, n, count, dtype, op)
                want = reduce(xs, op)
                for algo in ("ring", "rd", "hd"):
                    buf = xs[r].copy()
                    comm.allreduce(buf, op, algorithm=algo)
                    check(buf, want, f"allreduce {algo} {op} {dtype} x{count}")
                    checks += 1
    for dtype in map(np.dtype, ("float64",) if args.quick else ("int32", "float64", "uint8")):
        # 50 000 float64 elements per block: several chunks each, sent from the caller's
        # registered memory (with SOFTNIC_COLL_ZCOPY below 400 KB), and broadcast by the
        # pipelined chain when there are 3+ ranks
        for count in ((7,) if args.quick else (1, 7, 1000)) + ((50_000,) if args.big else ()):
            case += 1
            xs = inputs(case, n, count * n, dtype, "sum")
            # reduce-scatter: block r of the sum
            got = comm.reduce_scatter(xs[r])
            check(got, reduce(xs, "sum")[r * count:(r + 1) * count],
                  f"reduce_scatter {dtype} x{count}")
            got = comm.reduce_scatter(xs[r], op="max")
            check(got, reduce(xs, "max")[r * count:(r + 1) * count],
                  f"reduce_scatter max {dtype} x{count}")
            # allgather: everyone's first `count` elements side by side
            got = comm.allgather(xs[r][:count])
            check(got.reshape(-1), np.concatenate([x[:count] for x in xs]),
                  f"allgather {dtype} x{count}")
            # alltoall: block j of rank i's input lands as block i on rank j
            got = comm.alltoall(xs[r])
            check(got, np.concatenate([x[r * count:(r + 1) * count] for x in xs]),
                  f"alltoall {dtype} x{count}")
            # broadcast from every root
            for root in (0, n - 1) if args.quick else range(n):
                buf = xs[r].copy()
                comm.broadcast(buf, root)
                check(buf, xs[root], f"broadcast root {root} {dtype} x{count}")
            checks += 4 + (2 if args.quick else n)
    comm.barrier()
    # each QP of a peer sends from a UDP source port of its own (ECMP entropy)
    t = comm.transport
    for p in t.qps:
        ports = t.udp_source_ports(p)
        assert len(set(ports)) == len(ports) == t.nqp, ports
        if _verbs_pkg() == "verbs_api":
            from softnic.core.entropy import qp_udp_sport
            assert [qp_udp_sport(qp._eqp) for qp in t.qps[p]] == ports
        checks += 1
    # the results are the same bits on every rank (data-parallel training needs it)
    x = inputs(999, n, 5000, np.dtype("float32"), "sum")[r]
    comm.allreduce(x)
    allx = comm.allgather(x)
    assert all(np.array_equal(allx[0], a) for a in allx), "ranks disagree on allreduce bits"
    checks += 1
    comm.barrier()
    dropped = 0
    try:                                    # softnic's own counters, when on softnic
        import softnic.driver.nic
        dropped = sum(nic.counters.get("fault_dropped_loss", 0) for nic in softnic.driver.nic.open_nics())
    except ImportError:
        pass
    from softnic.collectives import _verbs
    # one write: with several ranks on one terminal, lines must not interleave
    sys.stdout.write(f"rank {r} ok {checks} dropped {dropped} verbs {_verbs.PKG}\n")
    sys.stdout.flush()
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
