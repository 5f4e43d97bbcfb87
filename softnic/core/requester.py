"""Requester: send queue -> request packets.

Segments each WQE by the path MTU, assigns PSNs, honours the in-flight
window, the READ/ATOMIC credit limit (max_rd_atomic) and fences, and
regenerates packets from the WQE when the completer rewinds (go-back-N) or
asks for a single PSN (selective repeat).

Each rule once, in the chain ``generate`` walks (its docstring names the
states): admission (``_may_start``; the window ``_window_room``; the pacer
``_cc_blocked``), PSNs and local keys (``start``), the AckReq cadence
(``_send_packet``), the go-back-N record of what was sent (``_record_sent``),
the bytes of each packet (``_build``: a one-packet request of any opcode is
packed straight, ``_pack_only``, and a FIRST by ``_build_rc``, the bytes
``encode`` gives).  The bulk of a long message takes a faster way through the
same rules, a run of MIDDLEs into one buffer (``_bulk_run``, ``_bulk``; its
MIDDLEs built by the compiled kernel's ``sn_tx_middles`` when there is one);
tests/test_bulk_tx.py and tests/test_kernel.py check it against ``_build``
packet by packet.  The cheap
cases (a lone one-packet request, a paced QP's next MIDDLE) are the same chain
ending early; tests/test_fastpath.py runs workloads with the packed bytes and
the common-case branches and without them.  Where a device has the compiled
drain (``softnic.accel.give_compiled``), a controlled RC QP's MIDDLEs take
``generate``'s chain compiled (``softnic/accel/requester.c``: HELD, WINDOW,
PACER and SEND over the same objects, everything else handed back to
``generate``); tests/test_paced_middles.py checks it against ``generate`` step
by step.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..wire.icrc import MEMO_MAX, crc32, icrc_start
from ..wire.psn import PSN_HALF, PSN_MASK, PSN_MODULUS, psn_before, psn_diff
from ..wire.roce import BTH_ACKREQ, BTH_FMT, BTH_LEN, BTH_PAD_SHIFT, BTH_RETH_STRUCT, \
    BTH_SE, BTH_STRUCT, DEFAULT_PKEY, ICRC_LEN, OPCODES, QPN_MASK, IETH_LEN, IMMDT_LEN, \
    RETH_LEN, Opcode as O, bth_word0, encode, encode_middle
from .enums import QPState, QPType, SendFlags, WCStatus, WROpcode as W
from .wr_opcode import ATOMICS, SEGMENTED, SENDS, WITH_IMM, WITH_INV, WRITES, only_opcode
from .memory import AccessError
from .responder import SR_SPAN
from . import xrc

# (WR opcode, first, last) -> RC opcode; UC opcodes are RC's + 0x20.
_POS = {(True, False): 0, (False, False): 1, (False, True): 2, (True, True): 3}
_OPC = SEGMENTED                        # WR opcode -> RC (FIRST, MIDDLE, LAST, ONLY)
_ATOMIC_OPC = {w: only_opcode(w) for w in ATOMICS}
_SOLICITED = int(SendFlags.SOLICITED)      # flag bits as plain ints (IntFlag ops are slow)
_FENCE = int(SendFlags.FENCE)
#: the MIDDLE opcode of each WR that a long message carries in MIDDLE packets
_MIDDLE = {w: int(ops[1]) for w, ops in _OPC.items()}
#: the LAST opcode of each WR a long message carries, and how many bytes of extended
#: header follow its BTH (an ImmDt or an IETH: 4; none: 0)
_LAST = {w: (int(ops[2]), IMMDT_LEN if w in WITH_IMM else IETH_LEN if w in WITH_INV else 0)
         for w, ops in _OPC.items()}
#: the FIRST opcode of each WR whose FIRST has a MIDDLE's layout (no extended header:
#: a SEND's), so that a run of MIDDLEs may start at it
_RUN_FIRST = {w: int(ops[0]) for w, ops in _OPC.items() if w in SENDS}
_HDR = BTH_STRUCT
_BTH_RETH = BTH_RETH_STRUCT
_WRITES = WRITES
_WRITE_FIRST = int(O.RC_RDMA_WRITE_FIRST)
_SEND_FIRST = int(O.RC_SEND_FIRST)
_HEAD = struct.Struct("!" + BTH_FMT[:4])  # its first 8 bytes, byte 4 (FECN, BECN) masked
_HEAD_BYTES = BTH_LEN + ICRC_LEN         # a MIDDLE without its payload: BTH and ICRC
_BTH_RETH_LEN = BTH_LEN + RETH_LEN
_ICRC = struct.Struct("<I")             # the ICRC, least significant byte first
_U32 = struct.Struct("!I")
_RC, _UD = QPType.RC, QPType.UD
_SENDING = frozenset({QPState.RTS, QPState.SQD})
_RTS = QPState.RTS
#: the WQEs whose START requester.c compiles where they have one SGE and no
#: inline data (``plain_start``: ``_may_start``, and ``start``'s view and PSNs)
_PLAIN_START = SENDS | WRITES
_ATOMIC_ETH = struct.Struct("!QIQQ")   # an AtomicETH
#: WR opcode -> (its RC ONLY opcode, is it a message: a SEND or WRITE, whose payload
#: and SE bit it carries): every request that ``_pack_only`` packs
_ONLY_OPCODE = {w: (only_opcode(w), w in SENDS or w in WRITES)
                for w in SENDS | WRITES | ATOMICS | {W.RDMA_READ}}
#: the longest gather list of several SGEs read into one buffer as its WQE starts
#: (``start``), kept until it completes; a longer one is gathered packet by packet
#: (an RC QP's window bounds its WQEs started and not yet acknowledged: with the
#: default window of 128 packets, 8 MiB of such copies a QP at most)
GATHER_ONCE_MAX = 1 << 16
#: WR opcode -> (RC ONLY opcode, its headers' length, a RETH, an AtomicETH, an ImmDt or
#: IETH, a message), the headers as ``wire.roce.OPCODES`` lays them out
_ONLY = {w: (int(op), OPCODES[op].hdr_len, OPCODES[op].reth, OPCODES[op].atomiceth,
             OPCODES[op].immdt or OPCODES[op].ieth, message)
         for w, (op, message) in _ONLY_OPCODE.items()}


def start(dev, qp, wqe) -> None:
    """Start a WQE taken from the send queue: run a local operation (LOCAL_INV,
    BIND_MW) at once, else check its local memory (the SGEs' lkeys, as views in
    ``wqe.views``) and give it its PSNs; a failed check completes the WQE with
    its error.  iWARP's send path starts its WQEs by the same rule.  (With
    ``_may_start``, compiled for a SEND or a WRITE of one SGE and no inline data
    where requester.c's ``bulk_runs`` sends: its ``plain_start``, which
    tests/test_bulk_runs.py compares with this.)"""
    op = wqe.opcode
    if op is W.LOCAL_INV:
        if dev.keys.invalidate(qp.pd, wqe.inv_rkey):
            wqe.status = WCStatus.SUCCESS
        else:
            wqe.status = WCStatus.LOC_PROT_ERR   # rxe: an unknown key fails the WR
        wqe.done = True
        return
    if op is W.BIND_MW:                          # a local operation, in send queue order
        try:
            dev.keys.bind_mw(qp, qp.pd, wqe.bind)
            wqe.status = WCStatus.SUCCESS
        except AccessError:
            wqe.status = WCStatus.MW_BIND_ERR
        wqe.done = True
        return
    try:
        if wqe.inline is not None:
            wqe.views = [memoryview(wqe.inline)]
        elif len(wqe.sges) == 1:        # (the common case, without a comprehension's frame)
            addr, length, lkey = wqe.sges[0]
            wqe.views = [dev.keys.local(qp.pd, lkey, addr, length, write=wqe.rd_atomic)]
        else:
            write = wqe.rd_atomic
            wqe.views = [dev.keys.local(qp.pd, lkey, addr, length, write=write)
                         for addr, length, lkey in wqe.sges]
            if not write and wqe.length <= GATHER_ONCE_MAX:
                # the memory a SEND or WRITE sends, read as its first packet is
                # built (memory the program may not touch until the completion): one
                # buffer, from which every packet is cut as from one SGE, and a run
                # of MIDDLEs built by the kernel, where gather() would assemble each
                # MTU from the pieces (UCX's eager zero-copy: a header, then the data)
                wqe.views = [memoryview(b"".join(wqe.views))]
    except AccessError:
        wqe.status = WCStatus.LOC_PROT_ERR
        wqe.done = True
        return
    atomic = op in _ATOMIC_OPC
    if atomic and wqe.length < 8:
        wqe.status = WCStatus.LOC_LEN_ERR
        wqe.done = True
        return
    if atomic or op is W.FLUSH or qp.qp_type is _UD:
        npkts = 1                       # (a FLUSH names memory of the peer's, sends none)
    else:
        npkts = -(-wqe.length // qp.mtu) or 1
    wqe.npkts = npkts
    req = qp.req
    psn = req.psn
    wqe.first_psn = psn
    wqe.last_psn = (psn + npkts - 1) & PSN_MASK
    req.psn = (psn + npkts) & PSN_MASK
    wqe.next_pkt = 0
    if wqe.rd_atomic:
        req.rd_atomic += 1


def gather(wqe, off: int, n: int):
    """Bytes [off, off+n) of the WQE's gather list (a view when it lies in one SGE)."""
    if n == 0:
        return b""
    views = wqe.views
    if len(views) == 1:
        return views[0][off:off + n]
    out = bytearray()
    for v in views:
        lv = len(v)
        if off >= lv:
            off -= lv
            continue
        take = v[off:off + n - len(out)]
        out += take
        off = 0
        if len(out) == n:
            break
    return out


