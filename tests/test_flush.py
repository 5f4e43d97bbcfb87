"""RDMA FLUSH (IBTA Memory Placement Extensions, as rxe since Linux 6.2): opcode 0x1C,
a FETH (placement type, selectivity level) and a RETH, answered by an empty RDMA READ
RESPONSE ONLY; the QP must allow each placement type asked (else a NAK, invalid
request), the memory region too (else a NAK, remote access error); a range must lie in
the region, the whole region (selectivity level 1) need not be named by the RETH.  A
duplicate is answered again, not run again.  No memory is persistent: an MR asking for
FLUSH_PERSISTENT is refused (EINVAL), as rxe refuses it over memory that is not pmem."""

from __future__ import annotations

import errno

import pytest

from enginekit import pair, write_wr
from softnic.core.enums import Access, SendFlags, WCOpcode, WCStatus, WROpcode as W
from softnic.core.errors import VerbsError
from softnic.core.qp import SendWR
from softnic.experiments.rig import ALL_ACCESS
from softnic.wire.roce import FETH, Kind, NakCode

SIG = SendFlags.SIGNALED
GLOBAL, PERSISTENT = 1, 2           # placement types (ibv_placement_type)
RANGE, WHOLE_MR = 0, 1              # selectivity levels (ibv_selectivity_level)
QP_FLUSH = (ALL_ACCESS & ~Access.LOCAL_WRITE) | Access.FLUSH_GLOBAL | Access.FLUSH_PERSISTENT
MR_FLUSH = ALL_ACCESS | Access.FLUSH_GLOBAL


def _flush_pair(qp_access=QP_FLUSH, mr_access=MR_FLUSH, **kw):
    return pair(qp_access=qp_access, endpoint_args=dict(mr_access=mr_access), **kw)


def _flush(p, wr_id, *, addr=None, length=64, ptype=GLOBAL, level=RANGE, rkey=None):
    b = p.eb
    p.ea.dev.post_send(p.ea.qp, SendWR(wr_id, W.FLUSH, [], SIG,
                                       remote_addr=b.buf.addr if addr is None else addr,
                                       rkey=b.mr.rkey if rkey is None else rkey,
                                       flush_type=ptype, flush_level=level, length=length))


def test_flush_after_write_is_answered_by_an_empty_read_response():
    p = _flush_pair()
    a = p.ea
    p.ea.dev.post_send(a.qp, write_wr(1, a, p.eb, 0, 256, 0))
    _flush(p, 2, length=256)
    p.run()
    wcs = p.send_wcs("a")
    assert [(w.wr_id, w.status, w.opcode) for w in wcs] == [
        (1, WCStatus.SUCCESS, WCOpcode.RDMA_WRITE), (2, WCStatus.SUCCESS, WCOpcode.FLUSH)]
    assert wcs[1].byte_len == 256
    req = [pkt for _, pkt in p.packets(src=p.a) if pkt.info.is_request]
    resp = [pkt for _, pkt in p.packets(src=p.b)]
    assert [x.info.name for x in req] == ["RC_RDMA_WRITE_ONLY", "RC_FLUSH"]
    flush = req[1]
    assert flush.feth == FETH(RANGE, GLOBAL) and flush.bth.ackreq
    assert (flush.reth.va, flush.reth.rkey, flush.reth.dma_len) == (
        p.eb.buf.addr, p.eb.mr.rkey, 256)
    assert resp[-1].info.name == "RC_RDMA_READ_RESPONSE_ONLY" and bytes(resp[-1].payload) == b""
    assert resp[-1].bth.psn == flush.bth.psn


def test_flush_of_the_whole_region_needs_no_range_inside_it():
    """Selectivity level 1: the RETH's address and length are not checked (rdma-core's
    tests flush up to 12 MB of a 1 KB region so)."""
    p = _flush_pair()
    _flush(p, 1, addr=0, length=12_345_678, level=WHOLE_MR)
    _flush(p, 2, addr=p.eb.buf.addr, length=0, level=WHOLE_MR)
    p.run()
    assert [w.status for w in p.send_wcs("a")] == [WCStatus.SUCCESS] * 2


def test_flush_of_a_range_outside_the_region_is_a_remote_access_error():
    p = _flush_pair()
    _flush(p, 1, addr=p.eb.buf.addr + p.eb.buf.length - 8, length=64)
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.REM_ACCESS_ERR
    naks = [pkt for _, pkt in p.packets(src=p.b) if pkt.info.kind == Kind.ACK]
    assert naks[-1].aeth.value == NakCode.REMOTE_ACCESS_ERROR


