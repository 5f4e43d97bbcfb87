"""A datagram for a QP that has no peer yet (RESET or INIT: no address vector)
is counted and dropped; it must not raise out of receive_datagram (that would
stop a live device's progress thread).  On a shared host, a closed program's
peer may still be retransmitting to the address and QPN a new program now has."""

from softnic.core.device import Device
from softnic.core.enums import Access, QPAttrMask as M, QPState, QPType
from softnic.core.qp import QPAttr, QPCap, QPInitAttr
from softnic.wire.icrc import append_icrc
from softnic.wire.roce import Opcode, encode


def test_a_request_for_a_qp_in_init_is_dropped_and_counted():
    dev = Device("d", "10.0.0.2")
    pd = dev.alloc_pd()
    cq = dev.create_cq(8)
    qp = dev.create_qp(pd, QPInitAttr(QPType.RC, cq, cq, None, QPCap(4, 4)))
    src = ("10.0.0.1", 4791)
    pkt = encode(Opcode.RC_SEND_ONLY, dest_qp=qp.qpn, psn=0, payload=b"stale")
    data = bytes(append_icrc(pkt, src[0], dev.ip, src[1], dev.port))
    dev.receive_datagram(data, src, 0.0)                 # RESET
    dev.modify_qp(qp, QPAttr(qp_state=QPState.INIT, qp_access_flags=Access.REMOTE_WRITE),
                  M.STATE | M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS)
    dev.receive_datagram(data, src, 0.0)                 # INIT
    assert dev.counters["rcvd_bad_state"] == 2 and not cq.poll(8)
