"""iWARP over TCP: the MPA/DDP/RDMAP codec, the sans-I/O engine between two
devices joined by in-memory streams, and tshark's reading of a live capture."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time

import pytest

from softnic.core.enums import Access, EventType, QPAttrMask as M, QPState, QPType, SendFlags, \
    WCOpcode, WCStatus, WROpcode as W
from softnic.core.errors import VerbsError
from softnic.core.iwarp import ConnState, IwarpDevice
from softnic.core.memory import Buffer
from softnic.core.qp import AHAttr, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR
from softnic.wire import iwarp as iw
from softnic.wire.iwarp import (DdpEtype, DdpTaggedEcode, DdpUntaggedEcode, Layer, LlpEcode,
                                Opcode, RdmapEcode, RdmapEtype, Segment, Terminate)

from iwarpkit import Streams

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


# ------------------------------------------------------------------ codec

def test_crc32c_matches_the_iscsi_vector_and_goes_lsb_first():
    # RFC 3720 B.4: 32 bytes of zeros give CRC32c 0x8a9136aa, sent as aa 36 91 8a.
    seg = Segment(Opcode.SEND, True, b"", qn=0, msn=1)
    f = iw.encode_fpdu(seg)
    from crc32c import crc32c
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert f[-4:] == crc32c(f[:-4]).to_bytes(4, "little")


def test_mpa_request_and_reply_frames():
    pd = iw.encode_private(0x11, 0x22)
    req = iw.encode_mpa(iw.MpaFrame(True, pd))
    assert req[:16] == b"MPA ID Req Frame" and req[16] == 0x40 and req[17] == 1
    assert int.from_bytes(req[18:20], "big") == len(pd) == 12
    assert iw.decode_mpa(req, request=True) == (iw.MpaFrame(True, pd), len(req))
    assert iw.decode_mpa(req[:25], request=True) is None          # incomplete
    rep = iw.encode_mpa(iw.MpaFrame(False, pd, reject=True))
    assert rep[:16] == b"MPA ID Rep Frame" and rep[16] == 0x60      # C and R
    frame, _ = iw.decode_mpa(rep, request=False)
    assert frame.reject and not frame.markers and iw.decode_private(frame.private_data) == \
        (0x11, 0x22)
    with pytest.raises(iw.IwarpError):
        iw.decode_mpa(rep, request=True)                           # a Reply is not a Request


@pytest.mark.parametrize("seg", [
    Segment(Opcode.RDMA_WRITE, False, b"abcde", stag=0x1234, to=1 << 40),
    Segment(Opcode.RDMA_READ_RESPONSE, True, b"x" * 7, stag=7, to=99),
    Segment(Opcode.SEND_SE_INVALIDATE, True, b"hello", qn=0, msn=5, mo=16, inv_stag=0xABCD),
    Segment(Opcode.RDMA_READ_REQUEST, True, iw.ReadRequest(1, 2, 3, 4, 5).encode(), qn=1,
            msn=9),
    Segment(Opcode.IMMEDIATE_DATA, True, bytes(8), qn=0, msn=2),
])
def test_fpdu_round_trip_pad_and_crc(seg):
    f = iw.encode_fpdu(seg)
    hdr = iw.TAGGED_HDR if seg.tagged else iw.UNTAGGED_HDR
    assert int.from_bytes(f[:2], "big") == hdr + len(seg.payload)
    assert len(f) % 4 == 0 and len(f) == iw.fpdu_len(hdr + len(seg.payload))
    got, end = iw.decode_fpdu(f)
    assert end == len(f)
    assert got == Segment(seg.opcode, seg.last, got.payload, seg.stag, seg.to, seg.qn, seg.msn,
                          seg.mo, seg.inv_stag)
    assert bytes(got.payload) == bytes(seg.payload)
    assert iw.decode_fpdu(f[:-1]) is None
    bad = bytearray(f)
    bad[3] ^= 0x40
    with pytest.raises(iw.CrcError):
        iw.decode_fpdu(bytes(bad))


def test_terminate_round_trip_quotes_the_failed_headers():
    failed = Segment(Opcode.RDMA_READ_REQUEST, True, iw.ReadRequest(1, 2, 64, 0xBAD, 8).encode(),
                     qn=1, msn=3)
    t = Terminate(Layer.RDMAP, RdmapEtype.REMOTE_PROTECTION, RdmapEcode.INVALID_STAG,
                  46, failed.header(), bytes(failed.payload))
    b = t.encode()
    assert b[0] == 0x01 and b[1] == 0x00 and b[2] & 0xE0 == 0xE0    # layer 0 etype 1, M D R
    back = Terminate.decode(b)
    assert back == t
    q = back.quoted_segment()
    assert (q.opcode, q.qn, q.msn) == (Opcode.RDMA_READ_REQUEST, 1, 3)


# ------------------------------------------------------------------ the engine in memory

class Side:
    def __init__(self, dev: IwarpDevice, access=ALL, size=1 << 16):
        self.dev = dev
        self.pd = dev.alloc_pd()
        self.cq = dev.create_cq(256)
        self.buf = Buffer(size)
        self.mr = dev.reg_mr(self.pd, self.buf.addr, size, access, self.buf)
        self.qp = dev.create_qp(self.pd, QPInitAttr(QPType.RC, self.cq, self.cq, None,
                                                    QPCap(32, 32, 2, 2, 64)))

    def init(self, qp=None):
        qp = qp or self.qp
        self.dev.modify_qp(qp, QPAttr(qp_state=QPState.INIT,
                                      qp_access_flags=Access.REMOTE_WRITE | Access.REMOTE_READ),
                           M.STATE | M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS)

    def rtr(self, peer: "Side", qp=None, peer_qp=None):
        qp, peer_qp = qp or self.qp, peer_qp or peer.qp
        self.dev.modify_qp(qp, QPAttr(qp_state=QPState.RTR, ah_attr=AHAttr(dgid=peer.dev.gid),
                                      dest_qp_num=peer_qp.qpn, max_dest_rd_atomic=4),
                           M.STATE | M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN
                           | M.MAX_DEST_RD_ATOMIC | M.MIN_RNR_TIMER)

    def rts(self, qp=None):
        self.dev.modify_qp(qp or self.qp, QPAttr(qp_state=QPState.RTS, max_rd_atomic=4),
                           M.STATE | M.SQ_PSN | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY
                           | M.MAX_QP_RD_ATOMIC)

    def post(self, wr_id, op, off, n, flags=SendFlags.SIGNALED, **kw):
        self.dev.post_send(self.qp, SendWR(wr_id, op, [(self.buf.addr + off, n, self.mr.lkey)],
                                           flags, **kw))

    def recv(self, wr_id, off, n):
        self.dev.post_recv(self.qp, RecvWR(wr_id, [(self.buf.addr + off, n, self.mr.lkey)]))

    def wcs(self):
        return [(w.wr_id, w.status, w.opcode) for w in self.cq.poll(100)]


def connected(chunk=None, ips=("10.0.0.1", "10.0.0.2")):
    a = Side(IwarpDevice("a", ips[0], 4791))
    b = Side(IwarpDevice("b", ips[1], 4791))
    for s in (a, b):
        s.init()
    a.rtr(b)
    b.rtr(a)
    a.rts()
    b.rts()
    streams = Streams(a.dev, b.dev, chunk=chunk)
    streams.run()
    return a, b, streams


def test_handshake_on_the_wire_and_who_connects():
    a, b, s = connected()
    (src0, dst0, req), (src1, dst1, rep) = s.log[:2]
    # 10.0.0.1 sorts below 10.0.0.2: a's QP is the MPA initiator.
    assert (src0, dst0) == (a.dev.address, b.dev.address)
    frame, n = iw.decode_mpa(req, request=True)
    assert iw.decode_private(frame.private_data) == (a.qp.qpn, b.qp.qpn)
    assert frame.crc and not frame.markers and frame.revision == 1
    frame, n = iw.decode_mpa(rep, request=False)
    assert not frame.reject and iw.decode_private(frame.private_data) == (b.qp.qpn, a.qp.qpn)
    # the initiator's first FPDU: the zero-length RDMA Write to STag 0
    seg, _ = iw.decode_fpdu(req[n:] if len(req) > n else s.log[2][2])
    assert (seg.opcode, seg.stag, len(seg.payload), seg.last) == (Opcode.RDMA_WRITE, 0, 0, True)
    assert a.dev.counters["mpa_replies_rcvd"] == b.dev.counters["mpa_replies_sent"] == 1


@pytest.mark.parametrize("chunk", [None, 1, 7, 1000])
def test_write_read_send_and_write_with_imm(chunk):
    a, b, s = connected(chunk)
    data = os.urandom(40000)
    a.buf.view[:40000] = data
    b.recv(50, 60000, 1000)
    b.recv(51, 61000, 8)
    a.post(1, W.RDMA_WRITE, 0, 40000, remote_addr=b.buf.addr + 8, rkey=b.mr.rkey)
    a.post(2, W.RDMA_READ, 40000, 20000, remote_addr=b.buf.addr + 8, rkey=b.mr.rkey)
    a.post(3, W.SEND, 0, 1000, flags=SendFlags.SIGNALED | SendFlags.SOLICITED)
    a.post(4, W.RDMA_WRITE_WITH_IMM, 0, 100, remote_addr=b.buf.addr + 50000, rkey=b.mr.rkey,
           imm_data=0xCAFE)
    s.run(100000)
    assert a.wcs() == [(1, WCStatus.SUCCESS, WCOpcode.RDMA_WRITE),
                       (2, WCStatus.SUCCESS, WCOpcode.RDMA_READ),
                       (3, WCStatus.SUCCESS, WCOpcode.SEND),
                       (4, WCStatus.SUCCESS, WCOpcode.RDMA_WRITE)]
    assert bytes(b.buf.view[8:40008]) == data and bytes(a.buf.view[40000:60000]) == data[:20000]
    got = b.cq.poll(10)
    assert [(w.wr_id, w.opcode, w.byte_len) for w in got] == [
        (50, WCOpcode.RECV, 1000), (51, WCOpcode.RECV_RDMA_WITH_IMM, 100)]
    assert got[1].imm_data == 0xCAFE and bytes(b.buf.view[60000:61000]) == data[:1000]


def test_loopback_qps_on_one_device_and_a_request_before_rtr_waits():
    dev = IwarpDevice("a", "10.0.0.1", 4791)
    x, y = Side(dev), Side(dev)
    y.qp2 = dev.create_qp(y.pd, QPInitAttr(QPType.RC, y.cq, y.cq, None, QPCap(4, 4)))
    for s in (x, y):
        s.init()
    x.rtr(y)                     # x has the lower QPN: it connects; y is still in INIT
    x.rts()
    streams = Streams(dev)
    streams.run()
    assert any(c.state == ConnState.PENDING_QP for c in dev.conns.values())
    y.rtr(x)
    y.rts()
    streams.run()
    y.recv(1, 0, 64)
    x.buf.view[:5] = b"loops"
    x.post(9, W.SEND, 0, 5)
    streams.run()
    assert x.wcs() == [(9, WCStatus.SUCCESS, WCOpcode.SEND)]
    assert y.wcs() == [(1, WCStatus.SUCCESS, WCOpcode.RECV)] and bytes(y.buf.view[:5]) == b"loops"


def test_a_request_for_an_unknown_qp_is_rejected():
    a = Side(IwarpDevice("a", "10.0.0.1", 4791))
    b = Side(IwarpDevice("b", "10.0.0.2", 4791))
    a.init()
    a.dev.modify_qp(a.qp, QPAttr(qp_state=QPState.RTR, ah_attr=AHAttr(dgid=b.dev.gid),
                                 dest_qp_num=0x999, max_dest_rd_atomic=1),
                    M.STATE | M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN | M.MAX_DEST_RD_ATOMIC
                    | M.MIN_RNR_TIMER)
    Streams(a.dev, b.dev).run()
    assert b.dev.counters["mpa_rejects_sent"] == 1 and a.dev.counters["mpa_rejects_rcvd"] == 1
    assert a.qp.state == QPState.ERR and (EventType.QP_FATAL, a.qp) in a.dev.events


def _terminate_seen(s: Streams, sender) -> Terminate:
    for src, _, data in s.log:
        if src != sender.dev.address:
            continue
        off = 0
        while True:
            try:
                got = iw.decode_fpdu(data, off)
            except iw.IwarpError:
                break
            if got is None:
                break
            seg, off = got
            if seg.opcode == Opcode.TERMINATE:
                return Terminate.decode(seg.payload)
    raise AssertionError("no Terminate on the wire")


@pytest.mark.parametrize("case", ["bad-stag", "bounds", "no-access", "other-pd"])
def test_write_protection_errors_terminate_with_ddp_or_rdmap_codes(case):
    a, b, s = connected()
    other = Side(b.dev)                              # an MR of another PD on b
    ro = b.dev.reg_mr(b.pd, b.buf.addr, 4096, Access.LOCAL_WRITE | Access.REMOTE_READ)
    rkey, addr = {"bad-stag": (b.mr.rkey ^ 0xFF00, b.buf.addr),
                  "bounds": (b.mr.rkey, b.buf.addr + (1 << 16) - 8),
                  "no-access": (ro.rkey, b.buf.addr),
                  "other-pd": (other.mr.rkey, other.buf.addr)}[case]
    b.recv(7, 0, 64)
    a.post(1, W.RDMA_WRITE, 0, 64, remote_addr=addr, rkey=rkey)
    s.run()
    a.post(2, W.SEND, 0, 8)                          # after the Terminate: flushed
    s.run()
    term = _terminate_seen(s, b)
    expected = {"bad-stag": (Layer.DDP, DdpEtype.TAGGED_BUFFER, DdpTaggedEcode.INVALID_STAG),
                "bounds": (Layer.DDP, DdpEtype.TAGGED_BUFFER, DdpTaggedEcode.BASE_BOUNDS),
                "no-access": (Layer.RDMAP, RdmapEtype.REMOTE_PROTECTION,
                              RdmapEcode.ACCESS_RIGHTS),
                "other-pd": (Layer.DDP, DdpEtype.TAGGED_BUFFER,
                             DdpTaggedEcode.STAG_NOT_ASSOCIATED)}[case]
    assert (term.layer, term.etype, term.ecode) == expected
    q = term.quoted_segment()
    assert (q.opcode, q.stag, q.to) == (Opcode.RDMA_WRITE, rkey, addr)
    assert term.ddp_len == iw.TAGGED_HDR + 64
    # the requester: the WRITE was complete when handed to TCP; then ERR and a flush
    assert a.wcs() == [(1, WCStatus.SUCCESS, WCOpcode.RDMA_WRITE),
                       (2, WCStatus.WR_FLUSH_ERR, WCOpcode.SEND)]
    assert a.qp.state == QPState.ERR and (EventType.QP_FATAL, a.qp) in a.dev.events
    # the responder: access-error event, ERR, its receive flushed
    assert b.qp.state == QPState.ERR and (EventType.QP_ACCESS_ERR, b.qp) in b.dev.events
    assert b.wcs() == [(7, WCStatus.WR_FLUSH_ERR, WCOpcode.RECV)]


@pytest.mark.parametrize("case", ["bad-stag", "bounds", "no-access"])
def test_read_protection_errors_fail_the_read_on_the_requester(case):
    a, b, s = connected()
    wo = b.dev.reg_mr(b.pd, b.buf.addr, 4096, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    rkey, addr = {"bad-stag": (0x7777, b.buf.addr), "bounds": (b.mr.rkey, b.buf.addr - 1),
                  "no-access": (wo.rkey, b.buf.addr)}[case]
    a.post(1, W.RDMA_READ, 0, 128, remote_addr=addr, rkey=rkey)
    a.post(2, W.RDMA_WRITE, 0, 8, remote_addr=b.buf.addr, rkey=b.mr.rkey)
    s.run()
    term = _terminate_seen(s, b)
    assert (term.layer, term.etype) == (Layer.RDMAP, RdmapEtype.REMOTE_PROTECTION)
    assert term.ecode == {"bad-stag": RdmapEcode.INVALID_STAG, "bounds": RdmapEcode.BASE_BOUNDS,
                          "no-access": RdmapEcode.ACCESS_RIGHTS}[case]
    assert iw.ReadRequest.decode(term.rdmap_header).src_stag == rkey
    got = a.wcs()
    assert got[0] == (1, WCStatus.REM_ACCESS_ERR, WCOpcode.RDMA_READ)
    assert a.qp.state == QPState.ERR and b.qp.state == QPState.ERR


def test_send_without_a_receive_and_a_send_too_long():
    a, b, s = connected()
    a.post(1, W.SEND, 0, 10)
    s.run()
    term = _terminate_seen(s, b)
    assert (term.layer, term.etype, term.ecode) == (Layer.DDP, DdpEtype.UNTAGGED_BUFFER,
                                                    DdpUntaggedEcode.INVALID_MSN_NO_BUFFER)
    assert b.qp.state == a.qp.state == QPState.ERR

    a, b, s = connected()
    b.recv(5, 0, 16)
    a.post(1, W.SEND, 0, 40000)        # three segments; the first already overflows
    s.run()
    term = _terminate_seen(s, b)
    assert (term.layer, term.etype, term.ecode) == (Layer.DDP, DdpEtype.UNTAGGED_BUFFER,
                                                    DdpUntaggedEcode.MESSAGE_TOO_LONG)
    assert b.wcs() == [(5, WCStatus.LOC_LEN_ERR, WCOpcode.RECV)]
    assert a.qp.state == QPState.ERR


def test_send_with_invalidate_and_a_key_that_cannot_be_invalidated():
    a, b, s = connected()
    target = b.dev.reg_mr(b.pd, b.buf.addr, 4096, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    b.recv(1, 0, 64)
    a.post(2, W.SEND_WITH_INV, 0, 8, invalidate_rkey=target.rkey)
    s.run()
    wc = b.cq.poll(1)[0]
    assert wc.status == WCStatus.SUCCESS and wc.invalidated_rkey == target.rkey
    assert not target.valid
    b.recv(3, 0, 64)
    a.post(4, W.SEND_WITH_INV, 0, 8, invalidate_rkey=0x5555)
    s.run()
    term = _terminate_seen(s, b)
    assert (term.layer, term.etype, term.ecode) == (Layer.RDMAP, RdmapEtype.REMOTE_PROTECTION,
                                                    RdmapEcode.CANNOT_INVALIDATE)
    assert b.wcs() == [(3, WCStatus.LOC_PROT_ERR, WCOpcode.RECV)]


def test_a_corrupted_fpdu_is_an_llp_crc_error():
    a, b, s = connected()
    b.recv(1, 0, 64)
    a.post(1, W.SEND, 0, 8)
    out = a.dev.stream_data_to_send(0.0)
    (cid, data), = out
    pcid = s.links[(id(a.dev), cid)][1]
    bad = bytearray(data)
    bad[10] ^= 1
    b.dev.receive_stream(pcid, bytes(bad), 0.0)
    assert b.dev.counters["rcvd_crc_err"] == 1
    term = Terminate.decode(iw.decode_fpdu(b.dev.stream_data_to_send(0.0)[0][1])[0].payload)
    assert (term.layer, term.ecode) == (Layer.LLP, LlpEcode.CRC)
    assert b.qp.state == QPState.ERR and b.dev.connections_to_close() == [pcid]
    assert (EventType.QP_FATAL, b.qp) in b.dev.events


def test_what_iwarp_does_not_have_is_refused():
    a, b, s = connected()
    for op in (W.ATOMIC_FETCH_AND_ADD, W.ATOMIC_CMP_AND_SWP, W.SEND_WITH_IMM):
        with pytest.raises(VerbsError) as ex:
            a.post(1, op, 0, 8, remote_addr=b.buf.addr, rkey=b.mr.rkey)
        assert ex.value.errno == errno.EINVAL
    for t in (QPType.UD, QPType.UC):
        with pytest.raises(VerbsError) as ex:
            a.dev.create_qp(a.pd, QPInitAttr(t, a.cq, a.cq))
        assert ex.value.errno == errno.EOPNOTSUPP
    assert a.dev.get_timer() is None                   # no retransmission on TCP


def test_a_qp_moved_to_err_closes_its_stream_and_the_peer_fails_too():
    a, b, s = connected()
    a.dev.modify_qp(a.qp, QPAttr(qp_state=QPState.ERR), M.STATE)
    s.run()
    assert b.qp.state == QPState.ERR and (EventType.QP_FATAL, b.qp) in b.dev.events
    assert not a.dev.conns and not b.dev.conns


def test_closing_the_connection_fails_the_qps():
    a, b, s = connected()
    b.recv(1, 0, 64)
    a.dev.destroy_qp(a.qp)
    s.run()
    assert b.qp.state == QPState.ERR and (EventType.QP_FATAL, b.qp) in b.dev.events
    assert b.wcs() == [(1, WCStatus.WR_FLUSH_ERR, WCOpcode.RECV)]


# ------------------------------------------------------------------ configuration

def test_transport_per_device_and_for_all():
    from softnic.driver import config
    c = config.load({"SOFTNIC_DEVICES": "x=127.0.0.2/tcp,y=127.0.0.3:5000"})
    assert c.transport_of("x") == "tcp" and c.transport_of("y") == "udp"
    assert c.devices[1].port == 5000
    c = config.load({"SOFTNIC_DEVICES": "x=127.0.0.2/udp,y=127.0.0.3",
                     "SOFTNIC_TRANSPORT": "TCP"})
    assert c.transport_of("x") == "udp" and c.transport_of("y") == "tcp"
    for bad in ({"SOFTNIC_TRANSPORT": "sctp"}, {"SOFTNIC_DEVICES": "x=127.0.0.2/quic"}):
        with pytest.raises(ValueError, match="udp' or 'tcp"):
            config.load(bad)


# ------------------------------------------------------------------ tshark

@pytest.fixture(scope="module")
def tshark() -> str:
    """tshark's path; a missing tshark skips the test, except in CI, where it fails."""
    path = shutil.which("tshark")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tshark is not installed, and CI must run the iWARP cross-check")
        pytest.skip("tshark is not installed")
    return path


