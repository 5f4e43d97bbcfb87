"""Verbs misuse: the errno each refused call gives, and the QP state table.

The modify_qp walk is driven by ``softnic.core.qp.TRANSITIONS``: for every QP
type and every (current, next) pair of states, a QP brought to the current
state through the API accepts the transition with exactly the required mask
bits (plus any optional ones), and refuses it with EINVAL when a required bit
is missing, when any bit outside required | optional is added, or when the
pair is not in the table at all.  A refused call leaves the QP as it was.
"""

from __future__ import annotations

import errno
import itertools
from dataclasses import replace

import pytest

from softnic.core.device import Device
from softnic.core.enums import Access, QPAttrMask as M, QPState, QPType, SendFlags, \
    WCStatus, WROpcode as W
from softnic.core.errors import VerbsError
from softnic.core.memory import Buffer
from softnic.core.qp import TRANSITIONS, AHAttr, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR
from softnic.driver.faults import FaultModel
from softnic.experiments.rig import ALL_ACCESS

from enginekit import B_IP, pair, send_wr, write_wr

S = QPState
ALL_BITS = [b for b in M]


def errno_of(call, *args) -> int:
    with pytest.raises(VerbsError) as e:
        call(*args)
    return e.value.errno


# ------------------------------------------------------------------ post-time errors


@pytest.fixture
def dev():
    return Device("d", "10.0.0.9")


def _qp(dev, qp_type=QPType.RC, cap=QPCap(4, 4, 2, 2, 16), srq=None):
    pd = dev.alloc_pd()
    cq = dev.create_cq(64)
    qp = dev.create_qp(pd, QPInitAttr(qp_type, cq, cq, srq, cap))
    buf = Buffer(8192)
    mr = dev.reg_mr(pd, buf.addr, buf.length, ALL_ACCESS)
    return qp, pd, cq, buf, mr


def _to(dev, qp, target: S):
    """Walk a fresh QP up to ``target`` with the masks the table requires."""
    path = {S.RESET: [], S.INIT: [S.INIT], S.RTR: [S.INIT, S.RTR],
            S.RTS: [S.INIT, S.RTR, S.RTS], S.SQD: [S.INIT, S.RTR, S.RTS, S.SQD],
            S.ERR: [S.INIT, S.ERR]}[target]
    cur = qp.state
    for nxt in path:
        required, _ = TRANSITIONS[(cur, nxt)][qp.qp_type]
        dev.modify_qp(qp, attr_for(nxt), M.STATE | required)
        cur = nxt
    assert qp.state == target


def attr_for(state: S) -> QPAttr:
    """Attribute values valid for any transition (a real GID, a supported MTU)."""
    return QPAttr(qp_state=state, cur_qp_state=S.RESET, path_mtu=3,
                  qp_access_flags=Access.REMOTE_WRITE | Access.REMOTE_READ,
                  qkey=0x1234, ah_attr=AHAttr(f"::ffff:{B_IP}", 4791), dest_qp_num=0x99,
                  rq_psn=0x10, sq_psn=0x20, max_rd_atomic=4, max_dest_rd_atomic=4,
                  min_rnr_timer=1, timeout=10, retry_cnt=3, rnr_retry=3)


@pytest.mark.parametrize("state", [S.RESET, S.INIT, S.RTR])
@pytest.mark.parametrize("qp_type", [QPType.RC, QPType.UC, QPType.UD])
def test_post_send_before_rts_is_einval(dev, qp_type, state):
    qp, pd, cq, buf, mr = _qp(dev, qp_type)
    _to(dev, qp, state)
    wr = SendWR(1, W.SEND, [(buf.addr, 8, mr.lkey)], SendFlags.SIGNALED,
                ah=AHAttr(f"::ffff:{B_IP}"), remote_qpn=5, remote_qkey=1)
    assert errno_of(dev.post_send, qp, wr) == errno.EINVAL
    assert cq.poll(8) == [] and len(qp.sq) == 0


def test_post_recv_in_reset_is_einval(dev):
    qp, pd, cq, buf, mr = _qp(dev)
    assert errno_of(dev.post_recv, qp, RecvWR(1, [(buf.addr, 8, mr.lkey)])) == errno.EINVAL
    _to(dev, qp, S.INIT)
    dev.post_recv(qp, RecvWR(1, [(buf.addr, 8, mr.lkey)]))     # INIT may receive


