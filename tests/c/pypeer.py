"""A pyverbs program that is the peer of a C program on softnic's libibverbs.

    softnic exec python3 pypeer.py COMMAND...    (COMMAND: the C side, datacheck --peer)

It starts COMMAND, trades QP details with it over its stdin/stdout, and lets it
WRITE, READ and SEND; then checks every byte that arrived.  Written against the
pyverbs API only (``softnic exec`` makes ``import pyverbs`` resolve to softnic's).
"""

import ipaddress
import subprocess
import sys

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute, GID
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import RecvWR, SGE

N = 100000
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


def pattern(n: int, seed: int) -> bytes:
    """The bytes datacheck.c's fill() writes."""
    m = 0xFFFFFFFF
    x = (seed * 2654435761 + 1) & m
    out = bytearray(n)
    for i in range(n):
        x ^= (x << 13) & m
        x ^= x >> 17
        x ^= (x << 5) & m
        out[i] = x & 0xFF
    return bytes(out)


def main(cmd):
    ctx = Context(name="softnic0")
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    target = MR(pd, N, ACCESS)
    inbox = MR(pd, N, e.IBV_ACCESS_LOCAL_WRITE)
    init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                      cap=QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1))
    init_attr = QPAttr(port_num=1)
    init_attr.qp_access_flags = ACCESS
    qp = QP(pd, init, init_attr)
    qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(inbox.buf, N, inbox.lkey)]))

    peer = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    qpn, gid_hex, _rkey, _addr = peer.stdout.readline().split()
    dgid = str(ipaddress.IPv6Address(bytes.fromhex(gid_hex)))
    attr = QPAttr(port_num=1, path_mtu=e.IBV_MTU_4096)
    attr.qp_access_flags = ACCESS
    attr.dest_qp_num = int(qpn)
    attr.rq_psn = attr.sq_psn = 0x1234          # what datacheck.c uses on its side
    attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=GID(dgid), sgid_index=0))
    attr.max_dest_rd_atomic = attr.max_rd_atomic = 4
    attr.min_rnr_timer = 1
    attr.timeout = 10
    attr.retry_cnt = attr.rnr_retry = 7
    qp.to_rts(attr)
    my_gid = GID(str(ctx.query_gid(1, 0))).raw.hex()
    peer.stdin.write(f"{qp.qp_num} {my_gid} {target.rkey} {target.buf}\n")
    peer.stdin.flush()

    done = peer.stdout.readline().strip()
    assert done == "DONE", f"the C peer said {done!r}"
    wc = None
    for _ in range(1000000):
        n, wcs = cq.poll(1)
        if n:
            wc = wcs[0]
            break
    assert wc is not None, "no receive completion"
    assert wc.status == e.IBV_WC_SUCCESS, wc.status
    assert wc.opcode == e.IBV_WC_RECV and wc.byte_len == N, (wc.opcode, wc.byte_len)
    assert int.from_bytes(wc.imm_data.to_bytes(4, sys.byteorder), "big") == 0xC0FFEE
    want = pattern(N, 42)
    assert target.read(N, 0) == want, "WRITE from the C peer: bytes differ"
    assert inbox.read(N, 0) == want, "SEND from the C peer: bytes differ"
    peer.stdin.write("BYE\n")
    peer.stdin.flush()
    assert peer.wait(timeout=30) == 0, "the C peer failed"
    print(f"python peer: {N} bytes written, read back and sent by the C peer, all checked")


if __name__ == "__main__":
    main(sys.argv[1:])