def _live_session(tmp_path):
    """A real TCP session between two live iWARP devices, captured; returns what was done."""
    import softnic.driver.config as config
    import softnic.driver.nic as nic
    nic.configure(config.RuntimeConfig(devices=config.parse_devices("2"), transport="tcp",
                                       capture=str(tmp_path / "iw.pcap")))
    try:
        na, nb = nic.open_device("softnic0"), nic.open_device("softnic1")
        a, b = Side(na.dev), Side(nb.dev)
        for s, n in ((a, na), (b, nb)):
            n.call(s.init)
        na.call(a.rtr, b)
        nb.call(b.rtr, a)
        na.call(a.rts)
        nb.call(b.rts)
        a.buf.view[:4096] = b"\x00" * 4096          # plain bytes: no payload heuristics fire
        nb.call(b.recv, 1, 0, 256)
        na.call(a.post, 1, W.RDMA_WRITE, 0, 100, remote_addr=b.buf.addr + 64, rkey=b.mr.rkey)
        na.call(a.post, 2, W.SEND, 0, 40)
        na.call(a.post, 3, W.RDMA_READ, 512, 200, remote_addr=b.buf.addr, rkey=b.mr.rkey)
        na.call(a.post, 4, W.RDMA_READ, 1024, 16, remote_addr=b.buf.addr, rkey=0xBAD00)
        deadline = time.monotonic() + 10
        got = []
        while len(got) < 4:
            na.poll()
            nb.poll()
            got += a.cq.poll(10)
            assert time.monotonic() < deadline
        assert [w.status for w in got] == [WCStatus.SUCCESS] * 3 + [WCStatus.REM_ACCESS_ERR]
        facts = {"ports": (na.port, nb.port), "a_qpn": a.qp.qpn, "b_qpn": b.qp.qpn,
                 "rkey": b.mr.rkey, "addr": b.buf.addr}
    finally:
        nic.configure(None)
    return facts, sorted(tmp_path.glob("iw-*.pcap"))


