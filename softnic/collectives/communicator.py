"""``Communicator``: the collectives on numpy arrays for one rank of a job."""

from __future__ import annotations

import numpy as np

from ..driver import env
from . import algorithms as alg
from .rendezvous import Rendezvous, from_env
from .transport import CollectiveError, Transport

OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
DTYPES = tuple(np.dtype(t) for t in (
    "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128"))
# allreduce up to this many bytes uses recursive doubling (fewest rounds): 64 KiB with 2
# ranks, 1 MiB with more, where the ring's 2(n-1) dependent steps cost more than the bytes
# recursive doubling adds (4 ranks, 256 KiB and 1 MiB: 0.47-0.77 of the ring's time)
SMALL_ALLREDUCE = {2: 64 * 1024, "more": 1 << 20}
if env.number("SOFTNIC_COLL_SMALL", None) is not None:
    SMALL_ALLREDUCE = dict.fromkeys(SMALL_ALLREDUCE, env.number("SOFTNIC_COLL_SMALL", None))
# with more than 2 ranks, allreduce up to this many bytes uses recursive halving and
# doubling (2 log2 n rounds, the ring's bytes), above it the ring (4 ranks, 4 MiB: 0.82-0.86
# of the ring's time; 16 MiB: 1.01-1.19); with 2 ranks the two move the same bytes, and the
# ring pipelines its second step behind its first
MID_ALLREDUCE = env.number("SOFTNIC_COLL_MID", 4 << 20)
# above this many bytes broadcast is a pipelined chain, below a binomial tree
SMALL_BROADCAST = env.number("SOFTNIC_COLL_SMALL_BCAST", 64 * 1024)


def _op(op):
    if callable(op) and op in OPS.values():
        return op
    try:
        return OPS[str(op).lower()]
    except KeyError:
        raise ValueError(f"unknown reduction {op!r}: one of {sorted(OPS)}") from None


