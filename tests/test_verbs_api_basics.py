"""The pyverbs API over softnic without traffic: constants, errors, helpers,
device queries, object creation, QP state transitions, refusals and their
errno, and who closes what.  Written against the pyverbs API only."""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import resource
import sys

import pytest

import verbs_api.enums as e
from verbs_api import libibverbs_enums as le
from verbs_api import mem_alloc, utils
from verbs_api.addr import AH, AHAttr, GID, GlobalRoute
from verbs_api.base import inc_rkey
from verbs_api.cq import CQ, CQEX, CompChannel, CqInitAttrEx
from verbs_api.device import Context, get_device_list, guid_format
from verbs_api.mr import MR, MW
from verbs_api.pd import PD
from verbs_api.pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError
from verbs_api.qp import QP, QPAttr, QPCap, QPInitAttr, QPInitAttrEx
from verbs_api.srq import SRQ, SrqAttr, SrqInitAttr
from verbs_api.wr import SGE, RecvWR, SendWR

from verbskit import Side

DEV = 'softnic0'


@pytest.fixture(scope='module')
def ctx():
    c = Context(name=DEV)
    yield c
    c.close()


# ---------------------------------------------------------------- constants


def test_enum_values_are_libibverbs_values():
    assert (e.IBV_QPT_RC, e.IBV_QPT_UC, e.IBV_QPT_UD, e.IBV_QPT_RAW_PACKET) == (2, 3, 4, 8)
    assert [int(s) for s in e.ibv_qp_state] == list(range(8))
    assert (e.IBV_WR_RDMA_WRITE, e.IBV_WR_SEND_WITH_IMM, e.IBV_WR_ATOMIC_FETCH_AND_ADD,
            e.IBV_WR_SEND_WITH_INV, e.IBV_WR_FLUSH, e.IBV_WR_ATOMIC_WRITE) == (0, 3, 6, 9, 14, 15)
    assert (e.IBV_WC_RECV, e.IBV_WC_RECV_RDMA_WITH_IMM, e.IBV_WC_DRIVER3) == (128, 129, 137)
    assert (e.IBV_WC_REM_ACCESS_ERR, e.IBV_WC_RETRY_EXC_ERR, e.IBV_WC_GENERAL_ERR) == (10, 12, 21)
    assert e.IBV_QP_STATE == 1 and e.IBV_QP_DEST_QPN == 1 << 20 and e.IBV_QP_RATE_LIMIT == 1 << 25
    assert e.IBV_ACCESS_RELAXED_ORDERING == 1 << 20 and e.IBV_ACCESS_HUGETLB == 1 << 7
    assert (e.IBV_SEND_SIGNALED, e.IBV_SEND_INLINE) == (2, 8)
    assert (e.IBV_MTU_256, e.IBV_MTU_4096) == (1, 5)
    assert (e.IBV_PORT_ACTIVE, e.IBV_LINK_LAYER_ETHERNET) == (4, 2)
    assert e.IBV_EVENT_SRQ_LIMIT_REACHED == 15 and e.IBV_EVENT_QP_LAST_WQE_REACHED == 16
    assert (e.IBV_NODE_CA, e.IBV_TRANSPORT_IB, e.IBV_TRANSPORT_UNKNOWN) == (1, 0, -1)
    assert e.IBV_DEVICE_MANAGED_FLOW_STEERING == 1 << 29
    assert e._IBV_DEVICE_RAW_SCATTER_FCS == 1 << 34
    assert e.IBV_GID_TYPE_SYSFS_ROCE_V2 == 1 and e.IBV_GID_TYPE_ROCE_V2 == 2


def test_old_and_class_qualified_styles_are_the_same_objects():
    assert le.ibv_qp_type.IBV_QPT_RC is e.IBV_QPT_RC
    assert e.ibv_wc_status.IBV_WC_SUCCESS is le.IBV_WC_SUCCESS
    names = [m.name for m in le.ibv_qp_type]
    assert names[:3] == ['IBV_QPT_RC', 'IBV_QPT_UC', 'IBV_QPT_UD']
    # rdma-core's tests build every legal access combination from the class
    flags = list(e.ibv_access_flags)
    assert e.IBV_ACCESS_LOCAL_WRITE in flags and sum(f.value for f in flags[:3]) == 7
    assert int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE) == 3
    assert isinstance(e.IBV_QPS_RTS, int)


