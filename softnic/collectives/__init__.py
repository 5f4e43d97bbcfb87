"""Collectives over verbs: allreduce, allgather, reduce-scatter, broadcast, alltoall, barrier.

Written against the pyverbs API only (see ``_verbs``), in the manner of NCCL's
IB transport: registered buffers, RDMA WRITE_WITH_IMM into the peer's ring of
slots, credits, chunked pipelining.  Start the ranks with ``softnic launch -n N
prog.py`` (or torchrun) and build a :class:`Communicator` from the environment::

    from softnic.collectives import Communicator
    comm = Communicator.from_env()
    comm.allreduce(grads, op="sum")
"""

from .communicator import DTYPES, OPS, Communicator
from .store import RankFailure, StoreClient, StoreError, StoreServer
from .transport import CollectiveError

__all__ = ["Communicator", "CollectiveError", "OPS", "DTYPES", "StoreClient", "StoreServer",
           "StoreError", "RankFailure"]
