"""Connected resources in one call, for demos, tests and benchmarks.

``connect()`` builds what every RDMA program builds before its first work
request (PD, CQs, a registered buffer, a QP on each side taken through
INIT -> RTR -> RTS with the peer's QPN and PSN) on two engine devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.device import Device
from ..core.enums import Access, QPAttrMask as M, QPState, QPType
from ..core.memory import MR, PD, Buffer
from ..core.qp import QP, AHAttr, QPAttr, QPCap, QPInitAttr

ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


@dataclass(eq=False)
class Endpoint:
    dev: Device
    pd: PD
    send_cq: object
    recv_cq: object
    qp: QP
    buf: Buffer
    mr: MR

    def sge(self, offset: int, length: int) -> tuple[int, int, int]:
        return (self.buf.addr + offset, length, self.mr.lkey)


def endpoint(dev: Device, *, qp_type: QPType = QPType.RC, buf_size: int = 1 << 20,
             cq_depth: int = 4096, max_send_wr: int = 1024, max_recv_wr: int = 1024,
             max_sge: int = 4, max_inline: int = 256, mr_access: int = ALL_ACCESS,
             srq=None, pd: PD | None = None, sq_sig_all: bool = False) -> Endpoint:
    pd = pd or dev.alloc_pd()
    scq = dev.create_cq(cq_depth)
    rcq = dev.create_cq(cq_depth)
    qp = dev.create_qp(pd, QPInitAttr(qp_type, scq, rcq, srq,
                                      QPCap(max_send_wr, max_recv_wr, max_sge, max_sge,
                                            max_inline), sq_sig_all))
    buf = Buffer(buf_size)
    mr = dev.reg_mr(pd, buf.addr, buf.length, mr_access, owner=buf)
    return Endpoint(dev, pd, scq, rcq, qp, buf, mr)


def bring_up(ep: Endpoint, peer: Endpoint, *, mtu: int = 1024, psn: int = 0, peer_psn: int = 0,
             timeout: int = 14, retry_cnt: int = 7, rnr_retry: int = 7, min_rnr_timer: int = 1,
             max_rd_atomic: int = 16, qp_access: int = ALL_ACCESS & ~Access.LOCAL_WRITE,
             qkey: int = 0x11111111) -> None:
    """INIT -> RTR -> RTS, with the masks each transition requires."""
    dev, qp = ep.dev, ep.qp
    if qp.qp_type == QPType.UD:
        dev.modify_qp(qp, QPAttr(qp_state=QPState.INIT, qkey=qkey),
                      M.STATE | M.PKEY_INDEX | M.PORT | M.QKEY)
        dev.modify_qp(qp, QPAttr(qp_state=QPState.RTR), M.STATE)
        dev.modify_qp(qp, QPAttr(qp_state=QPState.RTS, sq_psn=psn), M.STATE | M.SQ_PSN)
        return
    dev.modify_qp(qp, QPAttr(qp_state=QPState.INIT, qp_access_flags=qp_access), _INIT)
    ah = AHAttr(peer.dev.gid, peer.dev.port)
    rc = qp.qp_type == QPType.RC
    dev.modify_qp(qp, QPAttr(qp_state=QPState.RTR, path_mtu=mtu, dest_qp_num=peer.qp.qpn,
                             rq_psn=peer_psn, ah_attr=ah, max_dest_rd_atomic=max_rd_atomic,
                             min_rnr_timer=min_rnr_timer), _RC_RTR if rc else _RTR)
    dev.modify_qp(qp, QPAttr(qp_state=QPState.RTS, sq_psn=psn, timeout=timeout,
                             retry_cnt=retry_cnt, rnr_retry=rnr_retry,
                             max_rd_atomic=max_rd_atomic), _RC_RTS if rc else _RTS)


# the masks ``bring_up`` gives each transition of a connected QP (RC's and UC's)
_INIT = M.STATE | M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS
_RTR = M.STATE | M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN
_RC_RTR = _RTR | M.MAX_DEST_RD_ATOMIC | M.MIN_RNR_TIMER
_RTS = M.STATE | M.SQ_PSN
_RC_RTS = _RTS | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY | M.MAX_QP_RD_ATOMIC


def connect(a: Device, b: Device, *, qp_type: QPType = QPType.RC, mtu: int = 1024,
            psn_a: int = 0, psn_b: int = 0, endpoint_args: dict | None = None,
            **bring_up_args) -> tuple[Endpoint, Endpoint]:
    """Two endpoints on ``a`` and ``b`` with connected QPs, ready to post."""
    ea = endpoint(a, qp_type=qp_type, **(endpoint_args or {}))
    eb = endpoint(b, qp_type=qp_type, **(endpoint_args or {}))
    bring_up(ea, eb, mtu=mtu, psn=psn_a, peer_psn=psn_b, **bring_up_args)
    bring_up(eb, ea, mtu=mtu, psn=psn_b, peer_psn=psn_a, **bring_up_args)
    return ea, eb