def _build(dev, qp, wqe, idx: int, ackreq: bool, count: int | None = None) -> bytearray:
    """Request packet number ``idx`` of ``wqe`` (for a READ re-issued from
    response ``idx``: ``count`` responses, or all the rest): an RC request of one
    packet packed straight (``_pack_only``; a READ of all its responses is one
    packet however many PSNs it spans), an RC MIDDLE (a whole MTU), any other by
    ``_build_rc``; an XRC initiator's as XRC's."""
    npkts = wqe.npkts
    if qp.qp_type is not _RC:
        pkt = _build_rc(dev, qp, wqe, idx, ackreq, count)
    elif dev.fast and (npkts == 1 and wqe.opcode in _ONLY
                        or idx == 0 and count is None and wqe.opcode is W.RDMA_READ):
        pkt = _pack_only(qp, wqe, wqe.first_psn, qp.attr.dest_qp_num)
    elif 0 < idx < npkts - 1 and wqe.opcode in _MIDDLE:
        mtu = qp.mtu            # a whole MTU in a MIDDLE packet: the bulk of a long message
        pkt = encode_middle(_MIDDLE[wqe.opcode], qp.attr.dest_qp_num,
                            (wqe.first_psn + idx) & PSN_MASK, ackreq,
                            gather(wqe, idx * mtu, mtu))
    else:
        pkt = _build_rc(dev, qp, wqe, idx, ackreq, count)
    return pkt if qp.xrc is None else xrc.request(pkt, wqe.xrc_srqn)