def _check(a: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, not {type(a).__name__}")
    if a.dtype not in DTYPES:
        raise TypeError(f"{what}: dtype {a.dtype} is not supported "
                        f"({', '.join(str(d) for d in DTYPES)})")
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    if not a.flags.writeable:
        raise ValueError(f"{what} must be writeable")
    return a.reshape(-1)


class Communicator:
    """The ranks of one job, connected all-to-all by RC QPs.

    ``Communicator.from_env()`` reads RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT as torchrun and ``softnic launch`` set them.  Or pass ``rank``,
    ``world_size`` and a store (``set``/blocking ``get``) directly.
    """

    def __init__(self, rank: int, world_size: int, store, *, prefix: str = "softnic",
                 timeout: float = 60.0, rendezvous: Rendezvous | None = None,
                 transport: Transport | None = None, **transport_kw):
        """``transport``: a connected ``Transport`` (or subclass) of this rank to use
        instead of making one (the virtual-time driver passes its own)."""
        self.rank, self.world_size = rank, world_size
        self._rendezvous = rendezvous
        self._work: np.ndarray | None = None
        if transport is None:
            transport = Transport(rank, world_size, store, prefix, timeout=timeout,
                                  **transport_kw)
        elif (transport.rank, transport.world) != (rank, world_size):
            raise ValueError("the transport given is of another rank or world size")
        self.transport = transport

    @classmethod
    def from_env(cls, timeout: float | None = None, **kw) -> "Communicator":
        rdv = from_env(timeout=timeout)
        try:
            return cls(rdv.rank, rdv.world_size, rdv.store, timeout=rdv.timeout,
                       rendezvous=rdv, **kw)
        except BaseException:
            rdv.close()
            raise

    def close(self) -> None:
        self.transport.close()
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ collectives

    def allreduce(self, buf: np.ndarray, op="sum", algorithm: str | None = None) -> np.ndarray:
        """Reduce ``buf`` over all ranks, in place; returns ``buf``.
        ``algorithm``: ``ring``, ``rd`` (recursive doubling), ``hd`` (recursive halving
        then doubling), ``tree`` (binomial reduce and broadcast of the whole buffer),
        ``ptree`` (the same tree pipelined segment by segment) or None (by size and
        world: rd up to ``SOFTNIC_COLL_SMALL``; then, with more than 2 ranks, hd up to
        ``SOFTNIC_COLL_MID``; then ring)."""
        flat = _check(buf, "allreduce buffer")
        ufunc = _op(op)
        if algorithm is None:
            small = SMALL_ALLREDUCE[2 if self.world_size == 2 else "more"]
            algorithm = "rd" if flat.nbytes <= small else \
                "hd" if flat.nbytes <= MID_ALLREDUCE and self.world_size > 2 else "ring"
        if algorithm not in ("ring", "rd", "hd", "tree", "ptree"):
            raise ValueError(f"unknown allreduce algorithm {algorithm!r} (ring, rd, hd, tree, "
                             "ptree)")
        if self.world_size == 1:
            return buf
        self.transport.register(flat)
        if algorithm == "ring":
            alg.ring_allreduce(self.transport, flat, ufunc)
        elif algorithm == "rd":
            alg.recursive_doubling_allreduce(self.transport, flat, ufunc)
        elif algorithm == "hd":
            alg.halving_doubling_allreduce(self.transport, flat, ufunc)
        elif algorithm == "ptree":
            alg.pipelined_tree_allreduce(self.transport, flat, ufunc)
        else:
            alg.tree_allreduce(self.transport, flat, ufunc)
        return buf

    def broadcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        flat = _check(buf, "broadcast buffer")
        self._root(root)
        if self.world_size > 1:
            self.transport.register(flat)
            if flat.nbytes > SMALL_BROADCAST and self.world_size > 2:
                alg.chain_broadcast(self.transport, flat, root)
            else:
                alg.binomial_broadcast(self.transport, flat, root)
        return buf

    def allgather(self, send: np.ndarray, recv: np.ndarray | None = None) -> np.ndarray:
        """Every rank's ``send`` side by side in ``recv`` (``world_size * send.size``)."""
        s = _check(send, "allgather input")
        if recv is None:
            recv = np.empty((self.world_size,) + send.shape, send.dtype)
        r = _check(recv, "allgather output")
        self._sizes(r, s, self.world_size, "allgather output")
        n = s.size
        r[self.rank * n:(self.rank + 1) * n] = s
        if self.world_size > 1:
            self.transport.register(r)
            bounds = [(i * n, (i + 1) * n) for i in range(self.world_size)]
            alg.ring_allgather(self.transport, r, bounds)
        return recv

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray | None = None,
                       op="sum") -> np.ndarray:
        """Block ``rank`` of the reduction of every rank's ``send`` (``world_size`` equal
        blocks) into ``recv``."""
        s = _check(send, "reduce_scatter input")
        ufunc = _op(op)
        if s.size % self.world_size:
            raise ValueError(f"reduce_scatter input of {s.size} elements does not split into "
                             f"{self.world_size} equal blocks")
        n = s.size // self.world_size
        if recv is None:
            recv = np.empty(n, send.dtype)
        r = _check(recv, "reduce_scatter output")
        self._sizes(s, r, self.world_size, "reduce_scatter input")
        work = self._scratch(s)
        if self.world_size > 1:
            self.transport.register(work)
            bounds = [(i * n, (i + 1) * n) for i in range(self.world_size)]
            alg.ring_reduce_scatter(self.transport, work, ufunc, bounds)
        r[:] = work[self.rank * n:(self.rank + 1) * n]
        return recv

    def alltoall(self, send: np.ndarray, recv: np.ndarray | None = None) -> np.ndarray:
        """Block ``j`` of ``send`` goes to rank ``j``; block ``i`` of ``recv`` came from
        rank ``i``."""
        s = _check(send, "alltoall input")
        if s.size % self.world_size:
            raise ValueError(f"alltoall input of {s.size} elements does not split into "
                             f"{self.world_size} equal blocks")
        if recv is None:
            recv = np.empty_like(send)
        r = _check(recv, "alltoall output")
        self._sizes(r, s, 1, "alltoall output")
        alg.alltoall(self.transport, s, r)
        return recv

    def barrier(self) -> None:
        if self.world_size > 1:
            alg.dissemination_barrier(self.transport)

    def _scratch(self, like: np.ndarray) -> np.ndarray:
        """A copy of ``like`` in a buffer kept between calls (so its registration is too)."""
        need = like.nbytes
        if self._work is None or self._work.nbytes < need:
            self._work = np.empty(max(need, 64), np.uint8)
        w = self._work[:need].view(like.dtype)
        w[:] = like
        return w

    # ------------------------------------------------------------------ checks

    def _root(self, root: int) -> None:
        if not 0 <= root < self.world_size:
            raise ValueError(f"root {root} outside 0..{self.world_size - 1}")

    @staticmethod
    def _sizes(big, small, factor, what) -> None:
        if big.dtype != small.dtype:
            raise TypeError(f"{what}: dtype {big.dtype} differs from {small.dtype}")
        if big.size != small.size * factor:
            raise ValueError(f"{what} has {big.size} elements, needs {small.size * factor}")


__all__ = ["Communicator", "CollectiveError", "OPS", "DTYPES"]
