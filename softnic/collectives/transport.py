"""Point-to-point channels between ranks over RC QPs, built the way NCCL's IB transport is.

Every pair of ranks shares one RC QP.  Each rank registers one receive region
holding, for every peer, a ring of ``slots`` chunks of ``chunk`` bytes, and a
send region of the same shape where outgoing chunks are staged.  A chunk goes
out as one RDMA WRITE_WITH_IMM straight into the next slot of the peer's ring;
the immediate carries the message's sequence number, and the receive
completion tells the peer it has landed.  A sender holds one credit per free
slot of the peer's ring and never writes without one; the receiver returns
credits (a zero-length SEND_WITH_IMM whose immediate has the top bit set and
the count below) once it has consumed the chunks, so a fast sender can never
overrun a slow receiver, and chunks flow in a pipeline ``slots`` deep.

``exchange(sends, recvs)`` is the one primitive the algorithms use: it moves
any number of messages to and from any peers at once, copying or reducing
(with a numpy ufunc) each chunk into its destination as it arrives, and
returns when every send is posted and every receive consumed.  Messages
between two ranks are matched by order, as on the wire.
"""

from __future__ import annotations

import ctypes
import json
import os
import time

import numpy as np

from . import _verbs as v

CREDIT_FLAG = 0x80000000
SEQ_MASK = 0x7FFFFFFF
DEFAULT_CHUNK = 64 * 1024
DEFAULT_SLOTS = 8
SPIN = float(os.environ.get("SOFTNIC_COLL_SPIN", 2e-4))    # busy-poll this long before napping
ACCESS = v.e.IBV_ACCESS_LOCAL_WRITE | v.e.IBV_ACCESS_REMOTE_WRITE


class CollectiveError(RuntimeError):
    """A collective could not complete: a peer died, never answered, or a QP failed."""


def _u8_view(addr: int, length: int) -> np.ndarray:
    if length == 0:
        return np.zeros(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(addr))


class _Send:
    __slots__ = ("peer", "data", "off", "left")

    def __init__(self, peer, data, chunks):
        self.peer, self.data = peer, data
        self.off = 0
        self.left = chunks


class _Recv:
    __slots__ = ("peer", "dst", "op", "dtype", "off", "left")

    def __init__(self, peer, dst, op, dtype):
        self.peer, self.dst, self.op, self.dtype = peer, dst, op, dtype
        self.off = 0
        self.left = 0