def _build_rc(dev, qp, wqe, idx: int, ackreq: bool, count: int | None = None) -> bytearray:
    """``_build``'s other packets: a FIRST, a LAST, a READ re-issued from a later
    response, an ATOMIC WRITE, a FLUSH, UC's and UD's, and (without the fast
    paths) every ONLY."""
    psn = (wqe.first_psn + idx) & PSN_MASK
    dqpn = qp.attr.dest_qp_num
    op = wqe.opcode
    if idx == 0 and wqe.npkts > 1 and dev.fast and qp.qp_type is QPType.RC and op in _MIDDLE:
        # a FIRST: a whole MTU, no pad, no SE, and a RETH for a WRITE (what
        # ``encode`` gives, packed straight)
        mtu = qp.mtu
        if op in _WRITES:
            buf = bytearray(BTH_LEN + RETH_LEN + mtu)
            _BTH_RETH.pack_into(buf, 0, _WRITE_FIRST, 0, DEFAULT_PKEY, dqpn & QPN_MASK,
                                (BTH_ACKREQ if ackreq else 0) | psn, wqe.remote_addr,
                                wqe.rkey, wqe.length)
            buf[BTH_LEN + RETH_LEN:] = gather(wqe, 0, mtu)
            return buf
        return encode_middle(_SEND_FIRST, dqpn, psn, ackreq, gather(wqe, 0, mtu))
    if qp.qp_type == QPType.UD:
        qkey = wqe.remote_qkey
        if qkey & 0x80000000:        # IBA: a high-order bit set means "use the QP's own Q_Key"
            qkey = qp.attr.qkey
        imm = wqe.imm if op == W.SEND_WITH_IMM else None
        opcode = O.UD_SEND_ONLY_WITH_IMMEDIATE if imm is not None else O.UD_SEND_ONLY
        return encode(opcode, dest_qp=wqe.remote_qpn, psn=psn, imm=imm, deth=(qkey, qp.qpn),
                      se=bool(wqe.flags & SendFlags.SOLICITED),
                      payload=gather(wqe, 0, wqe.length))
    if op == W.RDMA_READ:
        # idx > 0 re-issues the READ for the responses not yet received.
        off = idx * qp.mtu
        n = wqe.length - off if count is None else min(count * qp.mtu, wqe.length - off)
        return encode(O.RC_RDMA_READ_REQUEST, dest_qp=dqpn, psn=psn, ackreq=True,
                      reth=(wqe.remote_addr + off, wqe.rkey, n))
    if op == W.ATOMIC_WRITE:
        return encode(O.RC_ATOMIC_WRITE, dest_qp=dqpn, psn=psn, ackreq=True,
                      reth=(wqe.remote_addr, wqe.rkey, 8), payload=wqe.inline)
    if op == W.FLUSH:
        return encode(O.RC_FLUSH, dest_qp=dqpn, psn=psn, ackreq=True, feth=wqe.flush,
                      reth=(wqe.remote_addr, wqe.rkey, wqe.length & 0xFFFFFFFF))
    if op in _ATOMIC_OPC:
        return encode(_ATOMIC_OPC[op], dest_qp=dqpn, psn=psn, ackreq=True,
                      atomiceth=(wqe.remote_addr, wqe.rkey, wqe.compare_add if op ==
                                 W.ATOMIC_FETCH_AND_ADD else wqe.swap,
                                 wqe.compare_add if op == W.ATOMIC_CMP_AND_SWP else 0))
    mtu = qp.mtu
    first, last = idx == 0, idx == wqe.npkts - 1
    opcode = _OPC[op][_POS[(first, last)]]
    if qp.qp_type == QPType.UC:
        opcode += 0x20
    off = idx * mtu
    n = min(mtu, wqe.length - off)
    is_write = op in _WRITES
    return encode(
        opcode, dest_qp=dqpn, psn=psn, payload=gather(wqe, off, n),
        ackreq=(last or ackreq) and qp.qp_type == QPType.RC,
        se=last and bool(int(wqe.flags) & _SOLICITED),
        reth=(wqe.remote_addr, wqe.rkey, wqe.length) if first and is_write else None,
        imm=wqe.imm if last and op in WITH_IMM else None,
        ieth=wqe.inv_rkey if last and op == W.SEND_WITH_INV else None)


def _pack_only(qp, wqe, psn: int, dqpn: int) -> bytearray:
    """An RC request of one packet (``_ONLY``: a WRITE or SEND ONLY, with or without
    immediate or invalidate, a READ request, a COMPARE_SWAP or FETCH_ADD), packed
    straight: the bytes ``encode`` gives (AckReq set, SE as a SEND or WRITE asks,
    pad zeros)."""
    op = wqe.opcode
    opcode, hdr, reth, atomiceth, tail, message = _ONLY[op]
    n = wqe.length if message else 0
    pad = -n & 3
    buf = bytearray(hdr + n + pad)
    flags = (BTH_SE if message and int(wqe.flags) & _SOLICITED else 0) | (pad << BTH_PAD_SHIFT)
    if reth:
        _BTH_RETH.pack_into(buf, 0, opcode, flags, DEFAULT_PKEY, dqpn & QPN_MASK,
                            BTH_ACKREQ | psn, wqe.remote_addr, wqe.rkey, wqe.length)
    else:
        _HDR.pack_into(buf, 0, opcode, flags, DEFAULT_PKEY, dqpn & QPN_MASK, BTH_ACKREQ | psn)
        if atomiceth:
            if op is W.ATOMIC_FETCH_AND_ADD:
                _ATOMIC_ETH.pack_into(buf, BTH_LEN, wqe.remote_addr, wqe.rkey,
                                      wqe.compare_add, 0)
            else:
                _ATOMIC_ETH.pack_into(buf, BTH_LEN, wqe.remote_addr, wqe.rkey, wqe.swap,
                                      wqe.compare_add)
    if tail:
        _U32.pack_into(buf, hdr - 4, wqe.inv_rkey if op is W.SEND_WITH_INV else wqe.imm)
    if n:
        views = wqe.views
        buf[hdr:hdr + n] = views[0] if len(views) == 1 else gather(wqe, 0, n)
    return buf


