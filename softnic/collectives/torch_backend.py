"""The torch.distributed backend ``softnic`` (needs the ``torch`` extra).

    import softnic.collectives.torch_backend          # registers the backend
    torch.distributed.init_process_group(backend="softnic")

Ranks come from torch's own rendezvous (``env://`` by default: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun and ``softnic launch`` set
them); QP numbers, PSNs, GIDs and rkeys are exchanged through torch's store.
Every collective runs on softnic's verbs collectives over CPU tensors:
broadcast, all_reduce (SUM, PRODUCT, MIN, MAX, AVG), all_gather (and
all_gather_into_tensor), reduce_scatter (and reduce_scatter_tensor),
all_to_all_single and barrier.

Every call returns at once with a ``Work`` that completes in the background:
one thread per process group runs the collectives in the order they were
issued (the same on every rank, as torch requires), so several may be in
flight, ``async_op=True`` overlaps them with whatever the caller does next,
and DistributedDataParallel's gradient buckets are reduced while the backward
pass goes on.  ``wait()``, ``is_completed()`` and ``get_future()`` behave as
torch defines them; an error (a dead peer, a timeout) is raised by ``wait()``
and by the future, and fails every collective issued after it.
``SOFTNIC_COLL_ASYNC=0`` (or ``group's backend.asynchronous = False``) runs
each call to completion before it returns instead.

A call its caller waits for at once (``async_op=False``: torch passes
``asyncOp = False`` in the call's options and waits on the Work before it
returns) runs in the caller's thread when nothing is in flight, which saves
the two thread hand-offs.  ``SOFTNIC_COLL_INLINE`` caps the bytes of such a
call (default: no cap; 0: every call goes through the group's thread).  An
asynchronous call always goes through the group's thread: it must make
progress while its caller does something else (which may be waiting for a
peer that has not issued the call yet).  With a torch whose options do not
say (no ``asyncOp``), calls up to 64 KiB with nothing in flight run in the
caller's thread, as before that field existed.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..driver import env
from .communicator import Communicator

BACKEND = "softnic"

_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
        dist.ReduceOp.MAX: "max", dist.ReduceOp.AVG: "sum"}


INLINE_UNSAID = 64 * 1024  # options that do not say whether the caller waits: up to this inline
HEARTBEAT = 0.25        # seconds between a rank's heartbeats in the store
DEAD_AFTER = 3.0        # a peer whose heartbeat stood still this long is gone


class _Store:
    """torch's store as the collectives use it (``set``, ``get``), plus ``failed_ranks``:
    every rank bumps a counter in the store from a thread of its own, and a peer whose
    counter has not moved for ``DEAD_AFTER`` seconds has died (torch's store does not
    say when a client goes away).  A lock keeps the two threads' requests apart."""

    def __init__(self, store, rank: int, size: int):
        self.store, self.rank, self.size = store, rank, size
        self.lock = threading.Lock()
        self.seen = {p: (-1, time.monotonic()) for p in range(size) if p != rank}
        self.closed = threading.Event()
        self._beat()
        self.thread = threading.Thread(target=self._run, name=f"softnic-heartbeat-{rank}",
                                       daemon=True)
        self.thread.start()

    def set(self, key, value) -> None:
        with self.lock:
            self.store.set(key, value)

    def get(self, key) -> bytes:
        # a blocking get would hold the lock: poll with check instead
        while True:
            with self.lock:
                if self.store.check([key]):
                    return self.store.get(key)
            dead = self.failed_ranks()
            if dead:
                raise RuntimeError(f"rank(s) {dead} stopped beating (process died?)")
            time.sleep(0.002)

    def _beat(self) -> None:
        with self.lock:
            self.store.add(f"softnic/hb/{self.rank}", 1)

    def _run(self) -> None:
        while not self.closed.wait(HEARTBEAT):
            try:
                self._beat()
            except Exception:               # noqa: BLE001 - the store is gone: stop
                return

    def failed_ranks(self) -> list[int]:
        now = time.monotonic()
        dead = []
        for p, (count, since) in self.seen.items():
            with self.lock:
                c = self.store.add(f"softnic/hb/{p}", 0)
            if c != count:
                self.seen[p] = (c, now)
            elif c > 0 and now - since > DEAD_AFTER:
                dead.append(p)
        return dead

    def close(self) -> None:
        self.closed.set()