def _port_rivals(tshark: str, pcap: str) -> list[str]:
    """``--disable-protocol`` for each dissector tshark registers on a TCP port the
    capture uses: MPA is found by a heuristic, which a port's own dissector comes
    before (an ephemeral port of 48049 made the session CBSP)."""
    ports = set(subprocess.run([tshark, "-n", "-r", pcap, "-T", "fields", "-e", "tcp.srcport",
                                "-e", "tcp.dstport"], capture_output=True, text=True,
                               check=True, timeout=60).stdout.split())
    decodes = subprocess.run([tshark, "-G", "decodes"], capture_output=True, text=True,
                             check=True).stdout
    out = []
    for line in decodes.splitlines():
        table, _, rest = line.partition("\t")
        port, _, proto = rest.partition("\t")
        if table == "tcp.port" and port in ports and proto:
            out += ["--disable-protocol", proto]
    return out


def test_a_port_with_a_dissector_of_its_own_is_still_decoded_as_mpa(tshark, tmp_path):
    """A live session's capture with the client's port made CBSP's registered one
    (48049, which the kernel may pick as an ephemeral port): tshark reads it as
    CBSP, and as MPA once ``_port_rivals`` disables the port's dissector."""
    from scapy.all import TCP, rdpcap, wrpcap
    facts, pcaps = _live_session(tmp_path)
    listen = set(facts["ports"])
    pkts = rdpcap(str(pcaps[0]))
    for p in pkts:
        if TCP in p:
            t = p[TCP]
            if t.sport not in listen:
                t.sport = 48049
            if t.dport not in listen:
                t.dport = 48049
            del t.chksum
    pcap = str(tmp_path / "port-48049.pcap")
    wrpcap(pcap, pkts)
    rivals = _port_rivals(tshark, pcap)
    assert "cbsp" in rivals
    plain = subprocess.run([tshark, "-n", "-r", pcap], capture_output=True, text=True,
                           check=True, timeout=60).stdout
    fixed = subprocess.run([tshark, "-n", "-r", pcap, *rivals], capture_output=True, text=True,
                           check=True, timeout=60).stdout
    assert "MPA Request" not in plain and "MPA Request" in fixed, (plain, fixed)