def test_send_queue_full_is_enomem():
    p = pair(endpoint_args=dict(max_send_wr=3))
    for i in range(3):
        p.a.post_send(p.ea.qp, send_wr(i, p.ea, 0, 8))
    assert errno_of(p.a.post_send, p.ea.qp, send_wr(9, p.ea, 0, 8)) == errno.ENOMEM
    # completions free the slots again
    for i in range(3):
        p.b.post_recv(p.eb.qp, RecvWR(i, [p.eb.sge(0, 64)]))
    p.run()
    assert [w.wr_id for w in p.send_wcs()] == [0, 1, 2]
    for i in range(3):
        p.a.post_send(p.ea.qp, send_wr(10 + i, p.ea, 0, 8, flags=0))


def test_receive_queue_full_is_enomem(dev):
    qp, pd, cq, buf, mr = _qp(dev, cap=QPCap(4, 3, 1, 1, 0))
    _to(dev, qp, S.INIT)
    for i in range(3):
        dev.post_recv(qp, RecvWR(i, [(buf.addr, 8, mr.lkey)]))
    assert errno_of(dev.post_recv, qp, RecvWR(9, [(buf.addr, 8, mr.lkey)])) == errno.ENOMEM


def test_srq_full_is_enomem(dev):
    pd = dev.alloc_pd()
    srq = dev.create_srq(pd, 2, 1)
    buf = Buffer(4096)
    mr = dev.reg_mr(pd, buf.addr, 4096, ALL_ACCESS)
    for i in range(2):
        dev.post_srq_recv(srq, RecvWR(i, [(buf.addr, 8, mr.lkey)]))
    assert errno_of(dev.post_srq_recv, srq, RecvWR(9, [(buf.addr, 8, mr.lkey)])) == errno.ENOMEM
    assert errno_of(dev.post_srq_recv, srq, RecvWR(9, [(buf.addr, 8, mr.lkey)] * 2)) \
        == errno.EINVAL


def test_send_caps_round_up_to_the_wqe_as_rxe_does():
    # rxe_qp_init_req: a send WQE holds max(SGEs * 16, inline bytes); both caps grow to it
    for sge, inline, want in [(1, 0, (1, 16)), (1, 8, (1, 16)), (2, 100, (6, 100)),
                              (4, 64, (4, 64)), (3, 0, (3, 48))]:
        qp = pair(endpoint_args=dict(max_sge=sge, max_inline=inline)).ea.qp
        assert (qp.cap.max_send_sge, qp.cap.max_inline_data) == want, (sge, inline)
        assert qp.cap.max_recv_sge == sge
    p = pair(endpoint_args=dict(max_sge=1, max_inline=0))
    p.a.post_send(p.ea.qp, SendWR(1, W.SEND, [p.ea.sge(0, 16)], SendFlags.INLINE))
    assert errno_of(p.a.post_send, p.ea.qp,
                    SendWR(2, W.SEND, [p.ea.sge(0, 17)], SendFlags.INLINE)) == errno.EINVAL


def test_too_many_sges_is_enomem_for_a_send_einval_for_a_receive():
    """As mlx5: ``_mlx5_post_send`` answers "max gs exceeded" with ENOMEM,
    ``mlx5_post_recv`` too many SGEs with EINVAL."""
    p = pair(endpoint_args=dict(max_sge=2, max_inline=0))
    sges = [p.ea.sge(i * 8, 8) for i in range(3)]
    assert errno_of(p.a.post_send, p.ea.qp, SendWR(1, W.SEND, sges)) == errno.ENOMEM
    rsges = [p.eb.sge(i * 8, 8) for i in range(3)]
    assert errno_of(p.b.post_recv, p.eb.qp, RecvWR(1, rsges)) == errno.EINVAL
    p.a.post_send(p.ea.qp, SendWR(2, W.SEND, sges[:2]))       # at the limit is fine
    p.b.post_recv(p.eb.qp, RecvWR(2, rsges[:2]))