class _Work(dist.Work):
    """A collective running in the group's thread: done when its future is."""

    def __init__(self, fut: torch.futures.Future):
        super().__init__()
        self.fut = fut

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        secs = timeout.total_seconds() if timeout is not None else 0
        if secs > 0 and not self.fut.done():
            done = threading.Event()
            self.fut.add_done_callback(lambda _: done.set())
            if not done.wait(secs):
                raise RuntimeError(f"softnic backend: collective not complete after {secs:g} s")
        self.fut.wait()                     # raises the collective's error, if any
        return True

    def is_completed(self) -> bool:
        return self.fut.done()

    def is_success(self) -> bool:
        if not self.fut.done():
            return False
        try:
            self.fut.value()
        except Exception:                   # noqa: BLE001
            return False
        return True

    def get_future(self) -> torch.futures.Future:
        return self.fut


class _Worker:
    """The thread that runs a process group's collectives, one after another, in the
    order they were issued.  The first failure fails everything after it: the ranks
    no longer agree on which collective comes next."""

    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.failed: BaseException | None = None
        self.mu = threading.Lock()                  # guards pending
        self.pending = 0                            # issued, not finished
        self.running = threading.Lock()             # held while a collective runs
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn, result) -> torch.futures.Future:
        fut = torch.futures.Future()
        with self.mu:
            self.pending += 1
        self.jobs.put((fn, result, fut))
        return fut

    def inline(self, fn, result) -> torch.futures.Future | None:
        """Run ``fn`` in the caller's thread if nothing is in flight (saving two thread
        hand-offs on a small collective); None if something is."""
        with self.mu:
            if self.pending:
                return None
            self.pending += 1
        fut = torch.futures.Future()
        self._do(fn, result, fut)
        return fut

    def _do(self, fn, result, fut) -> None:
        err = None
        with self.running:
            try:
                if self.failed is not None:
                    err = RuntimeError(f"softnic backend: an earlier collective failed: "
                                       f"{self.failed}")
                else:
                    try:
                        fn()
                    except BaseException as ex:     # noqa: BLE001 - handed to the waiter
                        self.failed = err = ex
            finally:
                # no longer in flight before its waiter wakes: the waiter's next call
                # finds nothing pending (and may run in its own thread)
                with self.mu:
                    self.pending -= 1
        if err is None:
            fut.set_result(result)
        else:
            fut.set_exception(err)

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self._do(*job)

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=30)


def _caller_waits(opts) -> bool | None:
    """Does the caller wait for this call's Work before it does anything else?
    torch's collectives say so in their options (``asyncOp``: ``async_op``);
    a call made without it (DistributedDataParallel's, from C++) defaults to
    asynchronous.  None: these options do not say."""
    a = getattr(opts, "asyncOp", None)
    return None if a is None else not a


def _op_name(reduce_op) -> str:
    op = getattr(reduce_op, "op", reduce_op)
    for k, name in _OPS.items():
        if op == k:
            return name
    raise ValueError(f"softnic backend: reduction {reduce_op} is not supported "
                     f"(SUM, PRODUCT, MIN, MAX, AVG)")


def _is_avg(reduce_op) -> bool:
    return getattr(reduce_op, "op", reduce_op) == dist.ReduceOp.AVG


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class _Array:
    """A numpy view of a CPU tensor; a contiguous staging copy when the tensor is not
    contiguous, written back by ``finish``."""

    def __init__(self, t: torch.Tensor):
        if t.device.type != "cpu":
            raise ValueError(f"softnic backend: tensors must be on the CPU, not {t.device}")
        if t.dtype in (torch.bfloat16, torch.bool) or t.is_complex() and t.dtype not in (
                torch.complex64, torch.complex128):
            raise TypeError(f"softnic backend: dtype {t.dtype} is not supported")
        self.t = t
        self.stage = t if t.is_contiguous() else t.contiguous()
        self.a = self.stage.detach().numpy().reshape(-1)

    def finish(self) -> None:
        if self.stage is not self.t:
            self.t.copy_(self.stage)


