"""Memory windows, ibv_rereg_mr, device memory and XRC in the engine: two devices in the
seeded simulated fabric (tests/enginekit.py), the rules rxe and the IBA give them."""

from __future__ import annotations

import errno

import pytest

from enginekit import fill, pair, pattern, read, send_wr, write_wr
from softnic.core import xrc
from softnic.core.enums import Access, QPAttrMask as M, QPState, QPType, SendFlags, WCOpcode, \
    WCStatus, WROpcode as W
from softnic.core.errors import VerbsError
from softnic.core.memory import AccessError, Buffer, MWBind
from softnic.core.qp import AHAttr, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR
from softnic.wire.roce import Kind, NakCode

SIG = SendFlags.SIGNALED
MW_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.MW_BIND


def _bind_wr(wr_id, mw, new_key_byte, mr, addr, length, access=Access.REMOTE_WRITE):
    new = (mw.rkey & ~0xFF) | new_key_byte
    return SendWR(wr_id, W.BIND_MW, [], SIG,
                  bind=MWBind(mw.rkey, new, mr.lkey, addr, length, int(access))), new


def _window_pair():
    p = pair(endpoint_args=dict(mr_access=MW_ACCESS))
    return p, p.eb.dev.keys


# ---------------------------------------------------------------- memory windows


def test_type2_window_grants_its_range_only_until_invalidated():
    p, keys = _window_pair()
    b = p.eb
    mw = keys.alloc_mw(b.pd, 2)
    wr, rkey = _bind_wr(1, mw, 0x42, b.mr, b.buf.addr + 4096, 8192)
    b.dev.post_send(b.qp, wr)
    p.run()
    wc = p.send_wcs("b")[-1]
    assert (wc.status, wc.opcode) == (WCStatus.SUCCESS, WCOpcode.BIND_MW)
    assert mw.rkey == rkey and rkey & 0xFF == 0x42

    data = pattern(1000, 3)
    fill(p.ea, 0, data)
    p.ea.dev.post_send(p.ea.qp, write_wr(2, p.ea, b, 0, 1000, 4096 + 100, rkey=rkey))
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.SUCCESS
    assert read(b, 4096 + 100, 1000) == data

    # one byte beyond the window: the NAK of a remote access error, nothing written
    fill(b, 4096 + 8192, b"\0" * 8)
    p.ea.dev.post_send(p.ea.qp, write_wr(3, p.ea, b, 0, 8, 4096 + 8191, rkey=rkey))
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.REM_ACCESS_ERR
    assert read(b, 4096 + 8192, 8) == b"\0" * 8


def test_local_invalidate_frees_a_type2_window_and_refuses_a_type1():
    p, keys = _window_pair()
    b = p.eb
    mw2, mw1 = keys.alloc_mw(b.pd, 2), keys.alloc_mw(b.pd, 1)
    wr, rkey = _bind_wr(1, mw2, 7, b.mr, b.buf.addr, 4096)
    b.dev.post_send(b.qp, wr)
    b.dev.post_send(b.qp, SendWR(2, W.LOCAL_INV, [], SIG, invalidate_rkey=rkey))
    p.run()
    assert [w.status for w in p.send_wcs("b")] == [WCStatus.SUCCESS, WCStatus.SUCCESS]
    with pytest.raises(AccessError):
        keys.remote(b.pd, rkey, b.buf.addr, 8, Access.REMOTE_WRITE, b.qp)
    assert not keys.invalidate(b.pd, mw1.rkey)          # o10-37.2.26: never a type 1 window


def test_bind_checks_give_mw_bind_err():
    p = pair()                                           # MRs without MW_BIND
    b = p.eb
    mw = b.dev.keys.alloc_mw(b.pd, 2)
    wr, _ = _bind_wr(1, mw, 1, b.mr, b.buf.addr, 64)
    b.dev.post_send(b.qp, wr)
    p.run()
    assert p.send_wcs("b")[-1].status == WCStatus.MW_BIND_ERR         # C10-73
    with pytest.raises(VerbsError) as ex:
        b.dev.keys.alloc_mw(b.pd, 3)
    assert ex.value.errno == errno.EINVAL


