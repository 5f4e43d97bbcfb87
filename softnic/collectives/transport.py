"""Point-to-point channels between ranks over RC QPs, built the way NCCL's IB transport is.

Every pair of ranks shares ``qps`` RC QPs (``SOFTNIC_COLL_QPS``), each sending
from its own UDP source port (the GRH flow label, from which RoCEv2 derives
the port) so that a multipath fabric can spread them.  Each rank registers one
receive region holding, for every peer, a ring of ``slots`` chunks of
``chunk`` bytes.  A chunk goes out as one RDMA WRITE_WITH_IMM straight into
the next slot of the peer's ring, chunk ``s`` of a peer on its QP ``s mod
qps`` (NCCL's ``NCCL_IB_QPS_PER_CONNECTION`` striping); the immediate carries
the chunk's sequence number, and the receive completion tells the peer it has
landed, whichever QP it came on: chunks are taken in sequence order.  A
sender holds one credit per free slot of the peer's ring and never writes
without one; the receiver returns credits once it has consumed the chunks,
in the immediate of its own next chunk to that peer (7 bits beside the 24-bit
sequence number) or, when half the ring is owed (in virtual time and under
admission also whenever it has nothing else to do: ``idle_credits``), in a
zero-length SEND_WITH_IMM whose immediate has the top bit set and the count
below.  So a fast sender can never overrun a slow receiver, chunks flow
in a pipeline ``slots`` deep, and a small collective costs one message each
way, not two.

A message is cut into chunks of about a quarter of it, at least ``min_chunk``
and at most a slot: on softnic's live devices ``min_chunk`` is the slot (a
message up to a slot goes as one chunk, since each chunk costs CPU time of its
own), in virtual time 64 KiB (so that mid-size messages pipeline).  Sends of
1 MiB and more (``SOFTNIC_COLL_ZCOPY``) leave from the caller's own memory: the
buffer is registered once and the registration cached (``register``), so a
chunk costs one WRITE and no copy; a collective returns only when those WRITEs are
acknowledged, since the caller may then change the buffer.  Sends below 1 MiB
are copied into a registered staging ring instead, which costs less than
waiting for those acknowledgements.  Receives of 1 MiB and more whose data is
copied, not reduced (``SOFTNIC_COLL_DIRECT``), land in the caller's own
registered memory: the receiver sends a descriptor per such message (where it
goes, or "into the ring"), the sender writes its chunks there, and they skip
the copy out of the ring; they take sequence numbers and credits as any chunk.

The algorithms use two primitives.  ``exchange(sends, recvs)`` moves any
number of messages to and from any peers at once, copying or reducing (with a
numpy ufunc) each chunk into its destination as it arrives, and returns when
every send is posted and every receive consumed.  ``ring(sends, recvs)`` runs
the steps of a ring as one pipelined stream: a chunk is passed on to the right
as soon as the same chunk of the step before has come in from the left.
Messages between two ranks are matched by order, as on the wire.

Receiver-driven admission (``admit``, ``SOFTNIC_COLL_ADMIT``; off by default), as
the NCCL change in Meta's RoCE paper (SIGCOMM 2024) does it: a sender starts with no
credits, and a receiver grants them (its clear-to-send, a credit return) to at most
``admit`` of the peers it is receiving from at once, each for that message's chunks
only, in the order ``rank - 1, rank - 2, ...`` (so that the receivers of an alltoall
admit different senders first).  Every rank of a job must use the same setting.

How a rank waits is three methods (``_started``, ``_progressed``, ``_idle``) and
``drain``: in real time it polls, then naps, and gives up after ``timeout``; the
virtual-time driver (``softnic.collectives.virtual``) replaces them so that ranks
run as cooperative tasks on a simulated fabric, with the same algorithms and the
same data path.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import time
import zlib
from collections import OrderedDict

import numpy as np

from ..driver import env
from . import _verbs as v

CREDIT_FLAG = 0x80000000            # immediate of a credit return: the flag, the count below
DESC_FLAG = 0x40000000              # ... with this bit too: a receive's descriptor, its index below
SEQ_MASK = 0xFFFFFF                  # immediate of a chunk: its sequence number (24 bits)...
PIGGY_SHIFT, PIGGY_MAX = 24, 0x7F    # ... and credits returned with it (7 bits)
DEFAULT_CHUNK = 1 << 20             # the largest chunk, the size of a receive slot
PIPELINE = 4                        # messages are cut into this many chunks, none smaller
# than the smallest chunk (``min_chunk``).  On a live device each chunk costs a post, a
# completion and a consumption, each a pass through Python, which outweighs what cutting
# a message up to a slot overlaps: there the smallest chunk is the slot.  In virtual time a
# chunk costs nothing of its own and pipelining is what the fabric's hops see (the
# experiments keep 64 KiB); on a real device set SOFTNIC_COLL_MIN_CHUNK alike.  Figures:
# docs/collectives.md, "The smallest chunk".
MIN_CHUNK = env.number("SOFTNIC_COLL_MIN_CHUNK", DEFAULT_CHUNK)
DEFAULT_SLOTS = 8
DEFAULT_QPS = 4
# sends this big leave from the caller's memory; smaller ones are copied into a staging ring
# (a copy costs less than waiting, at the end of the call, for the WRITEs' acknowledgements:
# tools/coll_qps.py --zcopy)
ZC_MIN = env.number("SOFTNIC_COLL_ZCOPY", 1 << 20)
MR_CACHE = 16                         # registrations of callers' buffers kept
# Receives this big whose data is copied (a broadcast's, an allgather's; not a reduction's)
# land in the caller's own memory: the receiver registers it and tells the sender where, so
# a chunk costs no copy out of the receive ring.  0: every receive through the ring.
# Figures: docs/collectives.md, "Direct receives".
DIRECT_MIN = env.number("SOFTNIC_COLL_DIRECT", 1 << 20)
DESC_LEN = 16      # a descriptor: address (8 bytes), rkey (4), its number with bit 31: direct (4)
# Each QP's window (packets sent and not yet acknowledged) on softnic's devices, above
# the engine's 128 (rxe's RXE_MAX_UNACKED_PSNS).  The window must cover a chunk's worth of
# the ACK round trip between two Python processes, or the window, not the path, paces a
# stream (a 1 MiB chunk is 256 packets); and the bytes in flight to a peer, QPS * WINDOW
# packets (4 * 384: 6 MiB), must stay below what the receiving socket holds (4 MiB asked,
# which the kernel doubles), or the overflow costs go-back-N resends of a window.
# Figures: docs/collectives.md, "Each QP's window".
WINDOW = env.number("SOFTNIC_COLL_WINDOW", 384)
# An idle rank polls for SPIN seconds, then naps between polls, up to NAP at a time.  With
# a core per rank, polling keeps the device moving (its progress thread stands aside
# while a caller polls); with more ranks than cores, polling takes the core a peer needs.
SPIN_NAP = {"free": (1e-3, 1e-4), "oversubscribed": (2e-4, 1e-3)}
# On softnic's own devices an idle rank instead sleeps on its device until a completion
# reaches its CQ (``CQ.wait``), its thread moving the device as the progress thread
# does: every datagram waiting per step, not the one run a spinning poll takes, and
# its CPU free for the peer meanwhile.  0: spin and nap as above.  Figures:
# docs/collectives.md, "How a rank waits".
WAIT = os.environ.get("SOFTNIC_COLL_WAIT", "1") != "0"
WAIT_SLICE = 0.05                     # seconds per wait, between checks of the peers
# ... but a call whose receives add up to WAIT_SPIN_MAX bytes or less first polls for
# WAIT_SPIN_US after its last progress (with a core per rank): waking a sleeping thread
# costs its peer's send a wake-up too, and a small collective is mostly such waits; a
# larger call spins on the CPU its peer works on, hence the limit.  Figures:
# docs/collectives.md, "A short spin before sleeping".
WAIT_SPIN_US = 50
WAIT_SPIN_MAX = 64 << 10
ACCESS = v.e.IBV_ACCESS_LOCAL_WRITE | v.e.IBV_ACCESS_REMOTE_WRITE
_ZC = 1 << 40                         # wr_id flag: a WRITE from a caller's buffer


class CollectiveError(RuntimeError):
    """A collective could not complete: a peer died, never answered, or a QP failed."""


def _u8_view(addr: int, length: int) -> np.ndarray:
    if length == 0:
        return np.zeros(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(addr))


@functools.lru_cache(maxsize=1 << 16)
def _record(raw: bytes) -> dict:
    """A peer's connection record, decoded (read, never changed: every rank of a
    process reading the same record - a virtual cluster's - shares one decode).
    Each rank reads the records in rank order, so a cache smaller than the ranks
    of a job would miss on every read (least recently used goes first): this one
    holds 65 536."""
    return json.loads(raw)


def flow_label(rank: int, peer: int, q: int) -> int:
    """The GRH flow label of ``rank``'s QP ``q`` to ``peer``: non-zero, 14 bits (so the
    RoCEv2 UDP source port is ``0xC000 | label``, see ``softnic.core.entropy``), and
    different for each QP of a pair."""
    h = zlib.crc32(f"{min(rank, peer)}/{max(rank, peer)}".encode()) & 0x3FFF
    return ((h + q * 0x9E5 + (rank > peer) * 0x1A3) % 0x3FFF) + 1


def _flat(x: np.ndarray) -> np.ndarray:
    """``x``'s bytes, a flat uint8 view (of a contiguous copy, if ``x`` is not
    contiguous: a receive's destination must be)."""
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