# ---------------------------------------------------------------- errors, helpers, memory


def test_errors_carry_errno():
    err = PyverbsRDMAError('Failed to do it', errno.EINVAL)
    assert err.error_code == errno.EINVAL and 'Invalid argument' in str(err)
    assert PyverbsRDMAError('no errno').error_code == -1
    assert issubclass(PyverbsRDMAError, PyverbsError)
    assert issubclass(PyverbsUserError, PyverbsError)


def test_utils_gid_strings():
    raw = ipaddress.IPv6Address('::ffff:10.1.2.3').packed
    sp, iid = (int.from_bytes(raw[i:i + 8], sys.byteorder) for i in (0, 8))
    assert utils.gid_str(sp, iid) == '0000:0000:0000:0000:0000:ffff:0a01:0203'
    assert utils.gid_str_to_array('fe80:0000:0000:0000:0000:0000:0000:0001')[:2] == ['fe', '80']
    with pytest.raises(PyverbsUserError):
        utils.gid_str_to_array('fe80::1')
    assert utils.qp_type_to_str(2) == 'RC' and utils.qp_state_to_str(3) == 'RTS'
    assert utils.mtu_to_str(5) == 4096 and 'Remote write' in utils.access_flags_to_str(3)
    assert inc_rkey(0x1234FF) == 0x123400 and inc_rkey(0x12) == 0x13


def test_mem_alloc_is_real_memory():
    addr = mem_alloc.posix_memalign(10000, resource.getpagesize())
    try:
        assert addr % resource.getpagesize() == 0
        assert mem_alloc.read(addr, 10000) == bytes(10000)
        mem_alloc.write(addr, 'abc', 3, offset=5)
        assert ctypes.string_at(addr + 5, 3) == b'abc'
        mem_alloc.writebe32(addr, 0x01020304, offset=1)
        assert mem_alloc.read(addr, 4, 4) == b'\x01\x02\x03\x04'
        assert mem_alloc.read32(addr, 1) == int.from_bytes(b'\x01\x02\x03\x04', sys.byteorder)
        mem_alloc.writebe64(addr, 7, offset=2)
        assert mem_alloc.read64(addr, 2) == int.from_bytes((7).to_bytes(8, 'big'), sys.byteorder)
    finally:
        mem_alloc.free(addr)
    m = mem_alloc.mmap(length=8192)
    mem_alloc.write(m, b'z' * 8192, 8192)
    assert mem_alloc.read(m, 2, 8190) == b'zz'
    mem_alloc.munmap(m, 8192)


# ---------------------------------------------------------------- devices


def test_device_list_names_are_bytes():
    devs = get_device_list()
    assert [d.name for d in devs][:2] == [b'softnic0', b'softnic1']
    d = devs[0]
    assert d.node_type == e.IBV_NODE_CA and d.transport_type == e.IBV_TRANSPORT_IB
    assert d.guid != 0 and 'softnic0' in str(d)


def test_context_needs_a_known_name():
    with pytest.raises(PyverbsUserError):
        Context()
    with pytest.raises(PyverbsRDMAError):
        Context(name='mlx5_0')
    with Context(name=b'softnic1') as c:
        assert c.name == 'softnic1'


def test_query_device(ctx):
    a = ctx.query_device()
    assert a.vendor_id != 0 and a.max_qp > 0 and a.max_qp_wr >= 1024 and a.max_sge >= 1
    assert a.max_cqe > 0 and a.max_mr_size > 0 and a.phys_port_cnt == 1
    assert a.atomic_caps == e.IBV_ATOMIC_HCA and a.max_qp_rd_atom >= 1
    assert a.device_cap_flags & e.IBV_DEVICE_MEM_WINDOW and a.max_mw > 0   # types 1 and 2B
    assert guid_format(a.node_guid).count(':') == 3 and 'Vendor ID' in str(a)
    ex = ctx.query_device_ex()
    assert ex.orig_attr.vendor_id == a.vendor_id and ex.max_dm_size == 256 << 10   # NIC memory
    # softnic never pins: ODP everywhere, implicit too, as the C face reports
    assert ex.odp_caps.general_caps == e.IBV_ODP_SUPPORT | e.IBV_ODP_SUPPORT_IMPLICIT
    assert ex.odp_caps.rc_odp_caps & e.IBV_ODP_SUPPORT_ATOMIC