def _bulk(dev, qp, wqe, idx: int, k: int, dest, ack_every: int) -> tuple[bytearray, int]:
    """Packets ``idx`` .. ``idx + k - 1`` of an RC ``wqe``, MIDDLEs (from a SEND's
    FIRST on, ``idx`` 0: ``_RUN_FIRST``) and (if it is among them: ``_run_end``)
    its LAST, ICRC and all, one after another in one buffer: ``k`` datagrams of
    ``seg`` bytes each (the LAST may be shorter).  The bytes are those
    ``_build`` and ``append_icrc`` give packet by packet; the AckReq bits follow
    ``qp.req.pkts_since_ackreq`` as ``generate`` does.
    Returns the buffer and ``seg``."""
    mtu = qp.mtu
    seg = BTH_LEN + mtu + ICRC_LEN
    last_idx = wqe.npkts - 1
    has_last = idx + k - 1 == last_idx
    nmid = k - has_last
    extra = 0
    if has_last:
        n_last = wqe.length - last_idx * mtu
        extra = BTH_LEN + _LAST[wqe.opcode][1] + n_last + (-n_last & 3) + ICRC_LEN
    psn = (wqe.first_psn + idx) & PSN_MASK
    views = wqe.views
    one = views[0] if len(views) == 1 else None
    off = idx * mtu
    buf, s = middle_run(dev, dest, _MIDDLE[wqe.opcode], qp.attr.dest_qp_num, psn, nmid, mtu,
                        one, off, qp.req.pkts_since_ackreq, ack_every, extra,
                        lambda o: gather(wqe, o, mtu),
                        _RUN_FIRST[wqe.opcode] if idx == 0 else None)
    if has_last:
        s = 0                       # a LAST asks for an ACK: the count starts again
        psn = (psn + nmid) & PSN_MASK
        off += nmid * mtu
        if type(buf) is Gather:
            buf.last = _run_last(dev, qp, wqe, psn, off, n_last, dest)
        else:
            _run_last(dev, qp, wqe, psn, off, n_last, dest, buf, nmid * seg)
    qp.req.pkts_since_ackreq = s
    return buf, seg


def middle_run(dev, dest, mid: int, dqpn: int, psn: int, count: int, mtu: int, src, off: int,
               s: int, ack_every: int, extra: int = 0, part=None, first: int | None = None):
    """The one builder of a run of a message's MIDDLE packets: a SEND's or WRITE's
    request MIDDLEs (``_bulk``), a READ's RESPONSE MIDDLEs (``output``).
    ``count`` packets of opcode ``mid`` to QP ``dqpn``, PSNs from ``psn`` on, each
    a BTH, an MTU of the message's bytes from ``src[off:]`` (``src`` None, or
    too short: ``part(offset)`` gives each MTU) and its ICRC (sent to ``dest``),
    one after another in a new buffer with ``extra`` bytes of room after them
    (for what the caller puts there).  The AckReq bit follows the count ``s`` of
    packets since the last that asked, as ``_send_packet`` sets it: set when
    the count reaches ``ack_every`` (a READ response never asks: 0xFFFFFFFF).
    With the kernel and a driver that gathers, the payload stays where it is: a
    ``Gather`` of the run (its ``last`` None), no room after it.
    ``first``: the run starts at a SEND's FIRST, which has a MIDDLE's layout;
    its first packet is built as the others are, under that opcode (and so
    from that opcode's ICRC state).
    Returns the buffer (or ``Gather``) and the count ``s`` after the run."""
    seg = BTH_LEN + mtu + ICRC_LEN
    dqpn &= QPN_MASK
    start = tx_icrc_start(dev, dest, seg, mid, 0, dqpn)
    w0 = bth_word0(mid)
    lead = 0                                            # packets under ``first``: 0 or 1
    if first is not None and count:
        lead = 1
        start0 = tx_icrc_start(dev, dest, seg, first, 0, dqpn)
        w00 = bth_word0(first)
    one = src if src is not None and off + count * mtu <= len(src) else None
    kern = dev.kernel
    o = 0
    if kern is not None and one is not None and count:
        ffi = kern.ffi
        lib = kern.lib
        p = ffi.from_buffer(one) + off
        if dev.tx_gather:
            # the loop below, in C, but for the payload, which stays where it is
            heads = bytearray(_HEAD_BYTES * count)
            h = ffi.from_buffer(heads, require_writable=True)
            if lead:
                s = lib.sn_tx_heads(h, 1, w00, dqpn, psn, s, ack_every, p, mtu, start0)
            s = lib.sn_tx_heads(h + _HEAD_BYTES * lead, count - lead, w0, dqpn,
                                (psn + lead) & PSN_MASK, s, ack_every, p + mtu * lead, mtu,
                                start)
            return Gather(heads, one[off:off + count * mtu], mtu, count, None), s
        buf = bytearray(count * seg + extra)
        b = ffi.from_buffer(buf, require_writable=True)
        # the loop below, in C
        if lead:
            s = lib.sn_tx_middles(b, 0, 1, w00, dqpn, psn, s, ack_every, p, mtu, start0)
        s = lib.sn_tx_middles(b, seg * lead, count - lead, w0, dqpn, (psn + lead) & PSN_MASK,
                              s, ack_every, p + mtu * lead, mtu, start)
        return buf, s
    buf = bytearray(count * seg + extra)
    mv = memoryview(buf)
    pack, put = _HDR.pack_into, _ICRC.pack_into
    op, st = (first, start0) if lead else (mid, start)
    for _ in range(count):
        s += 1
        if s >= ack_every:
            s = 0
            pack(buf, o, op, 0, DEFAULT_PKEY, dqpn, BTH_ACKREQ | psn)
        else:
            pack(buf, o, op, 0, DEFAULT_PKEY, dqpn, psn)
        e = o + BTH_LEN + mtu
        mv[o + BTH_LEN:e] = one[off:off + mtu] if one is not None else part(off)
        put(buf, e, crc32(mv[o + 8:e], st) & 0xFFFFFFFF)
        psn = (psn + 1) & PSN_MASK
        off += mtu
        o = e + ICRC_LEN
        op, st = mid, start
    return buf, s


