"""Rendezvous from the environment torchrun sets: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.

Rank 0 serves the store (``softnic.collectives.store``) on MASTER_ADDR:MASTER_PORT
and every rank connects to it; the ranks then publish their QP numbers,
PSNs, GIDs and rkeys there (see ``Transport``).  ``SOFTNIC_COLL_TIMEOUT``
(seconds, default 60) bounds every wait: a rank that never arrives or stops
answering is an error naming it, not a hang.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .store import StoreClient, StoreError, StoreServer

DEFAULT_TIMEOUT = 60.0


@dataclass
class Rendezvous:
    rank: int
    world_size: int
    store: StoreClient
    server: StoreServer | None
    timeout: float

    def close(self) -> None:
        """Leave the job.  Rank 0 keeps serving the store until every rank has left
        (or the timeout passes), so no rank loses the store while still using it."""
        try:
            self.store.add("softnic/left", 1)
            deadline = time.monotonic() + self.timeout
            while (self.server is not None and self.store.add("softnic/left", 0) < self.world_size
                   and time.monotonic() < deadline and not self.store.failed_ranks()):
                time.sleep(0.01)
        except StoreError:
            pass
        self.store.close()
        if self.server is not None:
            self.server.close()


def _int_env(env, name: str) -> int:
    raw = env.get(name)
    if raw is None:
        raise RuntimeError(f"{name} is not set: start the ranks with 'softnic launch -n N "
                           f"prog.py' or torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR and "
                           f"MASTER_PORT")
    try:
        return int(raw)
    except ValueError:
        raise RuntimeError(f"{name}={raw!r} is not an integer") from None


def from_env(environ=None, timeout: float | None = None) -> Rendezvous:
    env = os.environ if environ is None else environ
    rank, world = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE")
    if world < 1 or not 0 <= rank < world:
        raise RuntimeError(f"RANK={rank} outside 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
    addr = env.get("MASTER_ADDR", "127.0.0.1")
    port = _int_env(env, "MASTER_PORT")
    if timeout is None:
        timeout = float(env.get("SOFTNIC_COLL_TIMEOUT", DEFAULT_TIMEOUT))
    server = StoreServer(addr, port) if rank == 0 else None
    try:
        store = StoreClient(addr, port, rank, timeout=timeout)
    except BaseException:
        if server is not None:
            server.close()
        raise
    return Rendezvous(rank, world, store, server, timeout)
