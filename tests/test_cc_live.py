"""Congestion control over real UDP sockets: ECN bits in the IP header.

A DCQCN device sends ECT(0); a receiving device reads the ECN codepoint of
every datagram (IP_RECVTOS), so a CE mark set by a real router becomes a CNP
that cuts the sender's rate.  Loopback has no marking router: the test sets
the sender socket's TOS to CE itself, which is what a router marking every
packet would deliver.
"""

from __future__ import annotations

import socket

import pytest

from softnic.driver.config import DeviceSpec, RuntimeConfig
from softnic.core.enums import SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import SendWR
from softnic.driver.nic import NIC
from softnic.experiments.rig import bring_up, endpoint
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
        # The rate was cut; it is either still below line rate or came back to it
        # through DCQCN's own increase events (fast recovery halves the gap every
        # 55 us, so about 2 ms after the last CNP it is back: a slow host may
        # look that late).
        cc = ea.qp.cc
        assert cc.cuts >= 1
        assert cc.rate < line or cc.t_events + cc.bc_events > 0
    finally:
        a.close()
        b.close()


def test_per_device_specs_from_the_environment():
    from softnic.driver import config
    cfg = config.load({"SOFTNIC_CC": "softnic0=dcqcn;softnic1=hpcc:eta=0.9"})
    assert config.cc_for(cfg, "softnic0") == "dcqcn"
    assert config.cc_for(cfg, "softnic1") == "hpcc:eta=0.9"
    assert config.cc_for(cfg, "softnic2") == "none"
    assert config.cc_for(config.load({"SOFTNIC_CC": "swift"}), "anything") == "swift"
    for bad, match in (("bogus", "unknown congestion controller"),
                       ("softnic0=dcqcn:zz=1", "no parameter 'zz'"),
                       ("dcqcn;hpcc", "one spec for all devices")):
        with pytest.raises(ValueError, match=match):
            config.load({"SOFTNIC_CC": bad})


def test_the_line_rate_sets_the_controllers_rate_and_the_ports_speed():
    """SOFTNIC_LINK_GBPS is one fact: the live device's line rate for its
    controllers and, mapped as Linux maps an Ethernet port's speed (every boundary
    of ``ib_get_eth_speed``'s table without lanes), the port's active speed and
    width on the Python face; a bad value is refused with the variable named."""
    from softnic.core.device import port_speed
    from softnic.driver import config
    table = [(0.1e9, (1, 1)), (1e9, (1, 1)), (1.5e9, (8, 1)), (10e9, (8, 1)),
             (20e9, (2, 2)), (25e9, (32, 1)), (40e9, (8, 2)), (50e9, (32, 16)),
             (100e9, (32, 2)), (200e9, (64, 2)), (400e9, (128, 2))]
    for bps, want in table:
        assert port_speed(bps) == want, bps
    assert config.load({}).link_gbps == 100.0
    cfg = config.load({"SOFTNIC_LINK_GBPS": "25", "SOFTNIC_CC": "dcqcn"})
    assert cfg.link_gbps == 25.0
    for bad in ("0", "-3", "fast", "1e9", "nan"):
        with pytest.raises(ValueError, match="SOFTNIC_LINK_GBPS"):
            config.load({"SOFTNIC_LINK_GBPS": bad})
    a, b = NIC(DeviceSpec("t0", None, 0), cfg), NIC(DeviceSpec("t1", None, 0), cfg)
    try:
        with a.lock, b.lock:
            ea, eb = endpoint(a.dev, buf_size=1 << 16), endpoint(b.dev, buf_size=1 << 16)
            bring_up(ea, eb, mtu=1024, timeout=14)
            assert ea.qp.cc.flow.line_rate_bps == 25e9 == ea.qp.cc.rate   # DCQCN starts there
    finally:
        a.close()
        b.close()
    import softnic.driver.nic as _nic
    from verbs_api.device import Context
    _nic.configure(config.load({"SOFTNIC_LINK_GBPS": "25", "SOFTNIC_DEVICES": "1"}))
    try:
        with Context(name="softnic0") as ctx:
            port = ctx.query_port(1)
            assert (port.active_speed, port.active_width) == (32, 1)
    finally:
        _nic.configure(None)


def test_per_qp_controller_through_the_verbs_api():
    import verbs_api.enums as e
    from verbs_api.pyverbs_error import PyverbsError
    from verbskit import Side, connect, poll
    a, b = Side("softnic0", msg_size=1 << 16), Side("softnic1", msg_size=1 << 16)
    try:
        a.qp.set_congestion_control("swift")
        with pytest.raises(PyverbsError, match="unknown congestion controller"):
            b.qp.set_congestion_control("bogus")
        connect(a, b)
        assert a.qp._eqp.cc.name == "swift" and b.qp._eqp.cc is None
        from verbs_api.wr import SGE, SendWR
        wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(a.mr.buf, 1 << 16, a.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
        a.qp.post_send(wr)
        (wc,) = poll(a.cq)
        assert wc.status == e.IBV_WC_SUCCESS
        assert a.qp._eqp.ccs.inflight == 0 and not a.qp._eqp.ccs.sent   # all acknowledged
    finally:
        a.close()
        b.close()
