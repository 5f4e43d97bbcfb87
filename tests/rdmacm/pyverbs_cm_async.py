"""A pyverbs rdma_cm program (event channels, one process, two devices): the
passive side on the first device, the active side on the second, a SEND each
way and a disconnect.  Runs unmodified over rdma-core's pyverbs on RDMA
hardware, and over softnic under ``softnic exec``."""

import sys

from pyverbs.cmid import CMID, AddrInfo, CMEventChannel, CMEvent, ConnParam
from pyverbs.qp import QPInitAttr, QPCap
import pyverbs.cm_enums as ce
import pyverbs.enums as e

server_ip, client_ip, port = sys.argv[1], sys.argv[2], sys.argv[3]


def expect(ch, kind):
    ev = CMEvent(ch)
    assert ev.event_type == kind, (ev.event_str(), kind)
    return ev


sch, cch = CMEventChannel(), CMEventChannel()
listener = CMID(sch)
listener.bind_addr(AddrInfo(src=server_ip, src_service=port, port_space=ce.RDMA_PS_TCP,
                            flags=ce.RAI_PASSIVE))
listener.listen(4)
client = CMID(cch)
client.resolve_addr(AddrInfo(src=client_ip, dst=server_ip, dst_service=port,
                             port_space=ce.RDMA_PS_TCP))
expect(cch, ce.RDMA_CM_EVENT_ADDR_RESOLVED).ack_cm_event()
client.resolve_route()
expect(cch, ce.RDMA_CM_EVENT_ROUTE_RESOLVED).ack_cm_event()
cap = QPCap(max_send_wr=4, max_recv_wr=4)
client.create_qp(QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap))
cmr = client.reg_msgs(64)
client.post_recv(cmr)
param = ConnParam(data_len=8)
param.set_private_data(b"hi there")
client.connect(param)
ev = expect(sch, ce.RDMA_CM_EVENT_CONNECT_REQUEST)
assert ev.private_data[:8] == b"hi there", ev.private_data
server = CMID(ev, listen_id=listener)
ev.ack_cm_event()
server.create_qp(QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap))
smr = server.reg_msgs(64)
server.post_recv(smr)
server.accept(ConnParam())
expect(cch, ce.RDMA_CM_EVENT_ESTABLISHED).ack_cm_event()
expect(sch, ce.RDMA_CM_EVENT_ESTABLISHED).ack_cm_event()
cmr.write(b"ping from the client", 20)
client.post_send(cmr, length=20)
wc = server.get_recv_comp()
assert wc.status == e.IBV_WC_SUCCESS and wc.byte_len == 20
assert smr.read(20, 0) == b"ping from the client"
assert client.get_send_comp().status == e.IBV_WC_SUCCESS
smr.write(b"pong", 4)
server.post_send(smr, length=4)
assert client.get_recv_comp().byte_len == 4 and cmr.read(4, 0) == b"pong"
client.disconnect()
expect(cch, ce.RDMA_CM_EVENT_DISCONNECTED).ack_cm_event()
expect(sch, ce.RDMA_CM_EVENT_DISCONNECTED).ack_cm_event()
for obj in (server, client, listener, sch, cch):
    obj.close()
print("pyverbs rdma_cm: connected, exchanged, disconnected")
