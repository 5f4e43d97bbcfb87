"""One rank of the torch.distributed backend test (started by tests/test_torch_backend.py
through ``softnic launch``): every collective of the ``softnic`` backend checked against
what it must give, then the DDP example trained over softnic and over gloo in the same
processes.  Rank 0 writes the losses as JSON to the path given."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import softnic.collectives.torch_backend  # noqa: F401  registers "softnic"

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from ddp_train import train  # noqa: E402


def inputs(world, shape, dtype):
    g = torch.Generator().manual_seed(5)
    return [torch.randint(1, 4, shape, generator=g).to(dtype) for _ in range(world)]


def die():
    """Rank 1 exits in the middle of the job; rank 0, waiting on an asynchronous
    all_reduce, must fail with an error naming it, not hang."""
    import time
    torch.set_num_threads(1)
    dist.init_process_group("softnic")
    r = dist.get_rank()
    t = torch.ones(1 << 20)
    dist.all_reduce(t)
    if r == 1:
        os._exit(3)
    t0 = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    try:
        work.wait()
    except Exception as ex:         # noqa: BLE001 - what the caller sees is the point
        print(f"rank 0 failed after {time.monotonic() - t0:.1f} s: {type(ex).__name__}: {ex}",
              flush=True)
        # and every collective after it fails at once
        try:
            dist.all_reduce(torch.ones(4))
        except Exception as ex2:    # noqa: BLE001
            print(f"next: {ex2}", flush=True)
        os._exit(0)
    print(f"rank 0: all_reduce completed with its peer gone after "
          f"{time.monotonic() - t0:.1f} s: {t[:4]}", flush=True)
    os._exit(1)


def main():
    if sys.argv[1] == "--die":
        return die()
    out_path, steps = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("softnic")
    r, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "softnic"
    checked = []
    for dtype in (torch.float32, torch.int64, torch.float64):
        xs = inputs(n, (5, 3), dtype)
        for op, f in ((dist.ReduceOp.SUM, lambda a, b: a + b),
                      (dist.ReduceOp.PRODUCT, lambda a, b: a * b),
                      (dist.ReduceOp.MIN, torch.minimum), (dist.ReduceOp.MAX, torch.maximum)):
            want = xs[0].clone()
            for x in xs[1:]:
                want = f(want, x)
            t = xs[r].clone()
            dist.all_reduce(t, op=op)
            assert torch.equal(t, want), (dtype, op, t, want)
            checked.append(f"all_reduce {op} {dtype}")
    xs = inputs(n, (6,), torch.float32)
    t = xs[r].clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.allclose(t, sum(xs) / n)
    # a non-contiguous tensor, asynchronously
    base = torch.zeros(4, 6)
    base[:, 1] = float(r + 1)
    work = dist.all_reduce(base[:, 1], async_op=True)
    work.wait()
    assert torch.equal(base[:, 1], torch.full((4,), float(n * (n + 1) // 2)))
    assert torch.equal(base[:, 0], torch.zeros(4))
    # several collectives in flight at once; a Work completes in the background
    import time
    store = dist.distributed_c10d._get_default_store()
    if r == 1:
        store.get("late")                  # rank 1 issues only when rank 0 says so
    # the first is small and issued with nothing in flight: asynchronous all the same
    # (run in the caller's thread, rank 0 would wait in it for rank 1, which waits
    # for rank 0's "late" below)
    small = torch.full((8,), float(r + 1))
    first = dist.all_reduce(small, async_op=True)
    big = [torch.full((100_000,), float(r + k)) for k in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in big]
    works.append(dist.broadcast(torch.full((5,), float(r)), src=1, async_op=True))
    gathered = torch.empty(n * 3)
    works.append(dist.all_gather_into_tensor(gathered, torch.full((3,), float(r)),
                                             async_op=True))
    if r == 0:
        # rank 1 has not started: nothing can have completed yet
        time.sleep(0.3)
        assert not first.is_completed()
        assert not any(w.is_completed() for w in works)
        assert not works[0].get_future().done()
        store.set("late", b"1")
    chained = works[0].get_future().then(lambda f: f.value()[0].sum().item())
    assert first.wait()
    assert torch.equal(small, torch.full((8,), float(n * (n + 1) // 2)))
    for w in works:
        assert w.wait()
    assert all(w.is_completed() for w in works)
    for k, t in enumerate(big):
        assert torch.equal(t, torch.full((100_000,), float(sum(q + k for q in range(n)))))
    assert chained.wait() == 100_000 * sum(q for q in range(n))
    assert torch.equal(works[4].get_future().value()[0], torch.full((5,), 1.0))
    assert torch.equal(gathered, torch.arange(n).repeat_interleave(3).float())
    checked.append("async in flight")
    # where a call runs: one its caller waits for (async_op=False) in the caller's
    # thread, whatever its size; an asynchronous one in the group's thread
    import threading
    from softnic.collectives.communicator import Communicator
    ran = []
    plain = Communicator.allreduce

    def traced(self, *a, **k):
        ran.append(threading.current_thread() is threading.main_thread())
        return plain(self, *a, **k)
    Communicator.allreduce = traced
    try:
        dist.all_reduce(torch.ones(300_000))
        dist.all_reduce(torch.ones(300_000), async_op=True).wait()
        dist.all_reduce(torch.ones(4), async_op=True).wait()
        dist.all_reduce(torch.ones(4))
    finally:
        Communicator.allreduce = plain
    assert ran == [True, False, False, True], ran
    checked.append("caller's thread when waited for")
    for root in range(n):
        t = torch.full((7,), float(r))
        dist.broadcast(t, src=root)
        assert torch.equal(t, torch.full((7,), float(root)))
    outs = [torch.empty(3, 2) for _ in range(n)]
    dist.all_gather(outs, torch.full((3, 2), float(r)))
    assert all(torch.equal(o, torch.full((3, 2), float(i))) for i, o in enumerate(outs))
    flat = torch.empty(n * 4)
    dist.all_gather_into_tensor(flat, torch.full((4,), float(r)))
    assert torch.equal(flat, torch.arange(n).repeat_interleave(4).float())
    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(10 * i + r)) for i in range(n)])
    assert torch.equal(out, torch.full((2,), float(10 * r * n + n * (n - 1) // 2)))
    out = torch.empty(3)
    dist.reduce_scatter_tensor(out, torch.arange(3.0 * n) + r)
    assert torch.equal(out, (torch.arange(3.0) + 3 * r) * n + n * (n - 1) // 2)
    dist.barrier()
    checked += ["avg", "async non-contiguous", "broadcast", "all_gather",
                "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "barrier"]

    gloo = dist.new_group(backend="gloo")
    runs = {}
    for name, group in (("softnic", dist.group.WORLD), ("gloo", gloo)):
        losses, params = train(group, r, n, steps, 0.05)
        gathered = [torch.empty_like(params) for _ in range(n)]
        dist.all_gather(gathered, params, group=group)
        runs[name] = {"losses": losses,
                      "identical": all(torch.equal(g, gathered[0]) for g in gathered),
                      "params": params.tolist()[:8]}
    if r == 0:
        with open(out_path, "w") as f:
            json.dump({"world": n, "checked": checked, "runs": runs}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
