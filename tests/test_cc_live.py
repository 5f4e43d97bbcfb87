"""Congestion control over real UDP sockets: ECN bits in the IP header.

A DCQCN device sends ECT(0); a receiving device reads the ECN codepoint of
every datagram (IP_RECVTOS), so a CE mark set by a real router becomes a CNP
that cuts the sender's rate.  Loopback has no marking router: the test sets
the sender socket's TOS to CE itself, which is what a router marking every
packet would deliver.
"""

from __future__ import annotations

import socket

from softnic.config import DeviceSpec, RuntimeConfig
from softnic.core.enums import SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import SendWR
from softnic.nic import NIC
from softnic.rig import bring_up, endpoint
from softnic.transport.udp import UdpSocket


def test_ect_is_sent_and_the_ecn_codepoint_is_read():
    a = UdpSocket("127.0.0.1", 0)
    b = UdpSocket("127.0.0.1", 0)
    try:
        a.enable_ecn(send_ect=True)
        b.enable_ecn(send_ect=False)
        a.send(b"x", b.address)
        assert b.wait(2.0)
        assert [(d, e) for d, _, e in b.recv_batch_ecn()] == [(b"x", 2)]    # ECT(0)
        a.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 3)             # CE, as a router
        a.send(b"y", b.address)
        assert b.wait(2.0)
        assert [(d, e) for d, _, e in b.recv_batch_ecn()] == [(b"y", 3)]
        b.send(b"z", a.address)                                            # b sends Not-ECT
        assert a.wait(2.0)
        assert [(d, e) for d, _, e in a.recv_batch_ecn()] == [(b"z", 0)]
    finally:
        a.close()
        b.close()


def test_ce_marks_on_real_sockets_become_cnps_that_cut_the_rate():
    cfg = RuntimeConfig(cc="dcqcn", min_timer=2e-3)
    a, b = (NIC(DeviceSpec(f"cc{i}", None, 0), cfg) for i in range(2))
    try:
        assert a.dev.ect and b.dev.ect
        with a.lock, b.lock:
            ea, eb = endpoint(a.dev, buf_size=1 << 20), endpoint(b.dev, buf_size=1 << 20)
            bring_up(ea, eb, mtu=1024, timeout=14)
            bring_up(eb, ea, mtu=1024, timeout=14)
        line = ea.qp.cc.flow.line_rate_bps
        assert ea.qp.cc.rate == line
        a.sock.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 3)   # every packet arrives CE
        for i in range(4):
            a.call(a.dev.post_send, ea.qp, SendWR(i, W.RDMA_WRITE, [ea.sge(0, 256 << 10)],
                                                  SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                                  rkey=eb.mr.rkey))
        got = []
        a.wait_until(lambda: got.extend(a.dev.poll_cq(ea.send_cq, 16)) or len(got) >= 4, 30)
        assert [w.status for w in got] == [WCStatus.SUCCESS] * 4
        rc, sc = b.counters, a.counters
        assert rc["np_ecn_marked_roce_packets"] > 0
        assert rc["np_cnp_sent"] > 0
        # every CNP that arrived was handled (loopback may drop none or a few)
        b.wait_until(lambda: a.counters["rp_cnp_handled"] >= 1, 5)
        assert 0 < a.counters["rp_cnp_handled"] <= rc["np_cnp_sent"]
        assert sc.get("rp_cnp_ignored", 0) == 0
        assert ea.qp.cc.rate < line and ea.qp.cc.cuts >= 1
    finally:
        a.close()
        b.close()
