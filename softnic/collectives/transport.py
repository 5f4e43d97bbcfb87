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

The algorithms use two primitives.  ``exchange(sends, recvs)`` moves any
number of messages to and from any peers at once, copying or reducing (with a
numpy ufunc) each chunk into its destination as it arrives, and returns when
every send is posted and every receive consumed.  ``ring(sends, recvs)`` runs
the steps of a ring as one pipelined stream: a chunk is passed on to the right
as soon as the same chunk of the step before has come in from the left.
Messages between two ranks are matched by order, as on the wire.
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


class _Stream:
    """Messages to (or from) one peer, one after another: ``segs`` are uint8 views,
    each cut into chunks.  ``i``/``k``/``off``: the current segment, its next chunk and
    that chunk's byte offset.  A receive stream also has, per segment, the ufunc
    that reduces into it (None: copy) and the dtype it reduces in."""
    __slots__ = ("peer", "segs", "ops", "dtypes", "nch", "i", "k", "off", "gate")

    def __init__(self, peer, segs, nchunks, ops=None, dtypes=None, gate=None):
        self.peer, self.segs = peer, segs
        self.ops, self.dtypes = ops, dtypes
        self.nch = [nchunks(len(x)) for x in segs]
        self.i = self.k = self.off = 0
        self.gate = gate

    def done(self) -> bool:
        return self.i >= len(self.segs)

    def advance(self, n: int) -> None:
        self.k += 1
        self.off += n
        if self.k >= self.nch[self.i]:
            self.i += 1
            self.k = self.off = 0


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
            attr.timeout = int(os.environ.get("SOFTNIC_COLL_QP_TIMEOUT", 14))
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
        """Send each ``(peer, array)`` of ``sends`` and receive each ``(peer, dst, op)``
        of ``recvs`` (``dst`` a contiguous 1-D array; ``op`` a numpy ufunc reducing the
        incoming data into ``dst``, or None to copy), all at once."""
        ss = []
        for peer, data in sends:
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            ss.append(_Stream(peer, [data], self.nchunks))
        rs = [_Stream(peer, [dst.reshape(-1).view(np.uint8)], self.nchunks, [op], [dst.dtype])
              for peer, dst, op in recvs]
        self.run(ss, rs)

    def ring(self, sends, recvs) -> None:
        """Steps of a ring, pipelined chunk by chunk: step ``s`` sends ``sends[s]`` to the
        right neighbour and receives ``recvs[s] = (dst, op)`` from the left one.  What
        step ``s`` sends is what step ``s - 1`` received, so each of its chunks goes out
        as soon as the same chunk of the previous step has landed and been reduced,
        instead of waiting for the whole step (NCCL's pipelining)."""
        n = self.world
        right, left = (self.rank + 1) % n, (self.rank - 1) % n
        rs = _Stream(left, [d.reshape(-1).view(np.uint8) for d, _ in recvs], self.nchunks,
                     [op for _, op in recvs], [d.dtype for d, _ in recvs])

        def ready(i, k):
            return i == 0 or rs.i > i - 1 or (rs.i == i - 1 and rs.k > k)

        ss = _Stream(right, [np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in sends],
                     self.nchunks, gate=ready)
        if ss.nch[1:] != rs.nch[:-1]:
            raise ValueError("ring: step s must send what step s - 1 received")
        self.run([ss], [rs])

    def run(self, ss: list[_Stream], rs: list[_Stream]) -> None:
        """Drive send and receive streams until every send is posted and every receive
        consumed."""
        for st in ss + rs:
            if st.peer == self.rank or st.peer not in self.qps:
                raise ValueError(f"rank {self.rank}: no connection to rank {st.peer}")
        if len({st.peer for st in ss}) != len(ss) or len({st.peer for st in rs}) != len(rs):
            raise ValueError("one stream per peer and direction")
        ss = [st for st in ss if not st.done()]
        rs = [st for st in rs if not st.done()]
        last = time.monotonic()
        idle = 0
        checked = last
        while ss or rs:
            moved = False
            for st in ss:
                p = st.peer
                while (not st.done() and self.credits[p] and self.sq_out[p] < self.sq_depth - 1
                       and (st.gate is None or st.gate(st.i, st.k))):
                    self._post_chunk(st)
                    moved = True
            moved |= self._poll()
            for st in rs:
                p = st.peer
                while not st.done() and self.arrived[p] > self.consumed[p]:
                    self._consume(st)
                    moved = True
            ss = [st for st in ss if not st.done()]
            rs = [st for st in rs if not st.done()]
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
                self._check_peers([st.peer for st in ss + rs])
            if now - last > self.timeout:
                waiting = sorted({st.peer for st in ss + rs})
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

    def _post_chunk(self, st: _Stream) -> None:
        p = st.peer
        data = st.segs[st.i]
        n = min(self.chunk, len(data) - st.off)
        seq = self.send_seq[p]
        off = self._slot(p, seq)
        if n:
            self.send_mem[off:off + n] = data[st.off:st.off + n]
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
        st.advance(n)

    def _post_credit(self, p: int, n: int) -> None:
        wr = v.SendWR(wr_id=p, opcode=v.e.IBV_WR_SEND_WITH_IMM, num_sge=0,
                      imm_data=CREDIT_FLAG | n)
        self.qps[p].post_send(wr)
        self.sq_out[p] += 1
        self.owed[p] = 0

    def _consume(self, st: _Stream) -> None:
        p = st.peer
        seq = self.consumed[p]
        dst_seg = st.segs[st.i]
        n = min(self.chunk, len(dst_seg) - st.off)
        if n:
            off = self._slot(p, seq)
            src = self.recv_mem[off:off + n]
            dst = dst_seg[st.off:st.off + n]
            op = st.ops[st.i]
            if op is None:
                dst[:] = src
            else:
                dt = st.dtypes[st.i]
                d = dst.view(dt)
                op(d, src.view(dt), out=d)
        self.consumed[p] = seq + 1
        self.owed[p] += 1
        st.advance(n)

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