class _Flat(dict):
    """``_flat`` for one call, one view per array however often the call names
    it: a ring's 2 (n - 1) steps name its n blocks four times each (sent, and
    received, in each half), and a view per naming made n^2 objects across a
    virtual cluster's ranks (docs/results/cluster.md).  Keyed by the array's
    id, so it lives no longer than the call, whose arguments hold the arrays."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        v = self.get(id(x))
        if v is None:
            v = self[id(x)] = _flat(x)
        return v


class _Stream:
    """Messages to (or from) one peer, one after another: ``segs`` are uint8 views,
    each cut into chunks.  ``i``/``k``/``off``: the current segment, its next chunk and
    that chunk's byte offset.  A send stream has, per segment, the lkey of a
    registration holding it (None: stage a copy); a receive stream the ufunc that
    reduces into it (None: copy) and the dtype it reduces in.  ``direct``, per
    segment: for a send, None while the receiver's descriptor of a large one is
    awaited, then ``(addr, rkey)`` where it lands in the receiver's own memory or
    False for its ring; for a receive, whether it lands in ``segs`` itself (None:
    no segment does)."""
    __slots__ = ("peer", "segs", "nseg", "ops", "dtypes", "nch", "csz", "i", "k", "off",
                 "gate", "lkeys", "end", "direct")

    def __init__(self, peer, segs, csize, ops=None, dtypes=None, gate=None, lkeys=None):
        self.peer, self.segs = peer, segs
        self.nseg = len(segs)       # done when ``i`` reaches it
        self.ops, self.dtypes = ops, dtypes
        self.csz = [csize(len(x)) for x in segs]
        self.nch = [max(1, -(-len(x) // c)) for x, c in zip(segs, self.csz)]
        self.i = self.k = self.off = 0
        self.gate = gate
        self.lkeys = lkeys
        self.end = None         # admission: the peer's sequence number after this message
        self.direct = None

    def done(self) -> bool:
        return self.i >= self.nseg

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

    #: the QPs' window (``WINDOW``) where the verbs have ``QP.set_window``; None: the
    #: device's own
    window: int | None = WINDOW
    #: the smallest chunk a message is cut into (``MIN_CHUNK``), where the argument does not say
    min_chunk_default: int = MIN_CHUNK
    #: the smallest receive that lands in the caller's memory (``DIRECT_MIN``; 0: none)
    direct_default: int = DIRECT_MIN

    #: make the QPs to a peer, and connect them, when a collective first sends to it or
    #: receives from it (as NCCL's runtime connection does), not to every peer at once:
    #: a ring then holds QPs to its two neighbours only.  The connection records are
    #: still exchanged with every peer at start (settings checked, one barrier).
    connect_on_use = False

    #: return credits owed to a peer whenever this rank has nothing else to do, not
    #: only in batches of half the ring.  Off on live devices: each such return is a
    #: SEND and its ACK, CPU time of both ranks, and with small messages it doubles the
    #: packets per message; a sender never needs them to go on, since with none left
    #: every slot is in flight or owed (docs/collectives.md, "Credits go back in batches").
    idle_credits = False

    def __init__(self, rank: int, world: int, store, prefix: str = "softnic", *,
                 device: str | None = None, chunk: int | None = None,
                 slots: int | None = None, qps: int | None = None, zcopy: int | None = None,
                 admit: int | None = None, qp_timeout: int | None = None,
                 min_chunk: int | None = None, direct: int | None = None,
                 timeout: float = 60.0):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside 0..{world - 1}")
        self.rank, self.world, self.store, self.prefix = rank, world, store, prefix
        self.closed = False
        self.timeout = timeout
        self._settings(chunk, slots, qps, admit, qp_timeout, min_chunk, direct)
        over = env.number("LOCAL_WORLD_SIZE", world) > (os.cpu_count() or 1)
        spin, nap = SPIN_NAP["oversubscribed" if over else "free"]
        self.spin = env.number("SOFTNIC_COLL_SPIN", spin, float)
        self.nap = env.number("SOFTNIC_COLL_NAP", nap, float)
        self.credit_batch = max(1, self.slots // 2)
        self.wait_spin = env.number("SOFTNIC_COLL_WAIT_SPIN_US",
                                   0 if over else WAIT_SPIN_US, float) * 1e-6
        self._spin_call = False         # this call's receives are small enough to spin for
        self._wait = None               # set below: CQ.wait on softnic's own devices
        self.rq_batch = max(1, self.slots // 2)
        # zero-copy sends keep registrations of callers' memory; on a real device a
        # freed and reused address may be other pages, so there it is registered per call
        self.cache_mrs = v.PKG != "pyverbs"
        names = [d.name.decode() if isinstance(d.name, bytes) else d.name
                 for d in v.get_device_list()]
        if not names:
            raise CollectiveError("no RDMA device")
        self.device = device or names[0]
        self.ctx = v.Context(name=self.device)
        self.pd = v.PD(self.ctx)
        peers = [p for p in range(world) if p != rank]
        self.peers = peers
        self.sq_depth = self.slots + 4                  # data chunks plus credit returns
        # descriptors of direct receives in flight per peer: at most a call's receives
        # from it (a run ends only when the peer has used them all)
        self.ndesc = 2 * world + 8 if self.direct else 0
        self.rq_depth = 2 * self.slots + self.rq_batch + 4 + self.ndesc  # data, credits,
        # unreposted, descriptors
        self.cq = v.CQ(self.ctx, max(1, len(peers) * self.nqp) * (self.sq_depth + self.rq_depth)
                       + 16)
        if WAIT and hasattr(self.cq, "wait"):        # softnic's CQ.wait (not pyverbs')
            self._wait = self.cq.wait
        region = max(1, world * self.slots * self.chunk)
        # small chunks are copied into a staging ring; larger ones leave from the
        # caller's memory
        self.zc_min = int(zcopy or ZC_MIN)
        # a staged message is smaller than zc_min, so its chunks are at most this big
        self.stage = min(self.chunk, self.csize(self.zc_min))
        stage_region = max(1, world * self.slots * self.stage)
        self.recv_mr = self._region(region, ACCESS)
        self.send_mr = self._region(stage_region, v.e.IBV_ACCESS_LOCAL_WRITE)
        self.recv_mem = _u8_view(self.recv_mr.buf, region)
        self.send_mem = _u8_view(self.send_mr.buf, stage_region)
        # peers' descriptors of their direct receives land here, a ring of ndesc per peer
        self.desc_mr = self._region(max(1, world * self.ndesc * DESC_LEN), ACCESS)
        self.desc_mem = _u8_view(self.desc_mr.buf, max(1, world * self.ndesc * DESC_LEN))
        self._desc_out = np.zeros(DESC_LEN, np.uint8)  # a descriptor on its way (inline)
        self._keep: list = []                   # staged copies of this call's large sends
        self._mrs: OrderedDict[tuple[int, int], object] = OrderedDict()
        self._call_mrs: list = []               # registrations for this call only
        self.direct_recvs = 0                        # receives that landed in callers' memory
        self.zc_out = 0                              # zero-copy WRITEs not yet completed
        self._make_qps([] if self.connect_on_use else peers)
        self._connect(peers)

    # ------------------------------------------------------------------ setup

    def _make_qps(self, peers: list[int]) -> None:
        """``nqp`` RC QPs per peer on the one CQ: ``self.qps[p]`` the list for peer
        ``p``; per QP, by global index, its peer and its send WRs not yet completed;
        and each peer's flow state (``_add_peer``)."""
        self.qps: dict[int, list] = {}
        self.qp_index: dict[int, int] = {}      # qp_num -> global index
        self.qp_list: list = []
        self.qp_peer: list[int] = []
        self.sq_out: list[int] = []
        self.rq_owed: list[int] = []            # receives taken, not yet posted again
        self.first_qp: dict[int, int] = {}
        # per-peer flow state
        self.send_seq: dict[int, int] = {}      # data chunks posted to the peer
        # a sender holds a credit per free slot of the peer's ring; with admission it
        # has none until the receiver grants them
        self.credits: dict[int, int] = {}
        self.granted: dict[int, int] = {}       # admission: chunks granted to the peer
        self.consumed: dict[int, int] = {}      # chunks taken by a receive
        self.landed: dict[int, bytearray] = {}  # by seq mod slots
        self.owed: dict[int, int] = {}          # credits to return to the peer
        self.desc_sent: dict[int, int] = {}     # descriptors sent to the peer
        self.desc_landed: dict[int, int] = {}   # descriptors the peer sent, landed
        self.desc_used: dict[int, int] = {}     # ... and taken by a send
        self._peers_added = False               # since the last call (``_run``)
        for p in peers:
            self._add_peer(p)

    def _add_peer(self, p: int) -> None:
        """The QPs to ``p`` (not yet connected) and the flow state of the pair."""
        self.qps[p] = []
        for _ in range(self.nqp):
            cap = v.QPCap(max_send_wr=self.sq_depth + self.ndesc,
                          max_recv_wr=self.rq_depth, max_send_sge=1, max_recv_sge=1,
                          max_inline_data=DESC_LEN if self.ndesc else 0)
            qp = v.QP(self.pd, v.QPInitAttr(qp_type=v.e.IBV_QPT_RC, scq=self.cq,
                                            rcq=self.cq, cap=cap, sq_sig_all=1))
            if self.window and hasattr(qp, "set_window"):
                qp.set_window(self.window)
            self.qp_index[qp.qp_num] = len(self.qp_list)
            self.qp_list.append(qp)
            self.qp_peer.append(p)
            self.sq_out.append(0)
            self.rq_owed.append(0)
            self.qps[p].append(qp)
        self.first_qp[p] = self.qp_index[self.qps[p][0].qp_num]
        self.send_seq[p] = 0
        self.credits[p] = 0 if self.admit else self.slots
        self.granted[p] = 0
        self.consumed[p] = 0
        self.landed[p] = bytearray(self.slots)
        self.owed[p] = 0
        self.desc_sent[p] = 0
        self.desc_landed[p] = 0
        self.desc_used[p] = 0
        self._peers_added = True

    def _settings(self, chunk, slots, qps, admit, qp_timeout, min_chunk=None,
                  direct=None) -> None:
        """The chunk size, slots, QPs per peer, QP timeout, admission, smallest chunk and
        smallest direct receive: the arguments, else the environment, else the
        defaults; checked."""
        self.chunk = int(chunk or env.number("SOFTNIC_COLL_CHUNK", DEFAULT_CHUNK))
        self.min_chunk = int(min_chunk or self.min_chunk_default)
        if self.min_chunk <= 0:
            raise ValueError(f"smallest chunk {self.min_chunk}: give a positive size")
        self.slots = int(slots or env.number("SOFTNIC_COLL_SLOTS", DEFAULT_SLOTS))
        self.nqp = int(qps or env.number("SOFTNIC_COLL_QPS", DEFAULT_QPS))
        if self.chunk <= 0 or self.chunk % 64:
            raise ValueError(f"chunk size {self.chunk} must be a positive multiple of 64")
        if self.slots < 1:
            raise ValueError("need at least one slot per peer")
        if not 1 <= self.nqp <= 64:
            raise ValueError(f"{self.nqp} QPs per peer: give 1 to 64")
        # the QPs' timeout attribute: the retransmission timer is 4.096 us * 2**qp_timeout
        self.qp_timeout = int(qp_timeout if qp_timeout is not None else
                              os.environ.get("SOFTNIC_COLL_QP_TIMEOUT", 14))
        if not 0 <= self.qp_timeout <= 31:
            raise ValueError(f"QP timeout {self.qp_timeout}: give 0 to 31")
        self.admit = int(admit if admit is not None else
                         os.environ.get("SOFTNIC_COLL_ADMIT", 0)) or None
        self.direct = int(direct if direct is not None else self.direct_default)
        if self.direct < 0:
            raise ValueError(f"direct receives from {self.direct} bytes: give a size, or 0 "
                             "for none")
        if self.admit is not None and self.admit < 1:
            raise ValueError(f"admit {self.admit}: give the number of senders a receiver "
                             "admits at once (>= 1), or 0 for none")

    def _slot(self, peer: int, seq: int) -> int:
        return (peer * self.slots + seq % self.slots) * self.chunk

    def udp_source_ports(self, peer: int) -> list[int]:
        """The RoCEv2 UDP source port of each QP to ``peer`` (from its flow label)."""
        return [0xC000 | flow_label(self.rank, peer, q) for q in range(len(self.qps[peer]))]

    def _connect(self, peers: list[int]) -> None:
        """Exchange connection records with ``peers`` through the store, check that they
        use the same settings, connect the QPs made for them (all, unless
        ``connect_on_use``), and wait until every peer has done the same."""
        gid = self.ctx.query_gid(1, 0)
        made = [p for p in peers if p in self.qps]
        psns = {p: [self._initial_psn() for _ in self.qps[p]] for p in made}
        me = {"gid": str(gid), "rkey": self.recv_mr.rkey, "addr": self.recv_mr.buf,
              "nqp": self.nqp, "admit": self.admit, "window": self.window,
              "chunk": self.chunk, "slots": self.slots, "min_chunk": self.min_chunk,
              "direct": self.direct, "desc_rkey": self.desc_mr.rkey,
              "desc_addr": self.desc_mr.buf,
              "qpn": {str(p): [qp.qp_num for qp in self.qps[p]] for p in made},
              "psn": {str(p): psns[p] for p in made}}
        self.store.set(f"{self.prefix}/conn/{self.rank}", json.dumps(me).encode())
        self.remote: dict[int, dict] = {}
        for p in peers:
            self.remote[p] = _record(bytes(self._get(f"{self.prefix}/conn/{p}", p)))
            if self.remote[p].get("nqp") != self.nqp:
                raise CollectiveError(f"rank {self.rank}: rank {p} uses "
                                      f"{self.remote[p].get('nqp')} QPs per peer, this rank "
                                      f"{self.nqp} (set SOFTNIC_COLL_QPS alike on every rank)")
            if self.remote[p].get("window") != self.window:
                raise CollectiveError(f"rank {self.rank}: rank {p} keeps "
                                      f"{self.remote[p].get('window')} packets in flight per "
                                      f"QP, this rank {self.window} (set SOFTNIC_COLL_WINDOW "
                                      f"alike on every rank)")
            if self.remote[p].get("admit") != self.admit:
                raise CollectiveError(f"rank {self.rank}: rank {p} admits "
                                      f"{self.remote[p].get('admit')} senders at once, this "
                                      f"rank {self.admit} (set SOFTNIC_COLL_ADMIT alike on "
                                      f"every rank)")
            # a sender writes into the peer's ring at offsets its own slots and chunk
            # size give, and both ends cut a message into chunks alike
            for key, what, env in (("chunk", "slots of", "SOFTNIC_COLL_CHUNK"),
                                   ("slots", "slots per peer:", "SOFTNIC_COLL_SLOTS"),
                                   ("min_chunk", "chunks of at least", "SOFTNIC_COLL_MIN_CHUNK"),
                                   ("direct", "direct receives from",
                                    "SOFTNIC_COLL_DIRECT")):
                if self.remote[p].get(key) != getattr(self, key):
                    raise CollectiveError(f"rank {self.rank}: rank {p} uses {what} "
                                          f"{self.remote[p].get(key)}, this rank "
                                          f"{getattr(self, key)} (set {env} alike on every "
                                          f"rank)")
        for p in made:
            r = self.remote[p]
            self._to_rtr(p, r["qpn"][str(self.rank)], r["psn"][str(self.rank)])
            self._to_rts(p, psns[p])
        # nobody writes before every peer's QPs are ready to receive
        self.store.set(f"{self.prefix}/ready/{self.rank}", b"1")
        for p in peers:
            self._get(f"{self.prefix}/ready/{p}", p)

    def _to_rtr(self, p: int, dest_qpns: list[int], rq_psns: list[int]) -> None:
        """Take this rank's QPs to ``p`` to RTR, receives posted: QP ``q`` to the peer's
        QP ``dest_qpns[q]``, expecting the peer's first PSN ``rq_psns[q]``."""
        r = self.remote[p]
        for q, qp in enumerate(self.qps[p]):
            attr = v.QPAttr(qp_state=v.e.IBV_QPS_INIT, cur_qp_state=v.e.IBV_QPS_RESET)
            attr.qp_access_flags = ACCESS
            attr.port_num = 1
            qp.to_init(attr)
            self._post_recvs(qp, self.rq_depth, p)
            attr.path_mtu = v.e.IBV_MTU_4096
            attr.dest_qp_num = dest_qpns[q]
            attr.rq_psn = rq_psns[q]
            attr.max_dest_rd_atomic = 1
            attr.min_rnr_timer = 1
            attr.ah_attr = v.AHAttr(is_global=1, port_num=1,
                                    gr=v.GlobalRoute(dgid=v.GID(r["gid"]), sgid_index=0,
                                                     flow_label=flow_label(self.rank, p, q)))
            qp.to_rtr(attr)

    def _to_rts(self, p: int, sq_psns: list[int]) -> None:
        """Take this rank's QPs to ``p`` (in RTR) to RTS, QP ``q`` sending from
        ``sq_psns[q]``."""
        for q, qp in enumerate(self.qps[p]):
            attr = v.QPAttr(qp_state=v.e.IBV_QPS_RTS, cur_qp_state=v.e.IBV_QPS_RTR)
            attr.sq_psn = sq_psns[q]
            attr.timeout = self.qp_timeout
            attr.retry_cnt = 7
            attr.rnr_retry = 7
            attr.max_rd_atomic = 1
            qp.to_rts(attr)

    def _connect_now(self, peers: list[int]) -> None:
        """``connect_on_use``: before a call's first stream to or from ``peers``, connect
        those not yet connected, both ends.  Only a driver that can reach every rank's
        transport at once (``softnic.collectives.virtual``) can."""
        raise NotImplementedError(f"{type(self).__name__} cannot connect to ranks {peers} "
                                  "on first use")

    def _region(self, nbytes: int, access: int):
        """A registered region of ``nbytes``: the ring of receive slots, or the staging
        ring of small sends."""
        return v.MR(self.pd, nbytes, access)

    @staticmethod
    def _initial_psn() -> int:
        return int.from_bytes(os.urandom(3), "little")

    @staticmethod
    def _post_recvs(qp, n: int, peer: int) -> None:
        if n <= 0:
            return
        wr = None
        for _ in range(n):
            wr = v.RecvWR(wr_id=peer, num_sge=0, next_wr=wr)
        qp.post_recv(wr)

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
        while any(self.sq_out) and time.monotonic() < deadline:
            if not self._poll():
                time.sleep(1e-4)

    def close(self) -> None:
        """Drain, then wait (through the store) until every rank has drained before
        destroying the QPs: a peer must still be there to acknowledge what we sent last."""
        if self.peers and not self.closed:
            try:
                self.drain()
                self.store.set(f"{self.prefix}/drained/{self.rank}", b"1")
                for p in self.peers:
                    self.store.get(f"{self.prefix}/drained/{p}")
            except Exception:           # a peer already gone: nothing left to protect
                pass
        for obj in (self.qp_list + list(self._mrs.values()) + self._call_mrs
                    + [self.recv_mr, self.send_mr, self.desc_mr, self.cq, self.pd, self.ctx]):
            try:
                obj.close()
            except v.PyverbsError:
                pass
        self.qps, self.qp_list, self._mrs, self._call_mrs = {}, [], OrderedDict(), []
        self.closed = True

    # ------------------------------------------------------------------ registrations

    def register(self, arr: np.ndarray, least: int | None = None) -> None:
        """Register ``arr``'s memory (if big enough to be worth it: ``least`` bytes, by
        default the smallest zero-copy send) so that sends from it, or any part of it,
        leave without a copy, and large receives into it land there.  Kept in a small
        cache of the most recently used buffers (softnic's device), or for this call
        only (a real one)."""
        if arr.nbytes < (self.zc_min if least is None else least):
            return
        addr = arr.ctypes.data
        key = (addr, arr.nbytes)
        mr = self._mrs.get(key)
        if mr is not None:
            self._mrs.move_to_end(key)
            return
        try:
            mr = v.MR(self.pd, arr.nbytes, ACCESS, address=addr)
        except v.PyverbsError:
            return                          # not registrable here: sends are staged
        if not self.cache_mrs:
            self._call_mrs.append(mr)
            self._mrs[key] = mr
            return
        self._mrs[key] = mr
        while len(self._mrs) > MR_CACHE:
            _, old = self._mrs.popitem(last=False)
            old.close()

    def _lkey(self, seg: np.ndarray):
        mr = self._mr_of(seg, self.zc_min)
        return None if mr is None else mr.lkey

    def _mr_of(self, seg: np.ndarray, least: int):
        """The registration holding ``seg`` (made now if none does and ``seg`` has
        ``least`` bytes or more), or None."""
        if seg.nbytes < least:
            return None
        lo = seg.ctypes.data
        hi = lo + seg.nbytes
        for (addr, n), mr in self._mrs.items():
            if addr <= lo and hi <= addr + n:
                return mr
        self.register(seg, least)
        return self._mrs.get((lo, seg.nbytes))

    def _end_call(self) -> None:
        for mr in self._call_mrs:
            for k in [k for k, m in self._mrs.items() if m is mr]:
                del self._mrs[k]
            mr.close()
        self._call_mrs = []

    # ------------------------------------------------------------------ data path

    def csize(self, nbytes: int) -> int:
        """The chunk size of a message of ``nbytes``: about a PIPELINE-th of it, at least
        ``min_chunk`` and at most a slot (both ends cut a message alike)."""
        c = -(-nbytes // PIPELINE)
        c = -(-c // 4096) * 4096
        return max(1, min(self.chunk, max(self.min_chunk, c)))

    def nchunks(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.csize(nbytes)))

    def _send_stream(self, peer, arrays, gate=None, flat=None) -> _Stream:
        flat = _flat if flat is None else flat       # (an empty _Flat is falsy)
        segs = [flat(x) for x in arrays]
        lkeys = []
        for seg in segs:
            lkey = self._lkey(seg)
            if lkey is None and self.csize(seg.nbytes) > self.stage:
                # its memory could not be registered and its chunks do not fit the
                # staging ring: each chunk is copied, when it goes, into a registered
                # bounce buffer of the message's size
                bounce = np.empty(seg.nbytes, np.uint8)
                mr = v.MR(self.pd, max(1, bounce.nbytes), v.e.IBV_ACCESS_LOCAL_WRITE,
                          address=bounce.ctypes.data)
                self._keep.append(bounce)
                self._call_mrs.append(mr)
                lkey = (mr.lkey, bounce)
            lkeys.append(lkey)
        return _Stream(peer, segs, self.csize, gate=gate, lkeys=lkeys)

    def exchange(self, sends=(), recvs=()) -> None:
        """Send each ``(peer, array)`` of ``sends`` and receive each ``(peer, dst, op)``
        of ``recvs`` (``dst`` a contiguous 1-D array; ``op`` a numpy ufunc reducing the
        incoming data into ``dst``, or None to copy), all at once."""
        ss = [self._send_stream(peer, [data]) for peer, data in sends]
        rs = [_Stream(peer, [_flat(dst)], self.csize, [op], [dst.dtype])
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
        self.chain(left, right, recvs, sends, lag=1)

    def chain(self, left: int, right: int, recvs, sends, lag: int) -> None:
        """Receive ``recvs[s] = (dst, op)`` from ``left`` and send ``sends[s]`` to
        ``right``, where ``sends[s]`` is what ``recvs[s - lag]`` received: each chunk is
        passed on as soon as it has come in (a ring's steps, ``lag`` 1; a pipelined
        broadcast, ``lag`` 0, where what comes in goes on)."""
        flat = _Flat()
        rs = _Stream(left, [flat(d) for d, _ in recvs], self.csize,
                     [op for _, op in recvs], [d.dtype for d, _ in recvs])

        def ready(i, k):
            j = i - lag
            return j < 0 or rs.i > j or (rs.i == j and rs.k > k)

        ss = self._send_stream(right, sends, gate=ready, flat=flat)
        if ss.nch[lag:] != rs.nch[:len(ss.nch) - lag]:
            raise ValueError("chain: step s must send what step s - lag received")
        self.run([ss], [rs] if recvs else [])

    def run(self, ss: list[_Stream], rs: list[_Stream]) -> None:
        """Drive send and receive streams until every send is posted and every receive
        consumed, and every WRITE from a caller's buffer acknowledged."""
        try:
            self._run(ss, rs)
        finally:
            if self._call_mrs:
                self._end_call()
            self._keep = []

    def _connected(self, ss: list[_Stream], rs: list[_Stream]) -> None:
        """Check a call's streams (one per peer and direction, each with another rank)
        and connect their peers (``connect_on_use``: now, if not yet)."""
        for st in ss + rs:
            if st.peer == self.rank or not 0 <= st.peer < self.world:
                raise ValueError(f"rank {self.rank}: no connection to rank {st.peer}")
        if len({st.peer for st in ss}) != len(ss) or len({st.peer for st in rs}) != len(rs):
            raise ValueError("one stream per peer and direction")
        if self.connect_on_use:
            self._connect_now(sorted({st.peer for st in ss + rs}))
        if self._peers_added:
            # credits go back to the peers in their order (peers connected on use,
            # here or by the peer, join in the order they did)
            self._peers_added = False
            self.owed = dict(sorted(self.owed.items()))

    def _run(self, ss: list[_Stream], rs: list[_Stream]) -> None:
        self._connected(ss, rs)
        ss = [st for st in ss if not st.done()]
        rs = [st for st in rs if not st.done()]
        waiting = None
        if self.admit is not None and rs:
            # receiver-driven admission: grant the first ``admit`` senders, in the order
            # rank - 1, rank - 2, ...; the next when one of them is done
            waiting = sorted(rs, key=lambda st: (self.rank - st.peer) % self.world)
            waiting = self._admit_more(waiting, 0)
        self._spin_call = sum(len(x) for st in rs for x in st.segs) <= WAIT_SPIN_MAX
        self._started()
        # an inline step first: it takes what already waits and renews this thread's
        # lease on the device, so the device's progress thread leaves what arrives
        # during the posts below to this thread instead of waking to take it (after a
        # pause between calls the lease has lapsed, and the two threads would then pass
        # the interpreter back and forth; docs/collectives.md, "How a rank waits")
        self._poll()
        if self.direct:
            for st in ss:
                st.direct = self._large(st)
            for st in rs:
                self._describe(st)
        nqp = self.nqp
        idle_return = self.idle_credits or self.admit is not None
        # once per completion a rank reacts to: the flow state in locals (each of these
        # is the rank's one dict or list for it, changed in place)
        credits, first_qp, send_seq, sq_out = self.credits, self.first_qp, self.send_seq, \
            self.sq_out
        landed, consumed, owed, slots = self.landed, self.consumed, self.owed, self.slots
        send_max, credit_max, batch = self.sq_depth - 1, self.sq_depth, self.credit_batch
        post_chunk, consume, poll = self._post_chunk, self._consume, self._poll
        while ss or rs or self.zc_out:
            moved = False
            for st in ss:
                p = st.peer
                first = first_qp[p]
                gate = st.gate
                while st.i < st.nseg and credits[p] and (gate is None or gate(st.i, st.k)):
                    qi = first + send_seq[p] % nqp
                    if sq_out[qi] >= send_max:
                        break
                    if st.k == 0 and st.direct is not None and st.direct[st.i] is None \
                            and not self._take_desc(st):
                        break               # a large message waits for where it goes
                    post_chunk(st, qi)
                    moved = True
            if poll():
                moved = True
            for st in rs:
                p = st.peer
                ring = landed[p]
                while st.i < st.nseg and ring[consumed[p] % slots]:
                    consume(st)
                    moved = True
            if moved:
                ss = [st for st in ss if st.i < st.nseg]
                live = len(rs)
                rs = [st for st in rs if st.i < st.nseg]
                if waiting and len(rs) < live:
                    waiting = self._admit_more(waiting, sum(st.end is not None for st in rs))
            # credits go back in batches: a sender with none left has every slot in
            # flight or owed, and consuming what is in flight makes up a batch here.
            # Under admission the grants of a message may stay below a batch, and
            # with ``idle_credits`` they go as soon as this rank has nothing else to do.
            for p, n in owed.items():
                if n and (n >= batch or (idle_return and not moved)) and \
                        sq_out[first_qp[p]] < credit_max:
                    self._post_credit(p, n)
            if moved:
                self._progressed()
                continue
            self._idle(ss + rs)
        # one more poll: a device may hold the acknowledgements of what just came in
        # until its caller's next call, and the peer may be waiting on them (its
        # zero-copy sends complete only when acknowledged)
        self._poll()
        # a full batch of credits goes back now; fewer ride on this rank's next chunk to
        # that peer, or go back with a batch a later call completes (the peer still
        # holds at least half its credits meanwhile)
        for p, n in self.owed.items():
            if n >= self.credit_batch and self.sq_out[self.first_qp[p]] < self.sq_depth:
                self._post_credit(p, n)

    # ------------------------------------------------------------------ waiting

    def _started(self) -> None:
        """A call starts driving its streams."""
        self._last = self._checked = time.monotonic()
        self._idles = 0

    def _progressed(self) -> None:
        """Something moved: a chunk posted or taken, a completion polled."""
        self._last = time.monotonic()
        self._idles = 0

    def _idle(self, streams) -> None:
        """Nothing moved: every step onward needs a completion on the CQ.  A rank that
        receives, on softnic's devices, waits for one on the device (``WAIT``); one that
        only sends (a broadcast's root), or waits only for the acknowledgements of its
        WRITEs, polls, whose inline steps send the next packets as soon as each ACK
        opens the window (a waiting sender would let the window sit closed until it
        woke; docs/collectives.md, "How a rank waits"); and elsewhere a rank polls
        for ``spin`` seconds, then naps
        between polls.  Check the peers every second; give up after
        ``timeout`` seconds without progress."""
        self._idles += 1
        if self._wait is not None and any(st.lkeys is None for st in streams):
            if not self._spin_call or time.monotonic() - self._last >= self.wait_spin:
                self._wait(WAIT_SLICE)
        elif time.monotonic() - self._last > self.spin:
            # idle for a while: let the other processes on this core (and this
            # device's progress thread) run
            time.sleep(min(self.nap, 2e-5 * self._idles))
        now = time.monotonic()
        if now - self._checked > 1.0:
            self._checked = now
            self._check_peers([st.peer for st in streams])
        if now - self._last > self.timeout:
            self._stalled(streams, f"{self.timeout:g} s")

    def _stalled(self, streams, how_long: str):
        waiting = sorted({st.peer for st in streams}) or sorted(
            {self.qp_peer[i] for i, n in enumerate(self.sq_out) if n})
        raise CollectiveError(
            f"rank {self.rank}: no progress for {how_long} waiting on rank(s) "
            f"{waiting} (dead, hung, or not in the same collective)")

    # ------------------------------------------------------------------ direct receives

    def _large(self, st: _Stream):
        """Per segment of ``st``, None for those a descriptor will be sent for (the
        first ``ndesc`` of ``direct`` bytes or more), False for the rest; None if none
        is.  Sender and receiver apply the same rule to the same sizes."""
        k = 0
        out = []
        for seg in st.segs:
            big = seg.nbytes >= self.direct and k < self.ndesc
            k += big
            out.append(None if big else False)
        return out if k else None

    def _describe(self, st: _Stream) -> None:
        """A receive stream starts: for each of its large segments, tell the sender
        where it goes, in order: into the caller's memory (registered, if the data is
        copied there, not reduced) or into the ring."""
        large = self._large(st)
        if large is None:
            return
        st.direct = [False] * len(st.segs)
        for i, seg in enumerate(st.segs):
            if large[i] is False:
                continue
            mr = self._mr_of(seg, self.direct) if st.ops[i] is None else None
            if mr is not None:
                st.direct[i] = True
                self.direct_recvs += 1
                self._post_desc(st.peer, seg.ctypes.data, mr.rkey, True)
            else:
                self._post_desc(st.peer, 0, 0, False)

    def _post_desc(self, p: int, addr: int, rkey: int, direct: bool) -> None:
        """Descriptor number ``desc_sent[p]`` to ``p``: a WRITE_WITH_IMM into its ring of
        them (inline: the WR carries the bytes, so a resend sends these)."""
        j = self.desc_sent[p]
        qi = self.first_qp[p]
        while self.sq_out[qi] >= self.sq_depth + self.ndesc - 1:
            if not self._poll():
                self._idle([])
        d = self._desc_out
        d.view(np.uint64)[0] = addr
        d.view(np.uint32)[2] = rkey
        d.view(np.uint32)[3] = (j & 0x7FFFFFFF) | (direct << 31)
        wr = v.SendWR(wr_id=p, opcode=v.e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1,
                      sg=[v.SGE(d.ctypes.data, DESC_LEN, 0)],
                      send_flags=v.e.IBV_SEND_INLINE,
                      imm_data=CREDIT_FLAG | DESC_FLAG | (j & SEQ_MASK))
        r = self.remote[p]
        wr.set_wr_rdma(r["desc_rkey"],
                       r["desc_addr"] + (self.rank * self.ndesc + j % self.ndesc) * DESC_LEN)
        self.qp_list[qi].post_send(wr)
        self.sq_out[qi] += 1
        self.desc_sent[p] = j + 1

    def _take_desc(self, st: _Stream) -> bool:
        """The receiver's descriptor of ``st``'s current segment, if it has landed:
        where its chunks go.  False if it has not yet."""
        p = st.peer
        j = self.desc_used[p]
        if self.desc_landed[p] <= j:
            return False
        o = (p * self.ndesc + j % self.ndesc) * DESC_LEN
        e = self.desc_mem[o:o + DESC_LEN]
        word = int(e[12:16].view(np.uint32)[0])
        if word & 0x7FFFFFFF != j & 0x7FFFFFFF:
            raise CollectiveError(f"rank {self.rank}: descriptor {word & 0x7FFFFFFF} from "
                                  f"rank {p} where {j & 0x7FFFFFFF} was expected")
        if word >> 31:
            st.direct[st.i] = (int(e[0:8].view(np.uint64)[0]), int(e[8:12].view(np.uint32)[0]))
        else:
            st.direct[st.i] = False
        self.desc_used[p] = j + 1
        return True

    # ------------------------------------------------------------------ admission

    def _admit_more(self, waiting: list, active: int) -> list:
        """Admit receive streams from the head of ``waiting`` until ``admit`` are active;
        the clear-to-send (their first credits) goes at once.  Returns the rest."""
        while waiting and active < self.admit:
            st = waiting.pop(0)
            p = st.peer
            st.end = self.consumed[p] + sum(st.nch)
            self._grant(st)
            if self.owed[p] and self.sq_out[self.first_qp[p]] < self.sq_depth:
                self._post_credit(p, self.owed[p])
            active += 1
        return waiting

    def _grant(self, st: _Stream) -> None:
        """Admission: credit the sender of ``st`` for the free slots of its ring, but
        never beyond the chunks of this message."""
        p = st.peer
        target = min(self.consumed[p] + self.slots, st.end)
        if target > self.granted[p]:
            self.owed[p] += target - self.granted[p]
            self.granted[p] = target

    def _check_peers(self, peers) -> None:
        failed = getattr(self.store, "failed_ranks", None)
        if failed is None:
            return
        dead = failed()
        if dead:
            raise CollectiveError(f"rank {self.rank}: rank(s) {dead} left the job "
                                  f"(process died or exited early); waiting on "
                                  f"{sorted(set(peers))}")

    def _post_chunk(self, st: _Stream, qi: int) -> None:
        p = st.peer
        data = st.segs[st.i]
        n = min(st.csz[st.i], len(data) - st.off)
        seq = self.send_seq[p]
        lkey = st.lkeys[st.i]
        wr_id = p
        give = min(self.owed[p], PIGGY_MAX)
        self.owed[p] -= give
        if not n:
            sg = None
        elif lkey is not None:
            if type(lkey) is tuple:
                lkey, bounce = lkey
                bounce[st.off:st.off + n] = data[st.off:st.off + n]
                data = bounce
            sg = [v.SGE(data.ctypes.data + st.off, n, lkey)]
            wr_id |= _ZC
            self.zc_out += 1
        else:
            off = (p * self.slots + seq % self.slots) * self.stage
            self.send_mem[off:off + n] = data[st.off:st.off + n]
            sg = [v.SGE(self.send_mr.buf + off, n, self.send_mr.lkey)]
        wr = v.SendWR(wr_id=wr_id, opcode=v.e.IBV_WR_RDMA_WRITE_WITH_IMM,
                      num_sge=1 if n else 0, sg=sg,
                      imm_data=(seq & SEQ_MASK) | (give << PIGGY_SHIFT))
        d = st.direct[st.i] if st.direct is not None else False
        if d:                       # into the receiver's own memory, where its descriptor says
            wr.set_wr_rdma(d[1], d[0] + st.off)
        else:
            r = self.remote[p]
            wr.set_wr_rdma(r["rkey"], r["addr"] + self._slot(self.rank, seq))
        self.qp_list[qi].post_send(wr)
        self.send_seq[p] = seq + 1
        self.credits[p] -= 1
        self.sq_out[qi] += 1
        st.advance(n)

    def _post_credit(self, p: int, n: int) -> None:
        wr = v.SendWR(wr_id=p, opcode=v.e.IBV_WR_SEND_WITH_IMM, num_sge=0,
                      imm_data=CREDIT_FLAG | n)
        qi = self.first_qp[p]
        self.qp_list[qi].post_send(wr)
        self.sq_out[qi] += 1
        self.owed[p] = 0

    def _consume(self, st: _Stream) -> None:
        p = st.peer
        seq = self.consumed[p]
        dst_seg = st.segs[st.i]
        n = min(st.csz[st.i], len(dst_seg) - st.off)
        if n and not (st.direct is not None and st.direct[st.i]):
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
        self.landed[p][seq % self.slots] = 0
        self.consumed[p] = seq + 1
        st.advance(n)
        if self.admit is None:
            self.owed[p] += 1
        else:
            self._grant(st)

    def _poll(self) -> bool:
        """Take every completion the CQ holds; True if there was any."""
        moved = False
        while True:
            n, wcs = self.cq.poll(32)
            if not n:
                return moved
            moved = True
            self._completed(wcs)

    def _completed(self, wcs) -> None:
        """Act on polled work completions: receives post their replacements in
        batches and land chunks, credits and descriptors; sends free their slots."""
        for wc in wcs:
            qi = self.qp_index.get(wc.qp_num)
            if wc.status != v.e.IBV_WC_SUCCESS:
                p = self.qp_peer[qi] if qi is not None else wc.wr_id & 0xFFFFFFFF
                raise CollectiveError(
                    f"rank {self.rank}: work completion with status {wc.status} on the "
                    f"connection to rank {p} (opcode {wc.opcode}); the peer is probably "
                    f"gone")
            p = self.qp_peer[qi]
            if wc.opcode & v.e.IBV_WC_RECV:
                imm = wc.imm_data
                self.rq_owed[qi] += 1
                if self.rq_owed[qi] >= self.rq_batch:
                    self._post_recvs(self.qp_list[qi], self.rq_owed[qi], p)
                    self.rq_owed[qi] = 0
                if imm & CREDIT_FLAG:
                    if imm & DESC_FLAG:
                        self.desc_landed[p] += 1
                    else:
                        self.credits[p] += imm & ~CREDIT_FLAG
                else:
                    self.credits[p] += imm >> PIGGY_SHIFT
                    c = self.consumed[p]
                    seq = c + (((imm & SEQ_MASK) - c) & SEQ_MASK)
                    slot = seq % self.slots
                    if seq - c >= self.slots or self.landed[p][slot]:
                        raise CollectiveError(
                            f"rank {self.rank}: chunk {imm & SEQ_MASK} from rank {p} "
                            f"outside the "
                            f"window (next expected {c & SEQ_MASK}, {self.slots} slots)")
                    self.landed[p][slot] = 1
            else:
                self.sq_out[qi] -= 1
                if wc.wr_id & _ZC:
                    self.zc_out -= 1