def test_type2_window_is_reached_only_through_the_binding_qp():
    p, keys = _window_pair()
    b = p.eb
    mw = keys.alloc_mw(b.pd, 2)
    other = b.dev.create_qp(b.pd, QPInitAttr(QPType.RC, b.send_cq, b.recv_cq, None,
                                             QPCap(4, 4, 1, 1, 0)))
    mwb = MWBind(mw.rkey, mw.rkey + 1, b.mr.lkey, b.buf.addr, 64, int(Access.REMOTE_WRITE))
    keys.bind_mw(b.qp, b.pd, mwb)
    assert len(keys.remote(b.pd, mw.rkey, b.buf.addr, 64, Access.REMOTE_WRITE, b.qp)) == 64
    with pytest.raises(AccessError):
        keys.remote(b.pd, mw.rkey, b.buf.addr, 64, Access.REMOTE_WRITE, other)
    with pytest.raises(AccessError):                     # write access only
        keys.remote(b.pd, mw.rkey, b.buf.addr, 64, Access.REMOTE_READ, b.qp)
    with pytest.raises(VerbsError):                      # the MR is in use by the window
        keys.deregister(b.mr)
    keys.dealloc_mw(mw)
    keys.deregister(b.mr)


def test_type1_zero_length_bind_unbinds():
    p, keys = _window_pair()
    b = p.eb
    mw = keys.alloc_mw(b.pd, 1)
    keys.bind_mw(b.qp, b.pd, MWBind(mw.rkey, mw.rkey + 1, b.mr.lkey, b.buf.addr, 64,
                                     int(Access.REMOTE_WRITE)))
    assert keys.remote(b.pd, mw.rkey, b.buf.addr, 8, Access.REMOTE_WRITE)
    keys.bind_mw(b.qp, b.pd, MWBind(mw.rkey, mw.rkey + 1, b.mr.lkey, 0, 0, 0))
    with pytest.raises(AccessError):
        keys.remote(b.pd, mw.rkey, b.buf.addr, 8, Access.REMOTE_WRITE)
    assert b.mr.num_mw == 0


# ---------------------------------------------------------------- rereg, reset


def test_rereg_keeps_the_keys_and_applies_the_new_access():
    p = pair()
    a, b = p.ea, p.eb
    rkey = b.mr.rkey
    b.dev.keys.rereg(b.mr, 4, None, 0, 0, int(Access.LOCAL_WRITE))     # CHANGE_ACCESS
    assert b.mr.rkey == rkey
    a.dev.post_send(a.qp, write_wr(1, a, b, 0, 64, 0))
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.REM_ACCESS_ERR
    with pytest.raises(VerbsError):                                    # o10-37: no remote
        b.dev.keys.rereg(b.mr, 4, None, 0, 0, int(Access.REMOTE_WRITE))  # write alone


def test_rereg_translation_moves_the_region():
    p = pair()
    b = p.eb
    other = Buffer(4096)
    b.dev.keys.rereg(b.mr, 1, None, other.addr, 4096, 0)
    assert b.mr.addr == other.addr and b.mr.length == 4096
    view = b.dev.keys.local(b.pd, b.mr.lkey, other.addr + 8, 8, write=True)
    view[:] = b"12345678"
    assert bytes(other.view[8:16]) == b"12345678"
    with pytest.raises(AccessError):
        b.dev.keys.local(b.pd, b.mr.lkey, b.buf.addr, 8, write=True)


def test_reset_drops_the_qps_completions():
    p = pair()
    a = p.ea
    a.dev.modify_qp(a.qp, QPAttr(qp_state=QPState.ERR), M.STATE)
    a.dev.post_recv(a.qp, RecvWR(9, [a.sge(0, 8)]))
    assert a.recv_cq.entries                                 # the flush is there ...
    a.dev.modify_qp(a.qp, QPAttr(qp_state=QPState.RESET), M.STATE)
    assert not a.recv_cq.entries                             # ... and goes with the reset


# ---------------------------------------------------------------- device memory


def test_device_memory_copies_in_words_and_serves_a_zero_based_mr():
    p = pair()
    a, b = p.ea, p.eb
    dm = b.dev.keys.dm.alloc(256)
    dm.copy_to(8, b"abcdefgh")
    assert dm.copy_from(8, 8) == b"abcdefgh"
    for off, n in ((1, 4), (4, 3), (252, 8)):
        with pytest.raises(VerbsError):
            dm.copy_from(off, n)
    with pytest.raises(VerbsError):                           # not zero-based
        b.dev.keys.reg_dm_mr(b.pd, dm, 0, 64, int(Access.LOCAL_WRITE))
    mr = b.dev.keys.reg_dm_mr(b.pd, dm, 64, 128, int(Access.ZERO_BASED | Access.LOCAL_WRITE |
                                                     Access.REMOTE_WRITE))
    data = pattern(32, 5)
    fill(a, 0, data)
    a.dev.post_send(a.qp, SendWR(1, W.RDMA_WRITE, [a.sge(0, 32)], SIG, remote_addr=16,
                                 rkey=mr.rkey))
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.SUCCESS
    assert dm.copy_from(64 + 16, 32) == data                  # iova 16 is DM offset 80
    with pytest.raises(VerbsError):
        b.dev.keys.dm.free(dm)                                # an MR is registered over it
    b.dev.dereg_mr(mr)
    b.dev.keys.dm.free(dm)
    with pytest.raises(VerbsError) as ex:
        b.dev.keys.dm.alloc(b.dev.keys.dm.size + 4)
    assert ex.value.errno == errno.ENOMEM