def _run_end(qp, wqe) -> int:
    """Where ``_bulk_run``'s run of ``wqe``'s packets ends: after its LAST if a run
    may carry it, as a datagram no longer than a MIDDLE's (a segmented send's
    rule: a plain LAST always, one with an ImmDt or IETH when its payload and
    pad leave room for those 4 bytes in an MTU), else before it."""
    tail = _LAST[wqe.opcode][1]
    if tail:
        n = wqe.length - (wqe.npkts - 1) * qp.mtu
        if n + (-n & 3) + tail > qp.mtu:
            return wqe.npkts - 1
    return wqe.npkts


def _run_last(dev, qp, wqe, psn: int, off: int, n: int, dest, buf=None, o: int = 0):
    """The LAST of a run (``n`` bytes of ``wqe``'s payload from ``off``, PSN ``psn``,
    after its ImmDt or IETH if it has one), ICRC and all, into ``buf`` at ``o``
    (None: a new buffer, returned): the bytes ``_build_rc`` gives for it.  It
    asks for an ACK, as every LAST does."""
    pad = -n & 3
    lop, tail = _LAST[wqe.opcode]
    if buf is None:
        buf = bytearray(BTH_LEN + tail + n + pad + ICRC_LEN)
    flags = (BTH_SE if int(wqe.flags) & _SOLICITED else 0) | (pad << BTH_PAD_SHIFT)
    dqpn = qp.attr.dest_qp_num & QPN_MASK
    _HDR.pack_into(buf, o, lop, flags, DEFAULT_PKEY, dqpn, BTH_ACKREQ | psn)
    h = o + BTH_LEN
    if tail:
        _U32.pack_into(buf, h, wqe.inv_rkey if wqe.opcode is W.SEND_WITH_INV else wqe.imm)
        h += tail
    e = h + n
    mv = memoryview(buf)
    mv[h:e] = gather(wqe, off, n)
    e += pad                                                     # zeros
    start = tx_icrc_start(dev, dest, e + ICRC_LEN - o, lop, flags, dqpn)
    _ICRC.pack_into(buf, e, crc32(mv[o + 8:e], start) & 0xFFFFFFFF)
    return buf


def tx_icrc_start(dev, dest, size: int, op: int, flags: int, dqpn: int) -> int:
    """``icrc_start`` for a datagram of ``size`` bytes from this device to ``dest``
    whose BTH begins with opcode ``op``, ``flags`` (SE, pad) and QP ``dqpn``:
    what the builders of runs (``middle_run``, ``_run_last``) compute each
    packet's ICRC from (remembered in ``dev.tx_starts``: the same few are asked
    of every run)."""
    key = (dest, size, op, flags, dqpn)
    memo = dev.tx_starts
    c = memo.get(key)
    if c is None:
        if len(memo) >= MEMO_MAX:
            memo.clear()
        c = memo[key] = icrc_start(dev.ip, dest[0], dev.port, dest[1], size,
                                   _HEAD.pack(op, flags, DEFAULT_PKEY, dqpn))
    return c



class Run(NamedTuple):
    """``count`` packets of ``seg`` bytes each (the last may be shorter), ICRCs
    included, one after another in ``buf`` (a ``bytearray`` or a ``Gather``), all to
    ``dest``: a request's MIDDLEs (``_bulk_run``) or a READ's RESPONSE MIDDLEs
    (``Output._read_run``), as ``generate`` and ``Output`` put them in their list
    of what leaves, beside single packets, ``(bytes, dest)`` tuples; and as
    ``Device.datagram_runs`` hands them to a driver, told apart from those by
    their type."""
    buf: object
    dest: tuple
    seg: int
    count: int


class Sealed(NamedTuple):
    """One packet with its ICRC, to ``dest``: a request of one packet the compiled
    requester built whole (``softnic/accel/requester.c``'s ``one_packet``), in the
    list of what leaves beside ``(bytes, dest)`` tuples, which ``Output._sealed``
    gives their ICRCs and passes this on as one of them."""
    pkt: bytearray
    dest: tuple


class Gather:
    """A run ``_bulk`` left in registered memory for a driver that gathers
    (``Device.tx_gather``): ``count`` MIDDLEs, each its BTH and ICRC (16 bytes
    of ``heads``: the kernel's ``sn_tx_heads``) around its MTU of ``src``, then
    ``last`` (its LAST, built whole by ``_run_last``) if not None.  ``flatten()`` is the run
    laid end to end, the bytes ``_bulk`` builds without it."""

    __slots__ = ("heads", "src", "mtu", "count", "last")

    def __init__(self, heads: bytearray, src: memoryview, mtu: int, count: int, last):
        self.heads = heads
        self.src = src
        self.mtu = mtu
        self.count = count
        self.last = last

    def __len__(self) -> int:
        return self.count * (BTH_LEN + self.mtu + ICRC_LEN) + \
            (len(self.last) if self.last is not None else 0)

    def part(self, i: int, j: int) -> "Gather":
        """Packets ``i`` .. ``j - 1`` of the run (index ``count`` is the LAST), as a
        run of their own: what survives of it where a fault model drops some."""
        mtu = self.mtu
        k = min(j, self.count)
        return Gather(self.heads[_HEAD_BYTES * i:_HEAD_BYTES * k] if i < k else bytearray(),
                      self.src[i * mtu:k * mtu] if i < k else self.src[0:0], mtu,
                      max(0, k - i), self.last if j > self.count else None)

    def flatten(self) -> bytearray:
        h, src, mtu = memoryview(self.heads), self.src, self.mtu
        parts = []
        for i in range(self.count):
            h0 = _HEAD_BYTES * i
            parts += (h[h0:h0 + BTH_LEN], src[i * mtu:(i + 1) * mtu],
                      h[h0 + BTH_LEN:h0 + _HEAD_BYTES])
        if self.last is not None:
            parts.append(self.last)
        return bytearray(b"".join(parts))


