"""Shared receive queue, with the limit event of ibv_modify_srq."""

from __future__ import annotations

from collections import deque

from .errors import einval, enomem


class RecvWQE:
    __slots__ = ("wr_id", "sges", "length")

    def __init__(self, wr_id: int, sges: list[tuple[int, int, int]]):
        self.wr_id = wr_id
        self.sges = sges              # (addr, length, lkey); checked when used, as hardware does
        # (a lone SGE's length without a generator's frame: a receive is posted per message)
        self.length = sges[0][1] if len(sges) == 1 else sum(s[1] for s in sges)


class SRQ:
    def __init__(self, handle: int, pd, max_wr: int, max_sge: int, srq_limit: int = 0,
                 on_limit=None):
        if max_wr <= 0 or max_sge <= 0:
            raise einval("SRQ max_wr and max_sge must be positive")
        self.handle = handle
        self.pd = pd
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.srq_limit = srq_limit
        self.queue: deque[RecvWQE] = deque()
        self._on_limit = on_limit
        self.closed = False

    def post(self, wqe: RecvWQE) -> None:
        if len(wqe.sges) > self.max_sge:
            raise einval(f"{len(wqe.sges)} SGEs > max_sge {self.max_sge}")
        if len(self.queue) >= self.max_wr:
            raise enomem("SRQ is full")
        self.queue.append(wqe)

    def take(self) -> RecvWQE | None:
        if not self.queue:
            return None
        wqe = self.queue.popleft()
        # The limit event fires once when the level drops below the limit; the
        # limit is then disarmed until the consumer sets it again (IBA 10.2.9.3).
        if self.srq_limit and len(self.queue) < self.srq_limit:
            self.srq_limit = 0
            if self._on_limit is not None:
                self._on_limit(self)
        return wqe

    def modify(self, *, max_wr: int | None = None, srq_limit: int | None = None) -> None:
        if max_wr is not None:
            if max_wr < len(self.queue):
                raise einval("max_wr below the posted count")
            self.max_wr = max_wr
        if srq_limit is not None:
            if srq_limit > self.max_wr:
                raise einval("srq_limit above max_wr")
            self.srq_limit = srq_limit