class SoftnicProcessGroup(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        secs = env.number("SOFTNIC_COLL_TIMEOUT", timeout.total_seconds(), float)
        self.store = _Store(store, rank, size) if size > 1 else store
        self.comm = Communicator(rank, size, self.store, prefix="softnic", timeout=secs)
        self.asynchronous = os.environ.get("SOFTNIC_COLL_ASYNC", "1") != "0"
        cap = os.environ.get("SOFTNIC_COLL_INLINE", "").strip()
        self.inline_max = int(cap) if cap else None     # None: a waited-for call of any size
        self._worker = _Worker(f"softnic-pg-{rank}")

    def getBackendName(self) -> str:
        return BACKEND

    def _run(self, fn, result, nbytes: int, opts) -> dist.Work:
        """Run ``fn`` in the group's thread; the Work completes (with ``result``) when it
        has.  Synchronous mode waits for it here.  A call whose caller waits for it
        at once (``_caller_waits``) runs here and now if none is in flight."""
        if self._inline(nbytes, _caller_waits(opts)):
            fut = self._worker.inline(fn, result)
            if fut is not None:
                return _Work(fut)
        fut = self._worker.submit(fn, result)
        if not self.asynchronous:
            try:
                fut.wait()
            except Exception:               # noqa: BLE001 - raised again by wait()
                pass
        return _Work(fut)

    def _inline(self, nbytes: int, waits: bool | None) -> bool:
        """May a call of ``nbytes`` run in the caller's thread?  Only one its caller
        waits for at once (``waits``; None: torch did not say, and a small call
        may), within ``SOFTNIC_COLL_INLINE``."""
        cap = self.inline_max
        if waits is None:
            cap = INLINE_UNSAID if cap is None else min(cap, INLINE_UNSAID)
        elif not waits:
            return False
        return cap is None or 0 < cap and nbytes <= cap

    # ------------------------------------------------------------------ collectives

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = _op_name(op)
        if _is_avg(op) and not all(t.is_floating_point() for t in tensors):
            raise TypeError("softnic backend: AVG needs a floating-point tensor")
        xs = [_Array(t) for t in tensors]

        def job():
            for x in xs:
                self.comm.allreduce(x.a, name)
                if _is_avg(op):
                    x.stage.div_(self.size())
                x.finish()
        return self._run(job, tensors, _nbytes(tensors), opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        xs = [_Array(t) for t in tensors]

        def job():
            for x in xs:
                self.comm.broadcast(x.a, root)
                x.finish()
        return self._run(job, tensors, _nbytes(tensors), opts)

    def allgather(self, output_lists, inputs, opts=None):
        for outs in output_lists:
            if len(outs) != self.size():
                raise ValueError(f"softnic backend: all_gather needs {self.size()} outputs")
        xs = [_Array(inp) for inp in inputs]

        def job():
            for outs, inp, x in zip(output_lists, inputs, xs):
                gathered = self.comm.allgather(x.a)
                for i, o in enumerate(outs):
                    o.copy_(torch.from_numpy(gathered[i].reshape(tuple(inp.shape))))
        return self._run(job, output_lists, self.size() * _nbytes(inputs), opts)

    def all_gather_single(self, output, inp, opts=None):
        x, y = _Array(inp), _Array(output)

        def job():
            self.comm.allgather(x.a, y.a)
            y.finish()
        return self._run(job, [output], _nbytes([output]), opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        pairs = [(_Array(i), _Array(o)) for o, i in zip(outputs, inputs)]

        def job():
            for x, y in pairs:
                self.comm.allgather(x.a, y.a)
                y.finish()
        return self._run(job, outputs, _nbytes(outputs), opts)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        pairs = []
        for out, ins in zip(outputs, input_lists):
            if len(ins) != self.size():
                raise ValueError(f"softnic backend: reduce_scatter needs {self.size()} inputs")
            pairs.append((out, torch.cat([t.reshape(-1) for t in ins])))
        return self._reduce_scatter(pairs, op, outputs, opts)

    def reduce_scatter_single(self, output, inp, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._reduce_scatter([(output, inp.reshape(-1))], op, [output], opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._reduce_scatter([(o, i.reshape(-1)) for o, i in zip(outputs, inputs)],
                                    op, outputs, opts)

    def _reduce_scatter(self, pairs, op, result, opts) -> dist.Work:
        name = _op_name(op)
        arrays = [(_Array(flat), _Array(out)) for out, flat in pairs]

        def job():
            for x, y in arrays:
                self.comm.reduce_scatter(x.a, y.a, name)
                if _is_avg(op):
                    y.stage.div_(self.size())
                y.finish()
        return self._run(job, result, sum(_nbytes([f]) for _, f in pairs), opts)

    def all_to_all_single(self, output, inp, output_split_sizes, input_split_sizes, opts=None):
        if output_split_sizes or input_split_sizes:
            raise ValueError("softnic backend: all_to_all_single with uneven splits is not "
                             "supported")
        x, y = _Array(inp), _Array(output)

        def job():
            self.comm.alltoall(x.a, y.a)
            y.finish()
        return self._run(job, [output], _nbytes([output]), opts)

    # the names older torch releases call
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._run(self.comm.barrier, None, 0, opts)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self.comm.close()
        if isinstance(self.store, _Store):
            self.store.close()


def _create(store, rank, size, timeout):
    return SoftnicProcessGroup(store, rank, size, timeout)


def register() -> None:
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


register()

__all__ = ["SoftnicProcessGroup", "register", "BACKEND"]