def test_query_port_gid_pkey(ctx):
    p = ctx.query_port(1)
    assert p.state == e.IBV_PORT_ACTIVE and p.max_mtu == e.IBV_MTU_4096
    assert p.active_mtu == e.IBV_MTU_4096 and p.link_layer == e.IBV_LINK_LAYER_ETHERNET
    assert p.gid_tbl_len >= 1 and p.pkey_tbl_len >= 1 and 'Active' in str(p)
    gid = ctx.query_gid(1, 0)
    text = str(gid)
    assert gid.gid == text and len(text.split(':')) == 8
    assert text.startswith('0000:0000:0000:0000:0000:ffff:')
    ip = ipaddress.IPv6Address(bytes.fromhex(text.replace(':', ''))).ipv4_mapped
    assert ip is not None and ip.is_loopback
    assert ctx.query_pkey(1, 0) == 0xFFFF
    table = ctx.query_gid_table(8)
    assert len(table) == 4 < p.gid_tbl_len and table[0].gid_str() == text
    assert [t.gid_index for t in table] == [0, 1, 2, 3]
    # the rest of the table is empty, answered as the kernel does
    empty = p.gid_tbl_len - 1
    assert str(ctx.query_gid(1, empty)) == '0000:0000:0000:0000:0000:0000:0000:0000'
    assert ctx.query_gid_type(1, empty) == e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1
    with pytest.raises(PyverbsRDMAError) as ex:
        ctx.query_gid_ex(1, 4)
    assert ex.value.error_code == errno.ENODATA
    assert table[0].gid_type == e.IBV_GID_TYPE_ROCE_V2
    assert ctx.query_gid_ex(1, 0).gid_str() == text
    assert ctx.query_gid_type(1, 0) == e.IBV_GID_TYPE_SYSFS_ROCE_V2
    for bad in (lambda: ctx.query_port(2), lambda: ctx.query_gid(2, 0),
                lambda: ctx.query_gid(1, p.gid_tbl_len), lambda: ctx.query_pkey(1, 5)):
        with pytest.raises(PyverbsRDMAError) as ex:
            bad()
        assert ex.value.error_code == errno.EINVAL


# ---------------------------------------------------------------- MR


def test_mr_allocates_real_memory(ctx):
    with PD(ctx) as pd:
        mr = MR(pd, 10000, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)
        assert mr.buf % resource.getpagesize() == 0 and mr.length == 10000
        assert mr.lkey and mr.rkey
        assert mr.read(10000, 0) == bytes(10000)
        mr.write(b'hello', 5)
        mr.write('world', 5, offset=9995)
        assert mr.read(5, 0) == b'hello' and mr.read(5, 9995) == b'world'
        assert ctypes.string_at(mr.buf, 5) == b'hello'         # buf is the real address
        with pytest.raises(PyverbsUserError):
            mr.write(b'x', 1, offset=10000)
        with pytest.raises(PyverbsUserError):
            mr.read(4, -1)
        other = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        assert (other.lkey, other.rkey) != (mr.lkey, mr.rkey)
        zero = MR(pd, 0, e.IBV_ACCESS_LOCAL_WRITE)
        assert zero.length == 0
        mr.close()
        mr.close()


def test_mr_on_caller_memory(ctx):
    buf = (ctypes.c_char * 4096)()
    with PD(ctx) as pd:
        mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE, address=ctypes.addressof(buf))
        assert mr.buf == ctypes.addressof(buf)
        mr.write(b'abc', 3, 100)
        assert buf.raw[100:103] == b'abc'
        mr.close()
    assert buf.raw[100:103] == b'abc'                         # not freed


@pytest.mark.parametrize('access', [e.IBV_ACCESS_REMOTE_WRITE, e.IBV_ACCESS_REMOTE_ATOMIC,
                                    e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ])
def test_mr_remote_write_needs_local_write(ctx, access):
    with PD(ctx) as pd:
        with pytest.raises(PyverbsRDMAError) as ex:
            MR(pd, 4096, access)
        assert ex.value.error_code == errno.EINVAL