@pytest.mark.parametrize("qp_access, mr_access, ptype, status", [
    # the QP does not allow the placement type: invalid request (rxe check_qp_attr_access)
    (ALL_ACCESS & ~Access.LOCAL_WRITE, MR_FLUSH, GLOBAL, WCStatus.REM_INV_REQ_ERR),
    (QP_FLUSH & ~Access.FLUSH_PERSISTENT, MR_FLUSH, PERSISTENT, WCStatus.REM_INV_REQ_ERR),
    # the MR does not: remote access error (rxe check_rkey; rdma-core's
    # test_qp_ex_rc_flush_type_violate: a PERSISTENT flush of a FLUSH_GLOBAL MR)
    (QP_FLUSH, ALL_ACCESS, GLOBAL, WCStatus.REM_ACCESS_ERR),
    (QP_FLUSH, MR_FLUSH, PERSISTENT, WCStatus.REM_ACCESS_ERR),
    (QP_FLUSH, MR_FLUSH, GLOBAL | PERSISTENT, WCStatus.REM_ACCESS_ERR),
    (QP_FLUSH, MR_FLUSH, GLOBAL, WCStatus.SUCCESS),
])
def test_flush_access_checks(qp_access, mr_access, ptype, status):
    p = _flush_pair(qp_access=qp_access, mr_access=mr_access)
    _flush(p, 1, ptype=ptype)
    p.run()
    assert p.send_wcs("a")[-1].status == status


def test_an_unknown_rkey_is_a_remote_access_error_whatever_the_length():
    p = _flush_pair()
    _flush(p, 1, rkey=p.eb.mr.rkey ^ 0x100, length=0)
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.REM_ACCESS_ERR


def test_a_lost_response_brings_the_flush_again_and_it_is_answered_again():
    lost = []

    def drop_first_response(pkt, raw):
        if pkt.info.kind == Kind.READ_RESPONSE and not lost:
            lost.append(pkt)
            return True
        return False

    p = _flush_pair(drop_b=drop_first_response)
    _flush(p, 1)
    p.run()
    assert lost and p.send_wcs("a")[-1].status == WCStatus.SUCCESS
    flushes = [pkt for _, pkt in p.packets(src=p.a) if pkt.info.kind == Kind.FLUSH]
    assert len(flushes) == 2 and flushes[0].bth.psn == flushes[1].bth.psn
    assert p.eb.dev.counters["duplicate_dropped"] == 0


def test_post_send_refuses_a_bad_flush():
    p = _flush_pair()
    a, b = p.ea, p.eb
    for kw in (dict(flush_type=0), dict(flush_type=4), dict(flush_level=2),
               dict(sg_list=[a.sge(0, 8)])):
        args = dict(flush_type=GLOBAL, flush_level=RANGE, sg_list=[]) | kw
        with pytest.raises(VerbsError):
            a.dev.post_send(a.qp, SendWR(1, W.FLUSH, args.pop("sg_list"), SIG,
                                         remote_addr=b.buf.addr, rkey=b.mr.rkey, length=8,
                                         **args))


def test_a_flush_posted_inline_flushes_its_whole_range():
    """IBV_SEND_INLINE applies only to the WR opcodes that carry data (rxe's
    WR_INLINE_MASK: the SENDs and WRITEs); a FLUSH carries none, so the flag is
    ignored: the range is not taken for inline data (its length checked against
    max_inline_data, or emptied to the WR's SGEs, none)."""
    p = _flush_pair()
    a, b = p.ea, p.eb
    room = a.qp.cap.max_inline_data
    lengths = (64, room + 64)                   # within max_inline_data, beyond it
    assert room + 64 <= b.buf.length
    for wr_id, length in enumerate(lengths, 1):
        a.dev.post_send(a.qp, SendWR(wr_id, W.FLUSH, [], SIG | SendFlags.INLINE,
                                     remote_addr=b.buf.addr, rkey=b.mr.rkey,
                                     flush_type=GLOBAL, flush_level=RANGE, length=length))
    p.run()
    wcs = p.send_wcs("a")
    assert [(w.wr_id, w.status, w.byte_len) for w in wcs] == [
        (1, WCStatus.SUCCESS, lengths[0]), (2, WCStatus.SUCCESS, lengths[1])]
    flushes = [pkt for _, pkt in p.packets(src=p.a) if pkt.info.kind == Kind.FLUSH]
    assert [f.reth.dma_len for f in flushes] == list(lengths)


def test_no_memory_region_grants_persistence():
    p = pair()
    b = p.eb
    with pytest.raises(VerbsError):
        b.dev.reg_mr(b.pd, b.buf.addr, 4096, ALL_ACCESS | Access.FLUSH_PERSISTENT)
    mr = b.dev.reg_mr(b.pd, b.buf.addr, 4096, ALL_ACCESS | Access.FLUSH_GLOBAL)
    assert mr.access & Access.FLUSH_GLOBAL
    # nor does re-registering one: rereg's new access passes the same rule (EINVAL)
    with pytest.raises(VerbsError) as e:
        b.dev.keys.rereg(mr, 4, None, 0, 0, int(ALL_ACCESS | Access.FLUSH_PERSISTENT))
    assert e.value.errno == errno.EINVAL
    assert not mr.access & Access.FLUSH_PERSISTENT