def test_inline_above_max_inline_data_is_einval():
    p = pair(endpoint_args=dict(max_inline=64))
    ok = SendWR(1, W.SEND, [p.ea.sge(0, 64)], SendFlags.INLINE | SendFlags.SIGNALED)
    big = SendWR(2, W.SEND, [p.ea.sge(0, 40), p.ea.sge(100, 25)],
                 SendFlags.INLINE | SendFlags.SIGNALED)
    assert errno_of(p.a.post_send, p.ea.qp, big) == errno.EINVAL
    p.a.post_send(p.ea.qp, ok)


def test_mr_with_remote_write_or_atomic_but_no_local_write_is_einval(dev):
    pd = dev.alloc_pd()
    buf = Buffer(4096)
    for access in (Access.REMOTE_WRITE, Access.REMOTE_ATOMIC,
                   Access.REMOTE_WRITE | Access.REMOTE_READ):
        assert errno_of(dev.reg_mr, pd, buf.addr, 4096, access) == errno.EINVAL
    dev.reg_mr(pd, buf.addr, 4096, Access.REMOTE_READ)         # read-only remote access is fine
    dev.reg_mr(pd, buf.addr, 4096, Access.LOCAL_WRITE | Access.REMOTE_WRITE)


@pytest.mark.parametrize("qp_type,opcode", [
    (QPType.UC, W.RDMA_READ), (QPType.UC, W.ATOMIC_CMP_AND_SWP),
    (QPType.UC, W.ATOMIC_FETCH_AND_ADD), (QPType.UC, W.SEND_WITH_INV),
    (QPType.UD, W.RDMA_WRITE), (QPType.UD, W.RDMA_WRITE_WITH_IMM), (QPType.UD, W.RDMA_READ),
    (QPType.UD, W.ATOMIC_CMP_AND_SWP), (QPType.UD, W.ATOMIC_FETCH_AND_ADD),
    (QPType.UD, W.SEND_WITH_INV),
])
def test_opcode_not_valid_for_the_qp_type_is_einval(qp_type, opcode):
    p = pair(qp_type=qp_type)
    wr = SendWR(1, opcode, [p.ea.sge(0, 8)], SendFlags.SIGNALED,
                remote_addr=p.eb.buf.addr, rkey=p.eb.mr.rkey,
                ah=AHAttr(p.b.gid, p.b.port), remote_qpn=p.eb.qp.qpn, remote_qkey=0x11111111)
    assert errno_of(p.a.post_send, p.ea.qp, wr) == errno.EINVAL
    p.run()
    assert p.packets("send") == [] and p.send_wcs() == []


def test_unknown_opcode_is_einval():
    p = pair()
    assert errno_of(p.a.post_send, p.ea.qp, SendWR(1, 77, [p.ea.sge(0, 8)])) == errno.EINVAL


def test_atomic_needs_one_8_byte_sge():
    p = pair()
    for sges in ([p.ea.sge(0, 4)], [p.ea.sge(0, 16)], [p.ea.sge(0, 8), p.ea.sge(8, 8)]):
        wr = SendWR(1, W.ATOMIC_FETCH_AND_ADD, sges, SendFlags.SIGNALED,
                    remote_addr=p.eb.buf.addr, rkey=p.eb.mr.rkey)
        assert errno_of(p.a.post_send, p.ea.qp, wr) == errno.EINVAL


def test_refused_posts_leave_the_qp_working():
    p = pair(endpoint_args=dict(max_sge=1, max_inline=8))      # a 16-byte WQE
    bad = [SendWR(1, W.SEND, [p.ea.sge(0, 8)] * 2),
           SendWR(2, W.SEND, [p.ea.sge(0, 17)], SendFlags.INLINE),
           SendWR(3, W.ATOMIC_FETCH_AND_ADD, [p.ea.sge(0, 8)], remote_addr=p.eb.buf.addr + 1,
                  rkey=p.eb.mr.rkey)]
    for wr in bad:
        with pytest.raises(VerbsError):
            p.a.post_send(p.ea.qp, wr)
    p.a.post_send(p.ea.qp, write_wr(4, p.ea, p.eb, 0, 100, 0))
    p.run()
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(4, WCStatus.SUCCESS)]


# ------------------------------------------------------------------ modify_qp table

REACHABLE = [S.RESET, S.INIT, S.RTR, S.RTS, S.SQD, S.ERR]     # SQE: entered only by an error


