#!/usr/bin/env python3
"""An ordinary pyverbs program: two RC QPs, RDMA WRITE, READ, SEND and an atomic.

Written against rdma-core's pyverbs and nothing else; on a machine with an RDMA
device it runs on that device.  Without one, run it on softnic:

    softnic exec python3 examples/rc_write_pingpong.py            # softnic0 <-> softnic1
    softnic exec --faults loss=0.05 python3 examples/rc_write_pingpong.py
"""

import sys
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

SIZE = 1 << 20
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)


class Side:
    def __init__(self, name):
        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 64)
        self.mr = MR(self.pd, SIZE, ACCESS)
        cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.gid = self.ctx.query_gid(1, 0)

    def connect(self, peer):
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
        attr.qp_access_flags = ACCESS
        self.qp.to_init(attr)
        attr.path_mtu = e.IBV_MTU_1024
        attr.dest_qp_num = peer.qp.qp_num
        attr.rq_psn = 0
        attr.max_dest_rd_atomic = 4
        attr.min_rnr_timer = 12
        attr.ah_attr = AHAttr(is_global=1, port_num=1,
                              gr=GlobalRoute(dgid=peer.gid, sgid_index=0))
        self.qp.to_rtr(attr)
        attr.sq_psn = 0
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.max_rd_atomic = 4
        self.qp.to_rts(attr)

    def wait(self, n=1):
        wcs = []
        deadline = time.time() + 30
        while len(wcs) < n and time.time() < deadline:
            npolled, got = self.cq.poll(n - len(wcs))
            wcs += got
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                sys.exit(f"work completion failed: status {wc.status}")
        return wcs


def main():
    names = [d.name.decode() for d in get_device_list()]
    a, b = Side(names[0]), Side(names[1 if len(names) > 1 else 0])
    a.connect(b)
    b.connect(a)
    print(f"{names[0]} qp {a.qp.qp_num} <-> {names[1 if len(names) > 1 else 0]} qp {b.qp.qp_num}")

    payload = bytes(range(256)) * (SIZE // 256)
    a.mr.write(payload, SIZE)
    t0 = time.perf_counter()
    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(a.mr.buf, SIZE, a.mr.lkey)])
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
    a.qp.post_send(wr)
    a.wait()
    dt = time.perf_counter() - t0
    assert b.mr.read(SIZE, 0) == payload
    print(f"RDMA WRITE 1 MiB: landed, {SIZE / dt / 1e6:.1f} MB/s")

    b.mr.write(b"hello from b", 12, 4096)
    wr = SendWR(opcode=e.IBV_WR_RDMA_READ, num_sge=1, sg=[SGE(a.mr.buf + 8192, 12, a.mr.lkey)])
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf + 4096)
    a.qp.post_send(wr)
    a.wait()
    print(f"RDMA READ: {a.mr.read(12, 8192)!r}")

    b.qp.post_recv(RecvWR(num_sge=1, sg=[SGE(b.mr.buf + 65536, 4096, b.mr.lkey)]))
    a.mr.write(b"a message", 9, 0)
    wr = SendWR(opcode=e.IBV_WR_SEND_WITH_IMM, num_sge=1, sg=[SGE(a.mr.buf, 9, a.mr.lkey)],
                imm_data=0x12345678)
    a.qp.post_send(wr)
    a.wait()
    (wc,) = b.wait()
    print(f"SEND_WITH_IMM: {b.mr.read(wc.byte_len, 65536)!r}, imm_data {wc.imm_data:#x} "
          f"(network order)")

    b.mr.write((100).to_bytes(8, sys.byteorder), 8, 128)
    for i in range(10):
        wr = SendWR(opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD, num_sge=1,
                    sg=[SGE(a.mr.buf + 256 + 8 * i, 8, a.mr.lkey)])
        wr.set_wr_atomic(rkey=b.mr.rkey, addr=b.mr.buf + 128, compare_add=5, swap=0)
        a.qp.post_send(wr)
    a.wait(10)
    print(f"10 x FETCH_AND_ADD(5) on 100: {int.from_bytes(b.mr.read(8, 128), sys.byteorder)}")
    for s in (a, b):
        s.ctx.close()


if __name__ == "__main__":
    main()