class Transport:
    """The full mesh of RC connections of one rank, set up through ``store``.

    ``store`` needs ``set(key, bytes)`` and a blocking ``get(key) -> bytes``
    (softnic's StoreClient or a torch.distributed Store).
    """

    def __init__(self, rank: int, world: int, store, prefix: str = "softnic", *,
                 device: str | None = None, chunk: int | None = None,
                 slots: int | None = None, timeout: float = 60.0):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside 0..{world - 1}")
        self.rank, self.world, self.store, self.prefix = rank, world, store, prefix
        self.timeout = timeout
        self.chunk = int(chunk or os.environ.get("SOFTNIC_COLL_CHUNK", DEFAULT_CHUNK))
        self.slots = int(slots or os.environ.get("SOFTNIC_COLL_SLOTS", DEFAULT_SLOTS))
        if self.chunk <= 0 or self.chunk % 64:
            raise ValueError(f"chunk size {self.chunk} must be a positive multiple of 64")
        if self.slots < 1:
            raise ValueError("need at least one slot per peer")
        self.credit_batch = max(1, self.slots // 2)
        names = [d.name.decode() if isinstance(d.name, bytes) else d.name
                 for d in v.get_device_list()]
        if not names:
            raise CollectiveError("no RDMA device")
        self.device = device or names[0]
        self.ctx = v.Context(name=self.device)
        self.pd = v.PD(self.ctx)
        peers = [p for p in range(world) if p != rank]
        self.sq_depth = self.slots + 4              # data chunks plus credit returns
        self.rq_depth = 2 * self.slots + 4          # data chunks plus credit messages
        self.cq = v.CQ(self.ctx, max(1, len(peers)) * (self.sq_depth + self.rq_depth) + 16)
        region = max(1, world * self.slots * self.chunk)
        self.recv_mr = v.MR(self.pd, region, ACCESS)
        self.send_mr = v.MR(self.pd, region, v.e.IBV_ACCESS_LOCAL_WRITE)
        self.recv_mem = _u8_view(self.recv_mr.buf, region)
        self.send_mem = _u8_view(self.send_mr.buf, region)
        self.qps: dict[int, object] = {}
        self.qp_peer: dict[int, int] = {}
        for p in peers:
            cap = v.QPCap(max_send_wr=self.sq_depth, max_recv_wr=self.rq_depth,
                          max_send_sge=1, max_recv_sge=1)
            qp = v.QP(self.pd, v.QPInitAttr(qp_type=v.e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                            cap=cap, sq_sig_all=1))
            self.qps[p] = qp
            self.qp_peer[qp.qp_num] = p
        # per-peer flow state
        self.send_seq = dict.fromkeys(peers, 0)      # data chunks posted to the peer
        self.credits = dict.fromkeys(peers, self.slots)
        self.sq_out = dict.fromkeys(peers, 0)        # send WRs not yet completed
        self.arrived = dict.fromkeys(peers, 0)       # data chunks landed from the peer
        self.consumed = dict.fromkeys(peers, 0)      # of those, taken by a receive
        self.owed = dict.fromkeys(peers, 0)          # credits to return to the peer
        self._connect(peers)

    # ------------------------------------------------------------------ setup

    def _slot(self, peer: int, seq: int) -> int:
        return (peer * self.slots + seq % self.slots) * self.chunk

    def _connect(self, peers: list[int]) -> None:
        gid = self.ctx.query_gid(1, 0)
        psns = {p: int.from_bytes(os.urandom(3), "little") for p in peers}
        me = {"gid": str(gid), "rkey": self.recv_mr.rkey, "addr": self.recv_mr.buf,
              "qpn": {str(p): self.qps[p].qp_num for p in peers},
              "psn": {str(p): psns[p] for p in peers}}
        self.store.set(f"{self.prefix}/conn/{self.rank}", json.dumps(me).encode())
        self.remote: dict[int, dict] = {}
        for p in peers:
            self.remote[p] = json.loads(self._get(f"{self.prefix}/conn/{p}", p))
        for p in peers:
            r = self.remote[p]
            qp = self.qps[p]
            attr = v.QPAttr(qp_state=v.e.IBV_QPS_INIT, cur_qp_state=v.e.IBV_QPS_RESET)
            attr.qp_access_flags = ACCESS
            attr.port_num = 1
            qp.to_init(attr)
            for _ in range(self.rq_depth):
                qp.post_recv(v.RecvWR(wr_id=p, num_sge=0))
            attr.path_mtu = v.e.IBV_MTU_4096
            attr.dest_qp_num = r["qpn"][str(self.rank)]
            attr.rq_psn = r["psn"][str(self.rank)]
            attr.max_dest_rd_atomic = 1
            attr.min_rnr_timer = 1
            attr.ah_attr = v.AHAttr(is_global=1, port_num=1,
                                    gr=v.GlobalRoute(dgid=v.GID(r["gid"]), sgid_index=0))
            qp.to_rtr(attr)
            attr.sq_psn = psns[p]
            attr.timeout = int(os.environ.get("SOFTNIC_COLL_QP_TIMEOUT", 12))
            attr.retry_cnt = 7
            attr.rnr_retry = 7
            attr.max_rd_atomic = 1
            qp.to_rts(attr)
        # nobody writes before every peer's QPs are ready to receive
        self.store.set(f"{self.prefix}/ready/{self.rank}", b"1")
        for p in peers:
            self._get(f"{self.prefix}/ready/{p}", p)

    def _get(self, key: str, peer: int) -> bytes:
        try:
            return self.store.get(key)
        except Exception as ex:          # a timeout of whichever store we were given
            if type(ex).__name__ == "RankFailure":
                raise CollectiveError(str(ex)) from None
            raise CollectiveError(f"rank {self.rank}: rank {peer} of {self.world} did not "
                                  f"arrive at the rendezvous ({ex})") from None

    def drain(self, timeout: float = 10.0) -> None:
        """Wait until every chunk and credit this rank posted is acknowledged, so that
        closing the device (or exiting) loses nothing a peer still needs."""
        deadline = time.monotonic() + timeout
        while any(self.sq_out.values()) and time.monotonic() < deadline:
            if not self._poll():
                time.sleep(1e-4)

    def close(self) -> None:
        """Drain, then wait (through the store) until every rank has drained before
        destroying the QPs: a peer must still be there to acknowledge what we sent last."""
        if self.qps:
            try:
                self.drain()
                self.store.set(f"{self.prefix}/drained/{self.rank}", b"1")
                for p in self.qps:
                    self.store.get(f"{self.prefix}/drained/{p}")
            except Exception:           # a peer already gone: nothing left to protect
                pass
        for obj in list(self.qps.values()) + [self.recv_mr, self.send_mr, self.cq, self.pd,
                                              self.ctx]:
            try:
                obj.close()
            except v.PyverbsError:
                pass
        self.qps = {}

    # ------------------------------------------------------------------ data path

    def nchunks(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.chunk))

    def exchange(self, sends=(), recvs=()) -> None:
        """Send each ``(peer, uint8 array)`` of ``sends`` and receive each
        ``(peer, dst, op)`` of ``recvs`` (``dst`` a contiguous 1-D array; ``op`` a
        numpy ufunc reducing the incoming data into ``dst``, or None to copy)."""
        ss = []
        for peer, data in sends:
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            if peer == self.rank:
                raise ValueError("exchange: a rank does not send to itself")
            ss.append(_Send(peer, data, self.nchunks(len(data))))
        rs = []
        for peer, dst, op in recvs:
            if peer == self.rank:
                raise ValueError("exchange: a rank does not receive from itself")
            r = _Recv(peer, dst.reshape(-1).view(np.uint8), op, dst.dtype)
            r.left = self.nchunks(r.dst.nbytes)
            rs.append(r)
        if len({s.peer for s in ss}) != len(ss) or len({r.peer for r in rs}) != len(rs):
            raise ValueError("exchange: one message per peer and direction")
        last = time.monotonic()
        idle = 0
        checked = last
        while ss or rs:
            moved = False
            for s in ss:
                while s.left and self.credits[s.peer] and self.sq_out[s.peer] < self.sq_depth - 1:
                    self._post_chunk(s)
                    moved = True
            ss = [s for s in ss if s.left]
            moved |= self._poll()
            for r in rs:
                p = r.peer
                while r.left and self.arrived[p] > self.consumed[p]:
                    self._consume(r)
                    moved = True
            rs = [r for r in rs if r.left]
            # credits go back in batches, or whenever this rank has nothing else to do
            # (so a sender never waits on credits a receiver sits on)
            for p, n in self.owed.items():
                if n and (n >= self.credit_batch or not moved) and self.sq_out[p] < self.sq_depth:
                    self._post_credit(p, n)
            if moved:
                last = time.monotonic()
                idle = 0
                continue
            idle += 1
            now = time.monotonic()
            if now - last > SPIN:
                # idle for a while: let the other processes on this core (and this
                # device's progress thread) run
                time.sleep(min(0.001, 2e-5 * idle))
            if now - checked > 1.0:
                checked = now
                self._check_peers([s.peer for s in ss] + [r.peer for r in rs])
            if now - last > self.timeout:
                waiting = sorted({r.peer for r in rs} | {s.peer for s in ss})
                raise CollectiveError(
                    f"rank {self.rank}: no progress for {self.timeout:g} s waiting on rank(s) "
                    f"{waiting} (dead, hung, or not in the same collective)")

    def _check_peers(self, peers) -> None:
        failed = getattr(self.store, "failed_ranks", None)
        if failed is None:
            return
        dead = failed()
        if dead:
            raise CollectiveError(f"rank {self.rank}: rank(s) {dead} left the job "
                                  f"(process died or exited early); waiting on "
                                  f"{sorted(set(peers))}")

    def _post_chunk(self, s: _Send) -> None:
        p = s.peer
        n = min(self.chunk, len(s.data) - s.off)
        seq = self.send_seq[p]
        off = self._slot(p, seq)
        if n:
            self.send_mem[off:off + n] = s.data[s.off:s.off + n]
        wr = v.SendWR(wr_id=p, opcode=v.e.IBV_WR_RDMA_WRITE_WITH_IMM,
                      num_sge=1 if n else 0,
                      sg=[v.SGE(self.send_mr.buf + off, n, self.send_mr.lkey)] if n else None,
                      imm_data=seq & SEQ_MASK)
        r = self.remote[p]
        wr.set_wr_rdma(r["rkey"], r["addr"] + self._slot(self.rank, seq))
        self.qps[p].post_send(wr)
        self.send_seq[p] = seq + 1
        self.credits[p] -= 1
        self.sq_out[p] += 1
        s.off += n
        s.left -= 1

    def _post_credit(self, p: int, n: int) -> None:
        wr = v.SendWR(wr_id=p, opcode=v.e.IBV_WR_SEND_WITH_IMM, num_sge=0,
                      imm_data=CREDIT_FLAG | n)
        self.qps[p].post_send(wr)
        self.sq_out[p] += 1
        self.owed[p] = 0

    def _consume(self, r: _Recv) -> None:
        p = r.peer
        seq = self.consumed[p]
        n = min(self.chunk, r.dst.nbytes - r.off)
        if n:
            off = self._slot(p, seq)
            src = self.recv_mem[off:off + n]
            dst = r.dst[r.off:r.off + n]
            if r.op is None:
                dst[:] = src
            else:
                d = dst.view(r.dtype)
                r.op(d, src.view(r.dtype), out=d)
        self.consumed[p] = seq + 1
        self.owed[p] += 1
        r.off += n
        r.left -= 1

    def _poll(self) -> bool:
        moved = False
        while True:
            n, wcs = self.cq.poll(32)
            if not n:
                return moved
            moved = True
            for wc in wcs:
                if wc.status != v.e.IBV_WC_SUCCESS:
                    p = self.qp_peer.get(wc.qp_num, wc.wr_id)
                    raise CollectiveError(
                        f"rank {self.rank}: work completion with status {wc.status} on the "
                        f"connection to rank {p} (opcode {wc.opcode}); the peer is probably "
                        f"gone")
                p = self.qp_peer[wc.qp_num]
                if wc.opcode & v.e.IBV_WC_RECV:
                    imm = wc.imm_data
                    self.qps[p].post_recv(v.RecvWR(wr_id=p, num_sge=0))
                    if imm & CREDIT_FLAG:
                        self.credits[p] += imm & SEQ_MASK
                    else:
                        if imm != self.arrived[p] & SEQ_MASK:
                            raise CollectiveError(f"rank {self.rank}: chunk {imm} from rank {p} "
                                                  f"out of order (expected {self.arrived[p]})")
                        self.arrived[p] += 1
                else:
                    self.sq_out[p] -= 1