def wqe_index(qp, psn: int):
    """Index in the SQ of the started WQE whose PSN range holds ``psn``."""
    for i, w in enumerate(qp.sq):
        if w.first_psn is None:
            break
        if w.done:
            continue
        if psn_diff(psn, w.first_psn) >= 0 and psn_diff(psn, w.last_psn) <= 0:
            return i
    return None


def rewind(qp, psn: int) -> None:
    """Go back N: resend everything from ``psn`` on."""
    i = wqe_index(qp, psn)
    if i is None:
        return
    if qp.cc is not None and qp.ccs.sent:
        cc_lost_from(qp, psn)
    qp.req.send_idx = i
    w = qp.sq[i]
    w.next_pkt = (psn - w.first_psn) & PSN_MASK
    for j in range(i + 1, len(qp.sq)):
        qp.sq[j].next_pkt = 0
    qp.comp.rexmit.clear()


def _window_room(qp, psn: int) -> int:
    """How many PSNs from ``psn`` on the window admits now (none: ``psn`` waits).
    Go-back-N counts every unacknowledged packet.  Selective repeat counts those
    beyond the highest PSN the responder reported holding (IRN's BDP cap), within
    the span the responder will hold."""
    comp = qp.comp
    base = (comp.acked_psn + 1) & PSN_MASK
    if qp.selective_repeat:
        room = SR_SPAN * qp.window - psn_diff(psn, base)
        sacked = comp.sacked_psn
        if sacked is not None and psn_diff(sacked, base) >= 0:
            base = (sacked + 1) & PSN_MASK
        return min(room, qp.window - psn_diff(psn, base))
    d = (psn - base) & PSN_MASK           # psn_diff(psn, base), inline (asked per packet)
    return qp.window - (d - PSN_MODULUS if d & PSN_HALF else d)


# ---------------------------------------------------------------- congestion control
#
# Only a QP with a controller (``qp.cc``) pays for any of this.  The controller's
# window caps the bytes sent and not yet acknowledged; its rate spaces packets
# ``bytes * 8 / rate`` apart (a token bucket of depth one packet), timed from the
# ACK instead where a window below one packet is clocked by ACKs (``cc_acked``,
# ``Controller.ack_clocked``): a packet held back sets ``qp.ccs.pace_at``, the
# time of the next one, and the device's timer is armed for it by ``generate``'s
# caller (``Output._requests`` arms every controlled QP after ``generate``, for
# the controller's own timers too).

#: IPv4 + UDP header bytes counted with each datagram (what a link carries)
WIRE_OVERHEAD = 28


def _cc_blocked(qp, now: float, resend: bool) -> bool:
    """Does the congestion controller hold the QP's next packet (a resend: only
    the pacer holds it)?  The controller's window while its bytes in flight fill
    it; its rate until ``qp.ccs.next_tx``, the time then kept in ``qp.ccs.pace_at``."""
    cc = qp.cc
    ccs = qp.ccs
    if not resend and cc.window is not None and ccs.inflight and ccs.inflight >= cc.window:
        return True                       # an ACK (progress) makes the QP ready again
    if cc.rate is not None and now < ccs.next_tx:
        ccs.pace_at = ccs.next_tx         # (armed by the caller: see above)
        return True
    return False


def _cc_sent(qp, psn: int, nbytes: int, now: float, resent: bool) -> None:
    cc = qp.cc
    ccs = qp.ccs
    size = nbytes + WIRE_OVERHEAD
    rate = cc.rate
    if rate:
        t = ccs.next_tx if ccs.next_tx > now else now
        ccs.next_tx = t + size * 8 / rate
    if qp.qp_type is _RC:
        sent = ccs.sent
        old = sent.get(psn)
        if old is not None:
            ccs.inflight -= old[1]
            resent = True
        sent[psn] = (now, size, resent)
        ccs.inflight += size
    cc.on_packet_sent(now=now, nbytes=size, psn=psn, retransmit=resent)


def cc_lost_from(qp, psn: int) -> None:
    """Packets from ``psn`` on are presumed lost: they leave the in-flight count
    (their resends count again, marked as resent so they give no RTT sample)."""
    ccs = qp.ccs
    sent = ccs.sent
    # every PSN in ``sent`` was sent, so none is beyond ``max_sent_psn``: those from
    # ``psn`` on are that range's (walked as ``cc_acked`` walks an ACK's, when it
    # is not much longer than ``sent``)
    n = psn_diff(qp.req.max_sent_psn, psn) + 1
    if n <= 0:
        return
    if n <= 2 * len(sent):
        pop = sent.pop
        nbytes = 0
        for p in range(psn, psn + n):
            e = pop(p & PSN_MASK, None)
            if e is not None:
                nbytes += e[1]
        ccs.inflight -= nbytes
        return
    # else (a long range, few entries): each entry at or after ``psn``
    for p in [p for p in sent if not psn_before(p, psn)]:
        ccs.inflight -= sent.pop(p)[1]