def test_memory_window_of_no_type_is_refused(ctx):
    with PD(ctx) as pd:
        with pytest.raises(PyverbsRDMAError) as ex:
            MW(pd, 3)                               # no such type: EINVAL, as the kernel
        assert ex.value.error_code == errno.EINVAL


# ---------------------------------------------------------------- CQ


def test_cq(ctx):
    cq = CQ(ctx, 10)
    assert cq.poll() == (0, [])
    assert cq.poll(5) == (0, [])
    assert cq.comp_channel is None
    cq.close()
    with pytest.raises(PyverbsRDMAError) as ex:
        CQ(ctx, 0)
    assert ex.value.error_code == errno.EINVAL
    with pytest.raises(PyverbsRDMAError) as ex:
        CQ(ctx, 10, None, None, ctx.num_comp_vectors)
    assert ex.value.error_code == errno.EINVAL
    ch = CompChannel(ctx)
    cq = CQ(ctx, 10, None, ch, 0)
    assert cq.comp_channel is ch
    cq.req_notify()
    ch.close()
    assert cq._closed                                          # the channel closed its CQ
    cqex = CQEX(ctx, CqInitAttrEx(cqe=16))
    assert cqex.start_poll(None) == errno.ENOENT
    cqex.close()


# ---------------------------------------------------------------- QP


def test_attr_defaults_follow_pyverbs():
    ia = QPInitAttr()
    assert ia.qp_type == e.IBV_QPT_UD and ia.sq_sig_all == 1 and ia.send_cq is None
    assert ia.cap.max_send_wr == 0                      # no cap given: a zeroed ibv_qp_cap
    cap = QPCap()
    assert (cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge,
            cap.max_inline_data) == (1, 10, 1, 1, 0)
    a = QPAttr()
    assert (a.qp_state, a.cur_qp_state, a.port_num, a.path_mtu) == \
        (e.IBV_QPS_INIT, e.IBV_QPS_RESET, 1, e.IBV_MTU_1024)
    assert (a.timeout, a.retry_cnt, a.qkey, a.ah_attr.is_global) == (0, 0, 0, 0)
    ah = AHAttr(is_global=1, gr=GlobalRoute(dgid=GID('::ffff:1.2.3.4'), hop_limit=9))
    assert ah.dgid == '0000:0000:0000:0000:0000:ffff:0102:0304' and ah.hop_limit == 9
    assert AHAttr().dgid is None
    a.ah_attr = ah
    assert a.ah_attr.dgid == ah.dgid and a.ah_attr is not ah
    with pytest.raises(PyverbsUserError):
        AHAttr(is_global=1)


def test_qp_creation_and_transitions(ctx):
    with PD(ctx) as pd:
        cq = CQ(ctx, 100)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(7, 9, 2, 3, 32))
        qp = QP(pd, init)
        assert qp.qp_state == e.IBV_QPS_RESET and qp.qp_type == e.IBV_QPT_RC and qp.qp_num > 0
        assert (init.max_send_wr, init.max_recv_wr) == (7, 9)    # caps given, written back
        qp.to_init(QPAttr())
        assert qp.qp_state == e.IBV_QPS_INIT
        # RoCE: an address vector without a GRH is refused
        attr = QPAttr()
        attr.dest_qp_num = qp.qp_num
        with pytest.raises(PyverbsRDMAError) as ex:
            qp.to_rtr(attr)
        assert ex.value.error_code == errno.EINVAL
        attr.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=ctx.query_gid(1, 0)))
        qp.to_rtr(attr)
        assert qp.qp_state == e.IBV_QPS_RTR
        qp.to_rts(attr)
        assert qp.qp_state == e.IBV_QPS_RTS
        a, i = qp.query(e.IBV_QP_STATE | e.IBV_QP_CAP | e.IBV_QP_AV)
        assert a.qp_state == e.IBV_QPS_RTS and a.dest_qp_num == qp.qp_num
        assert (a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge,
                a.cap.max_recv_sge, a.cap.max_inline_data) == (7, 9, 2, 3, 32)
        assert a.ah_attr.is_global and a.ah_attr.dgid == str(ctx.query_gid(1, 0))
        assert i.qp_type == e.IBV_QPT_RC and i.max_recv_wr == 9 and i.send_cq is cq
        # RTS -> INIT is not in the state table
        with pytest.raises(PyverbsRDMAError) as ex:
            qp.modify(QPAttr(qp_state=e.IBV_QPS_INIT), e.IBV_QP_STATE)
        assert ex.value.error_code == errno.EINVAL
        qp.modify(QPAttr(qp_state=e.IBV_QPS_RESET), e.IBV_QP_STATE)
        assert qp.qp_state == e.IBV_QPS_RESET
        # a missing required attribute: RESET -> INIT without ACCESS_FLAGS
        with pytest.raises(PyverbsRDMAError) as ex:
            qp.modify(QPAttr(), e.IBV_QP_STATE | e.IBV_QP_PORT | e.IBV_QP_PKEY_INDEX)
        assert ex.value.error_code == errno.EINVAL