# ---------------------------------------------------------------- XRC


def _xrc_pair():
    """An initiator on a, a target on b with two XRC SRQs of its domain (and one of another)."""
    p = pair()
    a, b = p.ea, p.eb
    ini = a.dev.create_qp(a.pd, QPInitAttr(QPType.RC, a.send_cq, None, None,
                                           QPCap(16, 0, 1, 1, 0), xrc="ini"))
    d = xrc.open_xrcd(b.dev)
    tgt = b.dev.create_qp(d.pd, QPInitAttr(QPType.RC, None, None, None, QPCap(1, 0, 1, 1, 0),
                                           xrc="tgt", xrcd=d))
    srqs = []
    for dom in (d, d, xrc.open_xrcd(b.dev)):
        s = b.dev.create_srq(b.pd, 16, 1)
        xrc.make_srq(s, dom, b.recv_cq)
        srqs.append(s)
    for qp, dev, peer, pqp in ((ini, a.dev, b.dev, tgt), (tgt, b.dev, a.dev, ini)):
        dev.modify_qp(qp, QPAttr(qp_state=QPState.INIT, qp_access_flags=Access.REMOTE_WRITE),
                      M.STATE | M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS)
        dev.modify_qp(qp, QPAttr(qp_state=QPState.RTR, path_mtu=3, dest_qp_num=pqp.qpn,
                                 ah_attr=AHAttr(peer.gid, peer.port), max_dest_rd_atomic=4,
                                 min_rnr_timer=1),
                      M.STATE | M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN |
                      M.MAX_DEST_RD_ATOMIC | M.MIN_RNR_TIMER)
        dev.modify_qp(qp, QPAttr(qp_state=QPState.RTS, timeout=10, retry_cnt=7, rnr_retry=7,
                                 max_rd_atomic=4),
                      M.STATE | M.SQ_PSN | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY |
                      M.MAX_QP_RD_ATOMIC)
    return p, ini, tgt, srqs


def test_xrc_send_lands_in_the_srq_its_xrceth_names():
    p, ini, tgt, srqs = _xrc_pair()
    a, b = p.ea, p.eb
    for i, s in enumerate(srqs[:2]):
        b.dev.post_srq_recv(s, RecvWR(100 + i, [b.sge(4096 * i, 4096)]))
    data = pattern(3000, 9)                       # three packets at MTU 1024
    fill(a, 0, data)
    a.dev.post_send(ini, send_wr(1, a, 0, 3000, xrc_srqn=srqs[1].handle))
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.SUCCESS
    wc = p.recv_wcs("b")[-1]
    assert (wc.wr_id, wc.status, wc.byte_len, wc.qp_num) == (101, WCStatus.SUCCESS, 3000,
                                                             tgt.qpn)
    assert read(b, 4096, 3000) == data and len(srqs[0].queue) == 1
    reqs = [pkt for _, pkt in p.packets(src=p.a) if pkt.info.is_request]
    assert [pkt.info.name for pkt in reqs] == ["XRC_SEND_FIRST", "XRC_SEND_MIDDLE",
                                               "XRC_SEND_LAST"]
    assert {pkt.xrceth for pkt in reqs} == {srqs[1].handle}
    acks = [pkt for _, pkt in p.packets(src=p.b)]
    assert acks and all(pkt.info.name == "XRC_ACKNOWLEDGE" for pkt in acks)


def test_xrc_write_is_checked_against_the_srqs_pd():
    p, ini, tgt, srqs = _xrc_pair()
    a, b = p.ea, p.eb
    fill(a, 0, b"x" * 64)
    a.dev.post_send(ini, write_wr(1, a, b, 0, 64, 512, xrc_srqn=srqs[0].handle))
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.SUCCESS and read(b, 512, 64) == b"x" * 64