def test_tshark_decodes_a_live_iwarp_capture(tshark, tmp_path):
    facts, pcaps = _live_session(tmp_path)
    assert len(pcaps) == 2
    pcap = str(pcaps[0])
    fields = ["iwarp_mpa.key.req", "iwarp_mpa.key.rep", "iwarp_mpa.crc_flag",
              "iwarp_mpa.marker_flag", "iwarp_mpa.rej_flag", "iwarp_mpa.rev",
              "iwarp_mpa.privatedata", "iwarp_rdma.opcode", "iwarp_ddp.stag",
              "iwarp_ddp.tagged_offset", "iwarp_rdma.srcstag", "iwarp_rdma.term_layer",
              "iwarp_rdma.term_etype_rdma", "iwarp_rdma.term_errcode_rdma"]
    cmd = [tshark, "-n", "-r", pcap, "-Y", "iwarp_mpa", "-T", "fields", "-E", "separator=|",
           "-E", "occurrence=a", "-E", "aggregator=,"]
    heur = subprocess.run([tshark, "-G", "heuristic-decodes"], capture_output=True, text=True,
                          check=True).stdout
    for line in heur.splitlines():               # SMB Direct, RPC over RDMA: not in our payloads
        if line.startswith("iwarp_ddp_rdmap\t"):
            cmd += ["--disable-protocol", line.split("\t")[1]]
    cmd += _port_rivals(tshark, pcap)
    for f in fields:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    rows = [dict(zip(fields, line.split("|"))) for line in out.splitlines()]
    req = next((r for r in rows if r["iwarp_mpa.key.req"]), None)
    rep = next((r for r in rows if r["iwarp_mpa.key.rep"]), None)
    if req is None or rep is None:               # say what the capture holds
        listing = subprocess.run([tshark, "-n", "-r", pcap], capture_output=True, text=True,
                                 timeout=60).stdout
        raise AssertionError(f"no MPA {'Request' if req is None else 'Reply'} decoded in "
                             f"{pcap}:\n{listing}\nfields:\n{out}")
    for r in (req, rep):
        assert r["iwarp_mpa.crc_flag"] in ("1", "True") and r["iwarp_mpa.rev"] == "1"
        assert r["iwarp_mpa.marker_flag"] in ("0", "False")
        assert r["iwarp_mpa.rej_flag"] in ("0", "False")
    assert bytes.fromhex(req["iwarp_mpa.privatedata"].replace(":", "")) == \
        iw.encode_private(facts["a_qpn"], facts["b_qpn"])
    opcodes = [int(op, 0) for r in rows for op in r["iwarp_rdma.opcode"].split(",") if op]
    assert {0, 1, 2, 3, 7} <= set(opcodes)         # Write, Read Req/Resp, Send, Terminate
    writes = [r for r in rows if r["iwarp_ddp.stag"] and
              int(facts["rkey"]) in [int(x, 0) for x in r["iwarp_ddp.stag"].split(",")]]
    assert writes and any(int(x, 0) == facts["addr"] + 64
                          for x in writes[0]["iwarp_ddp.tagged_offset"].split(","))
    term = next(r for r in rows if r["iwarp_rdma.term_layer"])
    assert (int(term["iwarp_rdma.term_layer"], 0), int(term["iwarp_rdma.term_etype_rdma"], 0),
            int(term["iwarp_rdma.term_errcode_rdma"], 0)) == (
        Layer.RDMAP, RdmapEtype.REMOTE_PROTECTION, RdmapEcode.INVALID_STAG)
    assert any(int(x, 0) == 0xBAD00 for r in rows for x in r["iwarp_rdma.srcstag"].split(",")
               if x)
    verbose = subprocess.run([tshark, "-n", "-r", pcap, "-V"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    good = verbose.count("(Good CRC32)")
    assert good >= 6 and "Bad CRC32" not in verbose and "Malformed" not in verbose


def test_tcp_on_the_simulated_backend_is_a_clear_error():
    import softnic.driver.config as config
    import softnic.driver.nic as nic
    from verbs_api.device import Context
    from verbs_api.pyverbs_error import PyverbsRDMAError
    nic.configure(config.RuntimeConfig(backend="sim", transport="tcp"))
    try:
        with pytest.raises(PyverbsRDMAError) as ex:
            Context(name="softnic0")
        assert ex.value.error_code == errno.EINVAL and "transport=tcp" in str(ex.value)
    finally:
        nic.configure(None)


# ------------------------------------------------------------------ a property

from hypothesis import given, settings, strategies as st  # noqa: E402

_OPS = st.lists(st.tuples(st.sampled_from([W.RDMA_WRITE, W.SEND, W.RDMA_READ]),
                          st.integers(0, 40000), st.integers(0, 8000)), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(ops=_OPS, chunk=st.one_of(st.none(), st.integers(1, 5000)), seed=st.integers(0, 255))
def test_any_workload_in_any_stream_chunking_lands_byte_for_byte(ops, chunk, seed):
    """Whatever the operations and however TCP cuts the stream, every WR succeeds
    and memory ends as a direct copy would leave it."""
    a, b, s = connected(chunk)
    src = bytes((i * 7 + seed) & 0xFF for i in range(48000))
    a.buf.view[:48000] = src
    b.buf.view[:] = bytes(len(b.buf.view))
    expect_b = bytearray(b.buf.view)
    expect_a = bytearray(a.buf.view)
    recv_at = 50000
    for i, (op, n, off) in enumerate(ops):
        n = min(n, 48000 - off)
        if op == W.RDMA_WRITE:
            a.post(i, op, off, n, remote_addr=b.buf.addr + off, rkey=b.mr.rkey)
            expect_b[off:off + n] = src[off:off + n]
        elif op == W.SEND:
            n = min(n, 15000)
            b.recv(i, recv_at, 15000)
            a.post(i, op, off, n)
            expect_b[recv_at:recv_at + n] = src[off:off + n]
        else:
            n = min(n, 8000)                  # READ into a's upper half from b's memory
            a.post(i, op, 56000, n, remote_addr=b.buf.addr + off, rkey=b.mr.rkey)
            expect_a[56000:56000 + n] = expect_b[off:off + n]
        s.run(100000)
    assert [w[:2] for w in a.wcs()] == [(i, WCStatus.SUCCESS) for i in range(len(ops))]
    assert bytes(b.buf.view) == bytes(expect_b) and bytes(a.buf.view) == bytes(expect_a)


def test_transport_bench_reports_both_transports(tmp_path, capsys):
    import importlib.util
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "tools" / "transport_bench.py"
    spec = importlib.util.spec_from_file_location("transport_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    assert bench.main(["--size", "4096", "--count", "20", "--depth", "4", "--pings", "5",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["transport"] for r in rows] == ["udp", "tcp"]
    assert all(r["write_MBps"] > 0 and r["lat8_us_median"] > 0 for r in rows)
    assert rows[1]["write_resent_pkts"] == 0         # TCP: softnic never retransmits
    text = capsys.readouterr().out
    assert "udp (RoCEv2)" in text and "tcp (iWARP)" in text
