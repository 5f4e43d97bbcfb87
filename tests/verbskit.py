"""Helpers for the pyverbs-API tests, written against the pyverbs API only.

``Side`` builds what a pyverbs program builds (Context, PD, CQ, MR, QP) on
one softnic device; ``connect`` takes two sides' QPs to RTS the way
rdma-core's tests do (global address vector from the peer's queried GID).
``poll`` spins on a CQ with a deadline, so a lost completion fails the test
instead of hanging it.
"""

from __future__ import annotations

import time

import verbs_api.enums as e
from verbs_api.addr import AH, AHAttr, GlobalRoute
from verbs_api.cq import CQ
from verbs_api.device import Context
from verbs_api.mr import MR
from verbs_api.pd import PD
from verbs_api.qp import QP, QPAttr, QPCap, QPInitAttr

ALL_ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ |
              e.IBV_ACCESS_REMOTE_ATOMIC)
REMOTE_ACCESS = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC
UD_QKEY = 0x11111111
GRH_SIZE = 40


def poll(cq, count=1, timeout=10.0):
    """``count`` completions from ``cq`` (any status), or AssertionError at the deadline."""
    wcs = []
    deadline = time.monotonic() + timeout
    while len(wcs) < count:
        n, got = cq.poll(count - len(wcs))
        wcs.extend(got)
        if not n and time.monotonic() > deadline:
            raise AssertionError(f'{len(wcs)} of {count} completions after {timeout} s')
    return wcs


class Side:
    """One end: its own Context (or a shared one), PD, CQ, MR and one QP."""

    def __init__(self, name, qp_type=e.IBV_QPT_RC, msg_size=4096, ctx=None, srq=None,
                 access=ALL_ACCESS, max_wr=64, cq_depth=256, pd=None, cq=None):
        self.own_ctx = ctx is None
        self.ctx = ctx or Context(name=name)
        self.pd = pd or PD(self.ctx)
        self.cq = cq or CQ(self.ctx, cq_depth)
        self.mr = MR(self.pd, msg_size, access)
        self.msg_size = msg_size
        cap = QPCap(max_send_wr=max_wr, max_recv_wr=max_wr, max_send_sge=2, max_recv_sge=2,
                    max_inline_data=64)
        init = QPInitAttr(qp_type=qp_type, scq=self.cq, rcq=self.cq, srq=srq, cap=cap,
                          sq_sig_all=0)
        attr = QPAttr(port_num=1)
        if qp_type == e.IBV_QPT_UD:
            attr.qkey = UD_QKEY
        else:
            attr.qp_access_flags = REMOTE_ACCESS
        self.qp = QP(self.pd, init, attr)

    def gid(self):
        return self.ctx.query_gid(1, 0)

    def ah_to(self, other):
        gr = GlobalRoute(dgid=other.gid(), sgid_index=0)
        return AH(self.pd, attr=AHAttr(port_num=1, is_global=1, gr=gr))

    def close(self):
        if self.own_ctx:
            self.ctx.close()


def connect(a: Side, b: Side, qp_a=None, qp_b=None, mtu=e.IBV_MTU_1024, timeout=10):
    """Both RC / UC QPs to RTS, each aimed at the other."""
    qp_a, qp_b = qp_a or a.qp, qp_b or b.qp
    for me, peer, qp, peer_qp in ((a, b, qp_a, qp_b), (b, a, qp_b, qp_a)):
        attr = QPAttr(port_num=1, path_mtu=mtu)
        attr.qp_access_flags = REMOTE_ACCESS
        attr.dest_qp_num = peer_qp.qp_num
        attr.rq_psn = 0
        attr.sq_psn = 0
        attr.ah_attr = AHAttr(port_num=1, is_global=1,
                              gr=GlobalRoute(dgid=peer.gid(), sgid_index=0))
        attr.max_dest_rd_atomic = 4
        attr.max_rd_atomic = 4
        attr.min_rnr_timer = 1
        attr.timeout = timeout
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        qp.to_rts(attr)