def test_qp_attr_hint_goes_as_far_as_pyverbs_does(ctx):
    with PD(ctx) as pd:
        cq = CQ(ctx, 100)
        rc = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap()), QPAttr())
        uc = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UC, scq=cq, rcq=cq, cap=QPCap()), QPAttr())
        ud = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=QPCap()), QPAttr())
        assert (rc.qp_state, uc.qp_state, ud.qp_state) == \
            (e.IBV_QPS_INIT, e.IBV_QPS_INIT, e.IBV_QPS_RTS)
        ex_qp = QP(ctx, QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(),
                                     pd=pd, comp_mask=e.IBV_QP_INIT_ATTR_PD))
        assert ex_qp.qp_state == e.IBV_QPS_RESET and ex_qp in ctx.qps


def test_qp_refusals_carry_the_kernels_errno(ctx):
    with PD(ctx) as pd:
        cq = CQ(ctx, 100)
        mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        sge = SGE(mr.buf, 64, mr.lkey)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(2, 2)))
        for post, wr in ((qp.post_send, SendWR(num_sge=1, sg=[sge])),
                         (qp.post_recv, RecvWR(num_sge=1, sg=[sge]))):
            with pytest.raises(PyverbsRDMAError) as ex:
                post(wr)                                    # QP in RESET
            assert ex.value.error_code == errno.EINVAL
        qp.to_init(QPAttr())
        qp.post_recv(RecvWR(1, 1, [sge]))
        qp.post_recv(RecvWR(2, 1, [sge]))
        with pytest.raises(PyverbsRDMAError) as ex:
            qp.post_recv(RecvWR(3, 1, [sge]))               # the RQ holds 2
        assert ex.value.error_code == errno.ENOMEM
        with pytest.raises(PyverbsRDMAError) as ex:
            qp.post_send(SendWR(num_sge=1, sg=[sge]))       # INIT cannot send
        assert ex.value.error_code == errno.EINVAL
        with pytest.raises(PyverbsRDMAError) as ex:
            QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(1 << 30)))
        assert ex.value.error_code == errno.EINVAL
        with pytest.raises(PyverbsRDMAError) as ex:
            QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RAW_PACKET, scq=cq, rcq=cq, cap=QPCap()))
        assert ex.value.error_code == errno.EOPNOTSUPP
        with pytest.raises(PyverbsRDMAError) as ex:
            QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap()))     # no CQs
        assert ex.value.error_code == errno.EINVAL
        with pytest.raises(PyverbsUserError):
            QPInitAttr(scq=pd)
        # to ERR: what is posted now completes at once with WR_FLUSH_ERR
        qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
        wcs = [w for _ in range(3) for w in cq.poll(4)[1]]
        assert sorted(w.wr_id for w in wcs) == [1, 2]
        assert {w.status for w in wcs} == {e.IBV_WC_WR_FLUSH_ERR}


def test_post_chain_stops_at_the_bad_wr(ctx):
    with PD(ctx) as pd:
        cq = CQ(ctx, 100)
        mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 2)), QPAttr())
        sge = SGE(mr.buf, 8, mr.lkey)
        w3 = RecvWR(3, 1, [sge])
        w2 = RecvWR(2, 1, [sge], next_wr=w3)
        w1 = RecvWR(1, 1, [sge], next_wr=w2)
        bad = RecvWR()
        with pytest.raises(PyverbsRDMAError) as ex:
            qp.post_recv(w1, bad)
        assert ex.value.error_code == errno.ENOMEM and bad.wr_id == 3