def cc_acked(qp, before: int, now: float) -> None:
    """The cumulative ACK moved from ``before`` to ``qp.comp.acked_psn``: tell the
    controller.  Then, for a controller whose window below one packet is clocked by
    ACKs (``Controller.ack_clocked``), the ACK of the packet that held the window
    alone times the next: it leaves (that packet's bytes - window) * 8 / rate from
    now, the part of its spacing beyond the window's own RTT."""
    ccs = qp.ccs
    sent = ccs.sent
    acked = qp.comp.acked_psn
    nbytes = 0
    size = 0                                  # the last packet acknowledged
    rtt = None
    if sent:
        n = psn_diff(acked, before)
        if n <= 2 * len(sent):
            psns = range(before + 1, before + n + 1)      # (masked below)
        else:
            psns = [p for p in sent if psn_diff(p, acked) <= 0]
        pop = sent.pop
        for p in psns:
            e = pop(p & PSN_MASK, None)
            if e is not None:
                size = e[1]
                nbytes += size
                if not e[2]:
                    rtt = now - e[0]          # the newest original packet acknowledged
        ccs.inflight -= nbytes
    tel, ccs.rx_telemetry = ccs.rx_telemetry, None
    cc = qp.cc
    cc.on_ack(now=now, acked_bytes=nbytes, rtt=rtt, telemetry=tel)
    if cc.ack_clocked and size and not ccs.inflight:
        window = cc.window
        rate = cc.rate
        if window is not None and rate and window < size:
            ccs.next_tx = now + (size - window) * 8 / rate


def generate(dev, qp, now: float, out: list) -> None:
    """Append this QP's request packets (as (bytes, dest)) to ``out`` while it may
    send.  One chain of checks, each rule in the function named, as rxe's
    requester (``rxe_requester``) is:

    ========  ==================================================================
    IDLE      nothing in an RNR wait or outside RTS and SQD
    HELD      nothing while a paced QP's pacer holds what is up next
              (``held_by_pacer``: the chain would stop at PACER, changing nothing)
    RESEND    selective repeat's single PSNs first (``_resend_singles``)
    then, WQE by WQE in send queue order:
    START     a new WQE takes its PSNs if it may (``_may_start``: SQD, fence,
              READ/ATOMIC credits, the window; ``start``: local keys, PSNs); a
              local operation or a local error ends there
    then, packet by packet of that WQE until it is all sent:
    WINDOW    its next packet waits for room in the window (``_window_room``)
    PACER     or for the congestion controller (``_cc_blocked``)
    SEND      a run of MIDDLEs, a SEND's from its FIRST on (``_bulk_run``), or
              one packet (``_send_packet``: its AckReq cadence, the go-back-N
              record ``_record_sent``, the bytes ``_build``, the controller's
              ``_cc_sent``)
    ========  ==================================================================

    The cheap cases are this chain ending early, not other code: a lone
    one-packet request of any opcode (a ping-pong's, an RPC's) is IDLE, START,
    SEND and the end of the queue, its bytes packed straight (``_pack_only``); a
    paced QP's MIDDLE is WINDOW, PACER, SEND, then back to WINDOW and PACER for
    the same WQE's next packet (not through the send queue's walk), where one of
    them stops."""
    comp = qp.comp
    if comp.rnr_wait or qp.state not in _SENDING:                       # IDLE
        return
    if qp.cc is not None and qp.ccs.pace_at is not None and dev.fast \
            and held_by_pacer(qp, now):                               # HELD
        return
    qtype = qp.qp_type
    rc = qtype is _RC
    dest = qp.dest if qtype is not _UD else None
    cc = qp.cc if qtype is not _UD else None
    if comp.rexmit and not _resend_singles(dev, qp, now, out, dest, cc):  # RESEND
        return
    ack_every = dev.config.ack_every or qp.window // 4 or 1
    sq = qp.sq
    req = qp.req
    while req.send_idx < len(sq) and not req.error:
        wqe = sq[req.send_idx]
        if wqe.first_psn is None and not wqe.done:                     # START
            if not _may_start(qp, wqe, rc):
                break
            start(dev, qp, wqe)
            if wqe.done:                                # local op or local error
                if wqe.status is not None and wqe.status != WCStatus.SUCCESS:
                    req.error = True
                req.send_idx += 1
                continue
        elif wqe.done:
            req.send_idx += 1
            continue
        while True:     # the WQE's packets: WINDOW, PACER, SEND until it is all sent
            nxt = wqe.next_pkt
            psn = (wqe.first_psn + nxt) & PSN_MASK
            if nxt and rc and _window_room(qp, psn) <= 0:              # WINDOW
                return  # (a first packet's room was _may_start's to check)
            if cc is not None and _cc_blocked(qp, now, False):    # PACER
                return
            if dest is None:                                           # SEND
                dest = wqe.dest
            if rc and cc is None and (nxt or wqe.npkts > 1 and wqe.opcode in _RUN_FIRST) \
                    and wqe.opcode in _MIDDLE and qp.xrc is None and dev.fast \
                    and _bulk_run(dev, qp, wqe, psn, dest, ack_every, out):
                if wqe.next_pkt < wqe.npkts:
                    continue
            elif _send_packet(dev, qp, wqe, psn, ack_every, cc, now, out, dest, rc):
                continue
            break       # all sent (req.send_idx moved on): the next WQE, if any
        if qtype is _UD:
            dest = None


def held_by_pacer(qp, now: float) -> bool:
    """Would ``generate`` stop at once, changing nothing?  So it does for a paced QP
    whose next packet's time has not come and whose pacing timer is armed for that
    time (``_cc_blocked`` is then true and changes nothing), when the WQE up next
    has its PSNs (or there is none): a resend or the WQE's next packet meets
    ``_cc_blocked`` first, or the window.  (A WQE not yet started is left to the
    loop: it takes its PSNs even when the controller holds its packets.)"""
    cc = qp.cc
    if cc is None or qp.qp_type is _UD or cc.rate is None:
        return False
    ccs = qp.ccs
    if not now < ccs.next_tx or ccs.pace_at != ccs.next_tx:
        return False
    req = qp.req
    i = req.send_idx
    sq = qp.sq
    if i >= len(sq) or req.error:
        return True
    wqe = sq[i]
    return wqe.first_psn is not None and not wqe.done