def _cases():
    for qp_type in (QPType.RC, QPType.UC, QPType.UD):
        for cur, nxt in itertools.product(REACHABLE, list(S)):
            yield pytest.param(qp_type, cur, nxt, id=f"{qp_type.name}-{cur.name}-{nxt.name}")


@pytest.mark.parametrize("qp_type,cur,nxt", list(_cases()))
def test_modify_qp_follows_the_state_table(dev, qp_type, cur, nxt):
    qp, *_ = _qp(dev, qp_type)
    _to(dev, qp, cur)
    rule = TRANSITIONS.get((cur, nxt), {}).get(qp_type)
    attr = replace(attr_for(nxt), cur_qp_state=cur)    # a true CUR_STATE, so only the mask decides

    def refused(mask):
        before = (qp.state, qp.attr)
        assert errno_of(dev.modify_qp, qp, attr, mask) == errno.EINVAL, M(mask)
        assert (qp.state, qp.attr) == before

    if rule is None:
        refused(M.STATE)
        for req, opt in TRANSITIONS.get((cur, nxt), {}).values():
            refused(M.STATE | req)                     # legal for another QP type only
        all_bits = M(0)
        for b in ALL_BITS:
            all_bits |= b
        refused(all_bits)
        return
    required, optional = rule
    for bit in ALL_BITS:
        if bit & required:
            refused(M.STATE | (required & ~bit))       # one required bit missing
        elif bit != M.STATE and not bit & optional:
            refused(M.STATE | required | bit)          # one bit the transition does not take
    dev.modify_qp(qp, attr, M.STATE | required)
    assert qp.state == nxt
    assert dev.query_qp(qp)[0].qp_state == nxt


@pytest.mark.parametrize("qp_type", [QPType.RC, QPType.UC, QPType.UD])
def test_every_legal_transition_accepts_all_its_optional_bits(dev, qp_type):
    for (cur, nxt), rules in TRANSITIONS.items():
        if qp_type not in rules or cur not in REACHABLE:
            continue
        qp, *_ = _qp(dev, qp_type)
        _to(dev, qp, cur)
        required, optional = rules[qp_type]
        attr = attr_for(nxt)
        if optional & M.CUR_STATE:
            attr = replace(attr, cur_qp_state=cur)
        dev.modify_qp(qp, attr, M.STATE | required | optional)
        assert qp.state == nxt, (cur, nxt)


def test_no_transition_into_sqe_is_allowed_by_modify(dev):
    for cur in REACHABLE:
        for qp_type in (QPType.RC, QPType.UC, QPType.UD):
            assert (cur, S.SQE) not in TRANSITIONS
            qp, *_ = _qp(dev, qp_type)
            _to(dev, qp, cur)
            assert errno_of(dev.modify_qp, qp, attr_for(S.SQE), M.STATE) == errno.EINVAL


def test_cur_state_must_match(dev):
    qp, *_ = _qp(dev)
    _to(dev, qp, S.RTS)
    attr = replace(attr_for(S.RTS), cur_qp_state=S.RTR)
    assert errno_of(dev.modify_qp, qp, attr, M.STATE | M.CUR_STATE) == errno.EINVAL
    attr = replace(attr_for(S.RTS), cur_qp_state=S.RTS)
    dev.modify_qp(qp, attr, M.STATE | M.CUR_STATE)


@pytest.mark.parametrize("field,value,bit", [
    ("timeout", 32, M.TIMEOUT), ("retry_cnt", 8, M.RETRY_CNT), ("rnr_retry", 8, M.RNR_RETRY),
    ("path_mtu", 6, M.PATH_MTU), ("path_mtu", 8192, M.PATH_MTU),
    ("max_rd_atomic", 1000, M.MAX_QP_RD_ATOMIC),
])
def test_out_of_range_attributes_are_einval(dev, field, value, bit):
    qp, *_ = _qp(dev)
    target = S.RTR if bit & (M.PATH_MTU | M.MAX_DEST_RD_ATOMIC) else S.RTS
    _to(dev, qp, S.RTR if target == S.RTS else S.INIT)
    required, _ = TRANSITIONS[(qp.state, target)][QPType.RC]
    attr = replace(attr_for(target), **{field: value})
    before = qp.state
    assert errno_of(dev.modify_qp, qp, attr, M.STATE | required) == errno.EINVAL
    assert qp.state == before


