"""The torch.distributed backend ``softnic`` (needs the ``torch`` extra).

    import softnic.collectives.torch_backend          # registers the backend
    torch.distributed.init_process_group(backend="softnic")

Ranks come from torch's own rendezvous (``env://`` by default: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun and ``softnic launch`` set
them); QP numbers, PSNs, GIDs and rkeys are exchanged through torch's store.
Every collective runs on softnic's verbs collectives over CPU tensors:
broadcast, all_reduce (SUM, PRODUCT, MIN, MAX, AVG), all_gather (and
all_gather_into_tensor), reduce_scatter (and reduce_scatter_tensor),
all_to_all_single and barrier.  Calls complete before they return; the Work
they hand back is already done, so ``async_op=True`` and DDP's bucket hooks
work unchanged.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from .communicator import Communicator

BACKEND = "softnic"

_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
        dist.ReduceOp.MAX: "max", dist.ReduceOp.AVG: "sum"}


def _done(result) -> dist.Work:
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _op_name(reduce_op) -> str:
    op = getattr(reduce_op, "op", reduce_op)
    for k, name in _OPS.items():
        if op == k:
            return name
    raise ValueError(f"softnic backend: reduction {reduce_op} is not supported "
                     f"(SUM, PRODUCT, MIN, MAX, AVG)")


def _is_avg(reduce_op) -> bool:
    return getattr(reduce_op, "op", reduce_op) == dist.ReduceOp.AVG


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
        secs = float(os.environ.get("SOFTNIC_COLL_TIMEOUT", timeout.total_seconds()))
        self.comm = Communicator(rank, size, store, prefix="softnic", timeout=secs)

    def getBackendName(self) -> str:
        return BACKEND

    # ------------------------------------------------------------------ collectives

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = _op_name(op)
        for t in tensors:
            x = _Array(t)
            self.comm.allreduce(x.a, name)
            if _is_avg(op):
                if not t.is_floating_point():
                    raise TypeError("softnic backend: AVG needs a floating-point tensor")
                x.stage.div_(self.size())
            x.finish()
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            x = _Array(t)
            self.comm.broadcast(x.a, root)
            x.finish()
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        for outs, inp in zip(output_lists, inputs):
            if len(outs) != self.size():
                raise ValueError(f"softnic backend: all_gather needs {self.size()} outputs")
            x = _Array(inp)
            gathered = self.comm.allgather(x.a)
            for i, o in enumerate(outs):
                o.copy_(torch.from_numpy(gathered[i].reshape(tuple(inp.shape))))
        return _done(output_lists)

    def all_gather_single(self, output, inp, opts=None):
        x, y = _Array(inp), _Array(output)
        self.comm.allgather(x.a, y.a)
        y.finish()
        return _done([output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self.all_gather_single(o, i, opts)
        return _done(outputs)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        for out, ins in zip(outputs, input_lists):
            if len(ins) != self.size():
                raise ValueError(f"softnic backend: reduce_scatter needs {self.size()} inputs")
            flat = torch.cat([t.reshape(-1) for t in ins])
            self._reduce_scatter_flat(out, flat, op)
        return _done(outputs)

    def reduce_scatter_single(self, output, inp, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        self._reduce_scatter_flat(output, inp.reshape(-1), op)
        return _done([output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self.reduce_scatter_single(o, i, opts)
        return _done(outputs)

    def _reduce_scatter_flat(self, out, flat, op) -> None:
        x, y = _Array(flat), _Array(out)
        self.comm.reduce_scatter(x.a, y.a, _op_name(op))
        if _is_avg(op):
            y.stage.div_(self.size())
        y.finish()

    def all_to_all_single(self, output, inp, output_split_sizes, input_split_sizes, opts=None):
        if output_split_sizes or input_split_sizes:
            raise ValueError("softnic backend: all_to_all_single with uneven splits is not "
                             "supported")
        x, y = _Array(inp), _Array(output)
        self.comm.alltoall(x.a, y.a)
        y.finish()
        return _done([output])

    # the names older torch releases call
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        self.comm.barrier()
        return _done(None)

    def shutdown(self) -> None:
        self.comm.close()


def _create(store, rank, size, timeout):
    return SoftnicProcessGroup(store, rank, size, timeout)


def register() -> None:
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


register()

__all__ = ["SoftnicProcessGroup", "register", "BACKEND"]