def test_srq_objects(ctx):
    with PD(ctx) as pd:
        srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=2)))
        a = srq.query()
        assert (a.max_wr, a.max_sge, a.srq_limit) == (4, 2, 0)
        srq.modify(SrqAttr(srq_limit=2), e.IBV_SRQ_LIMIT)
        assert srq.query().srq_limit == 2
        mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        for i in range(4):
            srq.post_recv(RecvWR(i, 1, [SGE(mr.buf, 64, mr.lkey)]))
        with pytest.raises(PyverbsRDMAError) as ex:
            srq.post_recv(RecvWR(9, 1, [SGE(mr.buf, 64, mr.lkey)]))
        assert ex.value.error_code == errno.ENOMEM
        cq = CQ(ctx, 10)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq, cap=QPCap()))
        assert qp.query(e.IBV_QP_CAP)[0].cap.max_recv_wr == 0
        with pytest.raises(PyverbsRDMAError) as ex:
            srq.close()                                     # a QP still uses it
        assert ex.value.error_code == errno.EBUSY
        qp.close()
        srq.close()
        srq.close()


def test_ah_needs_a_global_roce_address(ctx):
    with PD(ctx) as pd:
        ah = AH(pd, attr=AHAttr(is_global=1, gr=GlobalRoute(dgid=ctx.query_gid(1, 0))))
        assert ah in pd.ahs
        with pytest.raises(PyverbsRDMAError) as ex:
            AH(pd, attr=AHAttr(port_num=1))
        assert ex.value.error_code == errno.EINVAL
        with pytest.raises(PyverbsRDMAError) as ex:
            AH(pd, attr=AHAttr(is_global=1, gr=GlobalRoute(dgid=GID('fe80::1'))))
        assert ex.value.error_code == errno.EINVAL


# ---------------------------------------------------------------- ownership


def test_parents_close_their_children():
    ctx = Context(name=DEV)
    pd = PD(ctx)
    cq = CQ(ctx, 10)
    ch = CompChannel(ctx)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    srq = SRQ(pd, SrqInitAttr(SrqAttr()))
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap()))
    ctx.close()
    assert all(o._closed for o in (pd, cq, ch, mr, srq, qp, ctx))
    for o in (ctx, pd, cq, ch, mr, srq, qp):
        o.close()                                           # idempotent
    with pytest.raises(PyverbsError):
        mr.read(1, 0)

    with Context(name=DEV) as ctx:
        pd = PD(ctx)
        cq = CQ(ctx, 10)
        mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap()))
        pd.close()                                          # the PD takes its MR and QP
        assert mr._closed and qp._closed and not cq._closed
        qp2 = QP(PD(ctx), QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=QPCap()))
        cq.close()                                          # the CQ takes its QP first
        assert qp2._closed
    assert ctx._closed


def test_dropped_objects_release_their_resources():
    with Context(name=DEV) as ctx:
        pd = PD(ctx)
        dev = ctx._nic.dev
        n = len(dev.keys._by_key)
        mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        assert len(dev.keys._by_key) == n + 1
        del mr
        assert len(dev.keys._by_key) == n


def test_side_helper_builds_rc(ctx):
    s = Side(DEV, ctx=ctx)
    assert s.qp.qp_state == e.IBV_QPS_INIT


