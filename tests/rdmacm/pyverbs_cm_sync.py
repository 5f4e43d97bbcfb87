"""A synchronous pyverbs rdma_cm program (ids made from AddrInfo, as
rdma_server/rdma_client): ``server ADDR PORT`` or ``client ADDR PORT``."""

import sys

from pyverbs.cmid import CMID, AddrInfo, ConnParam
from pyverbs.qp import QPInitAttr, QPCap
import pyverbs.cm_enums as ce
import pyverbs.enums as e

role, addr, port = sys.argv[1], sys.argv[2], sys.argv[3]
init = QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(max_send_wr=2, max_recv_wr=2))
if role == "server":
    listener = CMID(AddrInfo(src=addr, src_service=port, port_space=ce.RDMA_PS_TCP,
                             flags=ce.RAI_PASSIVE), init)
    listener.listen()
    conn = listener.get_request()
    mr = conn.reg_msgs(32)
    conn.post_recv(mr)
    conn.accept(ConnParam())
    wc = conn.get_recv_comp()
    assert wc.status == e.IBV_WC_SUCCESS, wc
    msg = mr.read(wc.byte_len, 0)
    mr.write(msg.upper(), len(msg))
    conn.post_send(mr, length=len(msg))
    assert conn.get_send_comp().status == e.IBV_WC_SUCCESS
    print("server got", msg)
    conn.close()
    listener.close()
else:
    conn = CMID(AddrInfo(dst=addr, dst_service=port, port_space=ce.RDMA_PS_TCP), init)
    mr = conn.reg_msgs(32)
    conn.post_recv(mr)
    conn.connect(ConnParam())
    mr.write(b"softnic rdma_cm", 15)
    conn.post_send(mr, length=15)
    assert conn.get_send_comp().status == e.IBV_WC_SUCCESS
    wc = conn.get_recv_comp()
    print("client got", mr.read(wc.byte_len, 0))
    conn.disconnect()
    conn.close()