def _resend_singles(dev, qp, now: float, out: list, dest, cc) -> bool:
    """Selective repeat: the single lost PSNs (or READ response ranges) named for
    resending, oldest first.  False if the congestion controller holds them."""
    rexmit = qp.comp.rexmit
    while rexmit:
        if cc is not None and _cc_blocked(qp, now, True):
            return False
        item = rexmit.popleft()
        psn, count = item if isinstance(item, tuple) else (item, None)
        i = wqe_index(qp, psn)
        if i is None:
            continue
        w = qp.sq[i]
        idx = 0 if w.rd_atomic and w.opcode != W.RDMA_READ else (psn - w.first_psn) & PSN_MASK
        dev.counters["retransmitted_pkts"] += 1
        pkt = _build(dev, qp, w, idx, True, count)
        if cc is not None:
            _cc_sent(qp, psn, len(pkt) + 4, now, True)
        out.append((pkt, dest))
    return True


def _may_start(qp, wqe, rc: bool) -> bool:
    """May the next WQE take its PSNs now?  Not in SQD (it starts nothing new),
    not behind a fence while READs or ATOMICs are outstanding, not beyond the
    READ/ATOMIC credits (max_rd_atomic), not beyond the window."""
    if qp.state is not _RTS:
        return False
    req = qp.req
    if wqe.flags & _FENCE and req.rd_atomic:
        return False
    if wqe.rd_atomic and req.rd_atomic >= max(1, qp.attr.max_rd_atomic):
        return False
    return not rc or _window_room(qp, req.psn) > 0


def _bulk_run(dev, qp, wqe, psn: int, dest, ack_every: int, out: list) -> bool:
    """The bulk of a long message: its MIDDLEs (a SEND's from its FIRST on) and
    its LAST (``_run_end``) that the window admits, built in one pass into one buffer, ICRCs
    included (``_bulk``), so that they leave in one send of the driver's.  The
    same packets, bytes and bookkeeping as ``_send_packet`` one at a time."""
    idx = wqe.next_pkt
    end = _run_end(qp, wqe)
    k = min(end - idx, _window_room(qp, psn))
    if k <= 0:
        return False
    _record_sent(dev, qp, psn, k)
    buf, seg = _bulk(dev, qp, wqe, idx, k, dest, ack_every)
    out.append(Run(buf, dest, seg, k))
    wqe.next_pkt = idx + k
    if wqe.next_pkt >= wqe.npkts:
        qp.req.send_idx += 1
    return True


def _send_packet(dev, qp, wqe, psn: int, ack_every: int, cc, now: float, out: list,
                 dest, rc: bool) -> bool:
    """Send ``wqe``'s next packet (PSN ``psn``): its AckReq bit, its place in the
    go-back-N record of what was sent, its bytes, the controller's accounting.
    True: the WQE has more packets to send."""
    nxt = wqe.next_pkt
    npkts = wqe.npkts
    # The AckReq cadence: every ``ack_every``-th new packet since the last that
    # asked asks for an ACK, and so does any a controller wants one for.  On RC a
    # LAST, an ONLY, a READ or an atomic always asks (as rxe's; ``_build`` sets the
    # bit), so the count restarts there too.  (A resend's AckReq leaves the count
    # of new packets as it is: ``_resend_singles`` does not come here.)
    req = qp.req
    n = req.pkts_since_ackreq + 1
    ackreq = n >= ack_every or (cc is not None and _cc_wants_ack(dev, qp, cc, ack_every))
    req.pkts_since_ackreq = 0 if ackreq or (rc and (wqe.rd_atomic or nxt == npkts - 1)) else n
    resent = _record_sent(dev, qp, psn, 1) if rc else False
    pkt = _build(dev, qp, wqe, nxt, ackreq)
    if cc is not None:
        _cc_sent(qp, psn, len(pkt) + 4, now, resent)
    out.append((pkt, dest))             # (a UD WQE's own: ``generate`` passes it)
    # one READ or ATOMIC request covers the whole PSN range
    nxt = npkts if wqe.rd_atomic else nxt + 1
    wqe.next_pkt = nxt
    if nxt >= npkts:
        req.send_idx += 1
        if not rc:                        # UC / UD: done once on the wire
            wqe.done = True
            wqe.status = WCStatus.SUCCESS
        return False
    return True


def _record_sent(dev, qp, psn: int, k: int) -> bool:
    """The go-back-N record of what was sent, for RC PSNs ``psn`` .. ``psn + k - 1``
    leaving now: those at or below the highest PSN sent before are resends
    (counted); the highest moves up.  True: the first of them is a resend."""
    req = qp.req
    d = (req.max_sent_psn - psn) & PSN_MASK    # psn_diff(max_sent_psn, psn), inline
    ahead = (d - PSN_MODULUS if d & PSN_HALF else d) + 1    # how many were sent before
    if ahead > 0:
        dev.counters["retransmitted_pkts"] += ahead if ahead < k else k
    if ahead < k:
        req.max_sent_psn = (psn + k - 1) & PSN_MASK
    return ahead > 0


def _cc_wants_ack(dev, qp, cc, ack_every: int) -> bool:
    """Does a congestion-controlled QP need an ACK for this packet anyway?"""
    if cc.window is not None:
        # A window controller needs every packet's feedback (HPCC, Swift), and
        # a window that shrinks below what is in flight reopens only by ACKs.
        return True
    # paced so slowly that waiting for ack_every packets would run the
    # retransmission timer out: ask for an ACK now.  (The timeout is never below
    # the timer floor, so a wait under a quarter of the floor needs no look at it:
    # asked per packet.)
    rate = cc.rate
    if not rate:
        return False
    wait = (qp.mtu + 60) * 8 / rate * ack_every
    return wait > dev.config.min_timer / 4 and wait > dev.rto(qp) / 4