def test_imported_pd_and_mr_are_the_created_ones():
    """Context(cmd_fd=...), PD(handle=...), MR(handle=...): ibv_import_pd/ibv_import_mr's
    lookup in the command file's objects (rdma-core's test_shared_pd shares them so).  The
    imported MR has the keys and length of the created one and no address unless given;
    a handle the file does not hold is ENOENT, one only another kind holds EINVAL;
    unimporting leaves the objects to their creator."""
    import os
    c = Context(name=DEV)
    other = Context(name=DEV)                 # a command file of its own
    pd = PD(c)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    imp = Context(cmd_fd=os.dup(c.cmd_fd))
    try:
        ipd = PD(imp, handle=pd.handle)
        assert ipd.handle == pd.handle
        imr = MR(ipd, handle=mr.handle)
        assert (imr.lkey, imr.rkey, imr.length, imr.buf) == (mr.lkey, mr.rkey, 4096, 0)
        assert MR(ipd, handle=mr.handle, address=mr.buf).buf == mr.buf
        opd = PD(other)
        with pytest.raises(PyverbsRDMAError) as ex:
            PD(imp, handle=opd.handle)
        assert ex.value.error_code == errno.ENOENT
        with pytest.raises(PyverbsRDMAError) as ex:
            MR(ipd, handle=max(mr.handle, pd.handle) + 1000)
        assert ex.value.error_code == errno.ENOENT
        lone = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
        if lone.handle != pd.handle:          # a handle only an MR holds, asked as a PD's
            with pytest.raises(PyverbsRDMAError) as ex:
                PD(imp, handle=lone.handle)
            assert ex.value.error_code == errno.EINVAL
        imr.unimport()
        ipd.unimport()
        assert mr.read(4, 0) == b'\0' * 4     # the MR is still the creator's
        mr.close()
        pd.close()
        with pytest.raises(PyverbsRDMAError) as ex:
            PD(imp, handle=pd.handle)         # deallocated: the file holds it no more
        assert ex.value.error_code == errno.ENOENT
    finally:
        imp.close()
        other.close()
        c.close()


@pytest.mark.parametrize('flag', [e.IBV_WC_EX_WITH_CVLAN, e.IBV_WC_EX_WITH_FLOW_TAG,
                                  e.IBV_WC_EX_WITH_TM_INFO])
def test_cqex_refuses_fields_no_completion_carries(ctx, flag):
    """As rxe and the C face: an extended CQ asking for a VLAN, a flow tag or tag-matching
    information, which softnic's completions never carry, is EOPNOTSUPP."""
    from verbs_api.cq import CqInitAttrEx
    with pytest.raises(PyverbsRDMAError) as ex:
        CQEX(ctx, CqInitAttrEx(wc_flags=e.IBV_WC_STANDARD_FLAGS | flag))
    assert ex.value.error_code == errno.EOPNOTSUPP
    CQEX(ctx, CqInitAttrEx(wc_flags=e.IBV_WC_STANDARD_FLAGS)).close()