def test_xrc_srq_of_another_domain_is_refused():
    p, ini, tgt, srqs = _xrc_pair()
    a, b = p.ea, p.eb
    b.dev.post_srq_recv(srqs[2], RecvWR(7, [b.sge(0, 64)]))
    a.dev.post_send(ini, send_wr(1, a, 0, 64, xrc_srqn=srqs[2].handle))
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.REM_INV_REQ_ERR
    assert b.dev.counters["rcvd_xrc_bad_srq"] == 1
    naks = [pkt for _, pkt in p.packets(src=p.b) if pkt.info.kind == Kind.ACK]
    assert naks[-1].info.name == "XRC_ACKNOWLEDGE"
    assert naks[-1].aeth.value == NakCode.INVALID_REQUEST and len(srqs[2].queue) == 1


# ---------------------------------------------------------------- ATOMIC_WRITE


def test_atomic_write_places_eight_bytes_and_is_answered_by_an_empty_read_response():
    p = pair()
    a, b = p.ea, p.eb
    fill(b, 64, b"\0" * 16)
    a.dev.post_send(a.qp, SendWR(1, W.ATOMIC_WRITE, [], SIG, remote_addr=b.buf.addr + 64,
                                 rkey=b.mr.rkey, atomic_data=b"ABCDEFGH"))
    p.run()
    wc = p.send_wcs("a")[-1]
    assert (wc.status, wc.opcode) == (WCStatus.SUCCESS, WCOpcode.ATOMIC_WRITE)
    assert read(b, 64, 16) == b"ABCDEFGH" + b"\0" * 8
    req = [pkt for _, pkt in p.packets(src=p.a) if pkt.info.is_request]
    resp = [pkt for _, pkt in p.packets(src=p.b)]
    assert [x.info.name for x in req] == ["RC_ATOMIC_WRITE"] and req[0].reth.dma_len == 8
    assert [x.info.name for x in resp] == ["RC_RDMA_READ_RESPONSE_ONLY"]
    assert bytes(resp[0].payload) == b""
    for addr, data in ((b.buf.addr + 4, b"ABCDEFGH"), (b.buf.addr, b"ABC")):
        with pytest.raises(VerbsError):           # misaligned, or not 8 bytes: EINVAL
            a.dev.post_send(a.qp, SendWR(2, W.ATOMIC_WRITE, [], SIG, remote_addr=addr,
                                         rkey=b.mr.rkey, atomic_data=data))


def test_atomic_write_needs_remote_write():
    p = pair(endpoint_args=dict(mr_access=Access.LOCAL_WRITE | Access.REMOTE_READ))
    a, b = p.ea, p.eb
    a.dev.post_send(a.qp, SendWR(1, W.ATOMIC_WRITE, [], SIG, remote_addr=b.buf.addr,
                                 rkey=b.mr.rkey, atomic_data=b"12345678"))
    p.run()
    assert p.send_wcs("a")[-1].status == WCStatus.REM_ACCESS_ERR
    assert read(b, 0, 8) != b"12345678"


# ---------------------------------------------------------------- implicit ODP


def test_implicit_mr_reaches_what_the_mapping_allows():
    p = pair()
    b = p.eb
    keys = b.dev.keys
    mr = keys.register_implicit(b.pd, int(Access.LOCAL_WRITE | Access.REMOTE_WRITE |
                                          Access.ON_DEMAND))
    view = keys.local(b.pd, mr.lkey, b.buf.addr + 16, 8, write=True)
    view[:] = b"implicit"
    assert read(b, 16, 8) == b"implicit"
    assert bytes(keys.remote(b.pd, mr.rkey, b.buf.addr + 16, 8, Access.REMOTE_WRITE)) == \
        b"implicit"
    with pytest.raises(AccessError):                        # nothing is mapped at page 0
        keys.local(b.pd, mr.lkey, 0x10, 8, write=False)
    ro = Buffer(4096)
    import mmap
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(ro.addr), 4096, mmap.PROT_READ) == 0
    try:
        assert len(keys.local(b.pd, mr.lkey, ro.addr, 8, write=False)) == 8
        with pytest.raises(AccessError):                    # read-only: no write reaches it
            keys.local(b.pd, mr.lkey, ro.addr, 8, write=True)
    finally:
        libc.mprotect(ctypes.c_void_p(ro.addr), 4096, mmap.PROT_READ | mmap.PROT_WRITE)
    with pytest.raises(VerbsError):
        keys.register_implicit(b.pd, int(Access.LOCAL_WRITE))    # not ON_DEMAND