def test_reset_clears_the_queues_and_the_qp_can_be_reused():
    p = pair()
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    b.post_recv(eb.qp, RecvWR(1, [eb.sge(0, 64)]))
    a.modify_qp(ea.qp, QPAttr(qp_state=S.ERR), M.STATE)
    assert ea.qp.state == S.ERR
    a.post_send(ea.qp, send_wr(5, ea, 0, 8))
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(5, WCStatus.WR_FLUSH_ERR)]
    a.modify_qp(ea.qp, QPAttr(qp_state=S.RESET), M.STATE)
    assert ea.qp.state == S.RESET
    assert errno_of(a.post_send, ea.qp, send_wr(6, ea, 0, 8)) == errno.EINVAL


def test_sqd_finishes_outstanding_work_starts_nothing_new_and_reports_drained():
    from softnic.core.enums import EventType
    p = pair(mtu=256)
    a, ea, eb = p.a, p.ea, p.eb
    a.post_send(ea.qp, write_wr(1, ea, eb, 0, 4000, 0))           # 16 packets in flight
    p.fabric.run(max_events=3)
    a.modify_qp(ea.qp, QPAttr(qp_state=S.SQD, en_sqd_async_notify=1),
                M.STATE | M.EN_SQD_ASYNC_NOTIFY)
    a.post_send(ea.qp, write_wr(2, ea, eb, 0, 10, 8000))          # posted while draining
    p.run()
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(1, WCStatus.SUCCESS)]
    writes = [pkt for _, pkt in p.packets("send", a) if pkt.info.is_request]
    assert all(pkt.reth is None or pkt.reth.dma_len == 4000 for pkt in writes)
    assert [t for t, obj in a.events if obj is ea.qp] == [EventType.SQ_DRAINED]
    a.modify_qp(ea.qp, QPAttr(qp_state=S.RTS), M.STATE)
    p.run()
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(1, WCStatus.SUCCESS),
                                                            (2, WCStatus.SUCCESS)]
    assert [t for t, obj in a.events if obj is ea.qp] == [EventType.SQ_DRAINED]


@pytest.mark.parametrize("qp_type", [QPType.RC, QPType.UC, QPType.UD])
def test_transitions_out_of_sqe_follow_the_table(dev, qp_type):
    """The engine never enters SQE by itself (a send error takes the QP to ERR, as in
    rxe), so the QP is put there directly to check the table's SQE rows."""
    for nxt in S:
        qp, *_ = _qp(dev, qp_type)
        _to(dev, qp, S.RTS)
        qp.state = S.SQE
        rule = TRANSITIONS.get((S.SQE, nxt), {}).get(qp_type)
        attr = replace(attr_for(nxt), cur_qp_state=S.SQE)
        if rule is None:
            assert errno_of(dev.modify_qp, qp, attr, M.STATE) == errno.EINVAL
            assert qp.state == S.SQE
            continue
        required, optional = rule
        for bit in ALL_BITS:
            if bit != M.STATE and not bit & (required | optional):
                assert errno_of(dev.modify_qp, qp, attr, M.STATE | required | bit) \
                    == errno.EINVAL
        dev.modify_qp(qp, attr, M.STATE | required | optional)
        assert qp.state == nxt


def test_modify_to_err_flushes_sends_and_receives_in_order():
    p = pair()
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    p.fabric.set_link(a.address, b.address, FaultModel(loss=1.0))
    for i in range(4):
        a.post_send(ea.qp, write_wr(i, ea, eb, 0, 100, 0, flags=SendFlags.SIGNALED * (i % 2)))
        a.post_recv(ea.qp, RecvWR(10 + i, [ea.sge(0, 64)]))
    p.fabric.run(until=p.fabric.now + 1e-3)
    a.modify_qp(ea.qp, QPAttr(qp_state=S.ERR), M.STATE)
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(i, WCStatus.WR_FLUSH_ERR)
                                                            for i in range(4)]
    assert [(w.wr_id, w.status) for w in p.recv_wcs("a")] == [(10 + i, WCStatus.WR_FLUSH_ERR)
                                                               for i in range(4)]
    p.run()                                   # no timer left armed: the fabric goes idle
    assert a.get_timer() is None