def test_rdma_core_64_registration_api(ctx):
    """rdma-core 64's MREx (ibv_reg_mr_ex), Buf/BufMR (ibv_alloc_buf, ibv_reg_buf_mr) and
    DMAHandle, answered as libibverbs answers for a provider without ops of its own for
    them (rxe): an address range registers as ibv_reg_mr does, a DMA handle or a dma-buf
    is EOPNOTSUPP, a dma-buf with an address EINVAL, a buffer range beyond the buffer
    EINVAL; a confidential guest's shared-memory parent domain is EOPNOTSUPP."""
    from verbs_api.mr import BufMR, Buf, DMAHandle, DmaHandleInitAttr, MREx
    from verbs_api.pd import ParentDomain, ParentDomainInitAttr
    from verbs_api import libibverbs_enums as le
    with PD(ctx) as pd:
        mr = MREx(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        mr.write(b'abc', 3, 10)
        assert mr.read(3, 10) == b'abc' and mr.rkey and mr.length == 4096
        for kwargs, err in (({'access': e.IBV_ACCESS_REMOTE_WRITE}, errno.EINVAL),
                            ({'dmah': object(), 'access': 1}, errno.EOPNOTSUPP),
                            ({'implicit': True, 'fd': 0, 'access': 1}, errno.EINVAL),
                            ({'fd': 0, 'iova': 0, 'access': 1}, errno.EOPNOTSUPP)):
            with pytest.raises(PyverbsRDMAError, match='using extended API') as ex:
                MREx(pd, 4096, **kwargs)
            assert ex.value.error_code == err, kwargs
        buf = Buf(pd, 3 * 4096)
        bmr = BufMR(pd, buf, 4096, e.IBV_ACCESS_LOCAL_WRITE, offset=4096)
        assert bmr.buf == buf.addr + 4096
        xmr = MREx(pd, length=100, access=e.IBV_ACCESS_LOCAL_WRITE, buf=buf,
                   address=buf.addr + 8)
        assert xmr.buf == buf.addr + 8
        with pytest.raises(PyverbsRDMAError) as ex:
            BufMR(pd, buf, 4096, e.IBV_ACCESS_LOCAL_WRITE, offset=3 * 4096 - 10)
        assert ex.value.error_code == errno.EINVAL
        buf.close()                               # its MRs go first
        assert bmr._closed and xmr._closed
        with pytest.raises(PyverbsRDMAError) as ex:
            DMAHandle(ctx, DmaHandleInitAttr(cpu_id=0))
        assert ex.value.error_code == errno.EOPNOTSUPP
        cc = le.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOW_CC_UNPROTECTED_ALLOC
        with pytest.raises(PyverbsRDMAError) as ex:
            ParentDomain(ctx, ParentDomainInitAttr(pd, comp_mask=cc))
        assert ex.value.error_code == errno.EOPNOTSUPP
        mr.close()


def test_rdma_core_64_device_queries(ctx):
    """rdma-core 64's pyverbs calls: get_pkey_index finds the default P_Key at index 0
    (and no other), query_port_speed is EOPNOTSUPP as for rxe, the port's active_speed_ex
    is 0 (active_speed says it), and an AddrInfo made with nothing to resolve is empty
    until get_addrinfo fills it."""
    from verbs_api.device import speed_to_str, width_to_str
    assert ctx.get_pkey_index(1, 0xFFFF) == 0
    with pytest.raises(PyverbsRDMAError):
        ctx.get_pkey_index(1, 0x7FFF)
    with pytest.raises(PyverbsRDMAError) as ex:
        ctx.query_port_speed(1)
    assert ex.value.error_code == errno.EOPNOTSUPP
    port = ctx.query_port(1)
    assert port.active_speed_ex == 0
    # the default line rate, 100 Gbit/s: 4X EDR, as a 100 GbE port reports it
    assert speed_to_str(port.active_speed, port.active_speed_ex) == '25.0 Gbps (32)'
    assert width_to_str(port.active_width) == '4X (2)'
    assert speed_to_str(1, 256) == '200.0 Gbps (256)'
    from verbs_api.cmid import AddrInfo
    ai = AddrInfo()
    assert ai.src is None and ai.dst is None
    ai.get_addrinfo(src='127.0.0.1', dst='127.0.0.1', dst_service='7471')
    assert ai.dst is not None


def test_provider_modules_answer_as_on_another_vendors_device(ctx):
    """The mlx5 and EFA modules rdma-core's suite imports: as pyverbs on a device of
    another vendor, Mlx5Context says 'This is not an MLX5 device', mlx5dv's objects and
    static methods are EOPNOTSUPP, EfaContext opens and its query is EOPNOTSUPP; attribute
    classes hold their arguments; the capability-naming functions answer as pyverbs'."""
    from verbs_api.providers.efa import efadv
    from verbs_api.providers.mlx5 import dr_domain, mlx5dv, mlx5dv_flow
    from verbs_api.providers.mlx5 import mlx5_enums as dve
    with pytest.raises(PyverbsUserError, match='This is not an MLX5 device'):
        mlx5dv.Mlx5Context(mlx5dv.Mlx5DVContextAttr(), name=DEV)
    for call in (lambda: mlx5dv.Mlx5Context.device_timestamp_to_ns(ctx, 1),
                 lambda: dr_domain.DrDomain(ctx, 0),
                 lambda: mlx5dv_flow.Mlx5FlowMatcher(ctx, None)):
        with pytest.raises(PyverbsRDMAError) as ex:
            call()
        assert ex.value.error_code == errno.EOPNOTSUPP
    attr = mlx5dv_flow.Mlx5FlowMatcherAttr(match_mask=7, priority=2)
    assert (attr.match_mask, attr.priority, attr.ft_type) == (7, 2, 0)
    assert mlx5dv.context_flags_to_str(dve.MLX5DV_CONTEXT_FLAGS_CQE_V1 |
                                       dve.MLX5DV_CONTEXT_FLAGS_ENHANCED_MPW) == \
        'CQE v1, Enhanced multi packet WQE (9)'
    with efadv.EfaContext(name=DEV) as efa:
        with pytest.raises(PyverbsRDMAError) as ex:
            efa.query_efa_device()
        assert ex.value.error_code == errno.EOPNOTSUPP
    assert efadv.dev_cap_to_str(65) == 'RDMA Read, ??(40) (41)'
