"""The connection manager (core/cm.py) in the simulated fabric, and its MADs.

Property: N clients connect to one listener through a lossy, duplicating
fabric; every client ends with exactly one outcome (established, or a clean
error), every established pair of QPs really talks (a SEND each way with the
QPNs and PSNs the CM carried), and after disconnect and time-wait no
connection state and no QP is left.  A failure names its seed.
"""

from __future__ import annotations

import random

import pytest

from softnic.core.cm import CM, CMConfig, EventKind, State
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import QPAttrMask as QM, QPState, QPType, WROpcode, SendFlags, WCStatus
from softnic.core.qp import AHAttr, QPAttr, RecvWR, SendWR
from softnic.driver.faults import FaultModel
from softnic.experiments.rig import ALL_ACCESS, endpoint
from softnic.transport.sim import Fabric
from softnic.wire import mad as M
from softnic.wire.roce import Opcode, decode, encode
from softnic.wire.icrc import append_icrc

SID = M.service_id(M.RDMA_PS_TCP, 7174)


def _cm(dev: Device, seed: int, **cfg) -> CM:
    cm = CM(dev.gid, 0x1000 + seed, random.Random(seed),
            config=CMConfig(response_timeout=14, timewait=0.5, **cfg))
    dev.gsi = cm
    return cm


def _rtr_rts(dev, qp, conn, psn):
    """What rdma_cm's faces do with the CM's attributes: INIT, RTR, RTS."""
    dev.modify_qp(qp, QPAttr(qp_state=QPState.INIT, qp_access_flags=ALL_ACCESS),
                  QM.STATE | QM.PKEY_INDEX | QM.PORT | QM.ACCESS_FLAGS)
    peer_ip = conn.peer[0]
    dev.modify_qp(qp, QPAttr(qp_state=QPState.RTR, path_mtu=conn.path_mtu,
                             dest_qp_num=conn.remote_qpn, rq_psn=conn.remote_psn,
                             ah_attr=AHAttr(f"::ffff:{peer_ip}", conn.peer[1]),
                             max_dest_rd_atomic=conn.responder_resources, min_rnr_timer=1),
                  QM.STATE | QM.AV | QM.PATH_MTU | QM.DEST_QPN | QM.RQ_PSN
                  | QM.MAX_DEST_RD_ATOMIC | QM.MIN_RNR_TIMER)
    dev.modify_qp(qp, QPAttr(qp_state=QPState.RTS, sq_psn=psn, timeout=conn.local_ack_timeout,
                             retry_cnt=7, rnr_retry=7, max_rd_atomic=conn.initiator_depth),
                  QM.STATE | QM.SQ_PSN | QM.TIMEOUT | QM.RETRY_CNT | QM.RNR_RETRY
                  | QM.MAX_QP_RD_ATOMIC)


def _world(seed, n, faults):
    fabric = Fabric(seed, default_faults=faults, default_delay=20e-6)
    cfg = DeviceConfig(min_timer=1e-3)
    server = Device("s", "10.0.0.100", config=cfg)
    clients = [Device(f"c{i}", f"10.0.1.{i + 1}", config=cfg) for i in range(n)]
    for d in [server] + clients:
        fabric.attach(d)
    return fabric, server, clients


@pytest.mark.parametrize("seed", range(16))
def test_clients_connect_exchange_and_disconnect_under_loss_and_duplication(seed):
    rng = random.Random(seed)
    n = 4 + seed % 3
    faults = FaultModel.parse("loss=0.05,duplicate=0.05")
    fabric, server, clients = _world(seed, n, faults)
    scm = _cm(server, seed * 1000)
    scm.listen(SID, owner="listener", backlog=0)
    ccms = [_cm(d, seed * 1000 + i + 1) for i, d in enumerate(clients)]
    ep = {}            # Conn -> Endpoint
    outcome = {}       # client index -> list of event kinds
    passive = {}       # server Conn -> list of event kinds
    for i, (d, cm) in enumerate(zip(clients, ccms)):
        e = endpoint(d, buf_size=4096, max_send_wr=8, max_recv_wr=8)
        psn = rng.getrandbits(24)
        c = cm.connect(server.address, service_id=SID, remote_gid=server.gid,
                       local_qpn=e.qp.qpn, psn=psn, responder_resources=4,
                       initiator_depth=4, path_mtu=3, owner=i, now=fabric.now,
                       private_data=M.CmaHeader(d.ip, server.ip, 40000 + i).encode())
        ep[c] = (e, psn)
        outcome[i] = []

    def serve():
        for ev in scm.events[:]:
            scm.events.remove(ev)
            passive.setdefault(ev.conn, []).append(ev.kind)
            if ev.kind is EventKind.CONNECT_REQUEST:
                e = endpoint(server, buf_size=4096, max_send_wr=8, max_recv_wr=8)
                psn = rng.getrandbits(24)
                ep[ev.conn] = (e, psn)
                _rtr_rts(server, e.qp, ev.conn, psn)
                e.dev.post_recv(e.qp, RecvWR(1, [e.sge(0, 64)]))
                scm.accept(ev.conn, local_qpn=e.qp.qpn, psn=psn, responder_resources=4,
                           initiator_depth=4, now=fabric.now)
        for cm in ccms:
            for ev in cm.events[:]:
                cm.events.remove(ev)
                outcome[ev.conn.owner].append(ev.kind)
                if ev.kind is EventKind.CONNECT_RESPONSE:
                    e, psn = ep[ev.conn]
                    _rtr_rts(e.dev, e.qp, ev.conn, psn)
                    e.dev.post_recv(e.qp, RecvWR(1, [e.sge(0, 64)]))
                    cm.establish(ev.conn, now=fabric.now)
        return False

    def settled():
        serve()
        return all(o for o in outcome.values()) and all(
            EventKind.ESTABLISHED in k or EventKind.UNREACHABLE in k for k in passive.values())

    fabric.run(until=fabric.now + 60, stop=settled)
    assert settled(), f"seed {seed}: not settled: {outcome} {passive}"
    for i, kinds in outcome.items():
        assert len(kinds) == 1 and kinds[0] in (EventKind.CONNECT_RESPONSE,
                                                EventKind.UNREACHABLE, EventKind.REJECTED), \
            f"seed {seed}: client {i} saw {kinds}"
    est = [c for cm in ccms for c in cm.conns.values() if c.state is State.ESTABLISHED]
    assert len(est) >= n - 1, f"seed {seed}: only {len(est)} of {n} connected"
    # both ends agree: the passive end of every established connection is established too
    for c in est:
        (pc,) = [p for p in passive if p.remote_id == c.local_id]
        assert passive[pc].count(EventKind.ESTABLISHED) == 1, f"seed {seed}: {passive[pc]}"
    # every established pair talks: a SEND from each client to its server QP and back
    for c in est:
        e, _ = ep[c]
        e.buf.view[:5] = b"hello"
        e.dev.post_send(e.qp, SendWR(wr_id=7, opcode=WROpcode.SEND, sg_list=[e.sge(0, 5)],
                                     send_flags=SendFlags.SIGNALED))
    fabric.flush()
    server_eps = [ep[c][0] for c in passive if c in ep]

    def delivered():
        serve()
        return all(any(w.status == WCStatus.SUCCESS for w in s.recv_cq.entries)
                   for s in server_eps if s.qp.state is QPState.RTS) and all(
            ep[c][0].send_cq.entries for c in est)

    fabric.run(until=fabric.now + 30, stop=delivered)
    assert delivered(), f"seed {seed}: a SEND over an established connection did not arrive"
    got = sum(1 for s in server_eps for w in s.recv_cq.entries if w.status == WCStatus.SUCCESS)
    assert got == len(est), f"seed {seed}: {got} SENDs for {len(est)} connections"
    # disconnect from the clients; everyone hears DISCONNECTED once; time-wait empties the CMs
    for i, cm in enumerate(ccms):
        for c in list(cm.conns.values()):
            if c.state is State.ESTABLISHED:
                cm.disconnect(c, now=fabric.now)
    fabric.flush()

    def drained():
        serve()
        return not scm.conns and not any(cm.conns for cm in ccms)

    fabric.run(until=fabric.now + 60, stop=drained)
    assert drained(), f"seed {seed}: connection state left: {scm.conns} " \
                      f"{[cm.conns for cm in ccms]}"
    for c in est:
        assert outcome[c.owner].count(EventKind.DISCONNECTED) == 1, \
            f"seed {seed}: client {c.owner}: {outcome[c.owner]}"
    for c, kinds in passive.items():
        if EventKind.ESTABLISHED in kinds:
            assert kinds.count(EventKind.ESTABLISHED) == 1, f"seed {seed}: {kinds}"
            assert kinds.count(EventKind.DISCONNECTED) == 1, f"seed {seed}: {kinds}"
    # the consumer destroys its QPs; none is left on any device
    for conn, (e, _) in ep.items():
        e.dev.destroy_qp(e.qp)
    assert not server.qps and not any(d.qps for d in clients), f"seed {seed}: QPs leaked"


def test_req_nobody_listens_for_is_rejected_with_invalid_service_id():
    fabric, server, (client,) = _world(1, 1, FaultModel.none())
    _cm(server, 1)
    cm = _cm(client, 2)
    c = cm.connect(server.address, service_id=SID, remote_gid=server.gid, local_qpn=0x11,
                   psn=1, owner=0, now=0.0)
    fabric.run(until=0.1)
    assert [(e.kind, e.status) for e in cm.events] == [(EventKind.REJECTED,
                                                         M.RejReason.INVALID_SERVICE_ID)]
    assert c.state is State.TIMEWAIT
    fabric.run(until=1.0)                          # time-wait ends: nothing is left
    assert not cm.conns and cm.events[-1].kind is EventKind.TIMEWAIT_EXIT


def test_req_to_no_device_times_out_unreachable_after_max_retries():
    fabric, server, (client,) = _world(1, 1, FaultModel.none())
    cm = _cm(client, 2, max_cm_retries=3)
    cm.connect(("10.9.9.9", 4791), service_id=SID, remote_gid="10.9.9.9", local_qpn=0x11,
               psn=1, owner=0, now=0.0)
    fabric.run(until=10.0)
    assert [e.kind for e in cm.events] == [EventKind.UNREACHABLE]
    assert cm.counters["cm_retransmits"] == 3
    assert not cm.conns


def test_duplicate_req_before_accept_gets_mra_and_after_accept_the_same_rep():
    fabric, server, (client,) = _world(1, 1, FaultModel.none())
    scm = _cm(server, 1)
    scm.listen(SID)
    cm = _cm(client, 2)
    c = cm.connect(server.address, service_id=SID, remote_gid=server.gid, local_qpn=0x11,
                   psn=1, owner=0, now=0.0)
    req = c.last
    fabric.run(until=0.01)
    (ev,) = scm.events
    # the REQ again, as a retransmission would: the server answers MRA
    server.receive_datagram(_wrap(req, client, server), client.address, fabric.now)
    out = [decode(d[:-4]) for d, _ in server.datagrams_to_send(fabric.now)]
    assert [M.decode_cm(bytes(p.payload))[0].attr_id for p in out] == [M.Attr.MRA]
    scm.accept(ev.conn, local_qpn=0x12, psn=2, now=fabric.now)
    rep = [bytes(decode(d[:-4]).payload) for d, _ in server.datagrams_to_send(fabric.now)]
    server.receive_datagram(_wrap(req, client, server), client.address, fabric.now)
    again = [bytes(decode(d[:-4]).payload) for d, _ in server.datagrams_to_send(fabric.now)]
    assert again == rep and M.decode_cm(rep[0])[0].attr_id == M.Attr.REP
    assert len(scm.events) == 1                     # no second CONNECT_REQUEST


def test_bad_mads_are_counted_and_dropped():
    fabric, server, (client,) = _world(1, 1, FaultModel.none())
    scm = _cm(server, 1)
    bad = bytearray(M.encode_cm(M.Rtu(1, 2), 5))
    bad[1] = 0x04                                    # not the CM class
    server.receive_datagram(_wrap(bytes(bad), client, server), client.address, 0.0)
    server.receive_datagram(_wrap(b"\0" * 100, client, server), client.address, 0.0)
    pkt = encode(Opcode.UD_SEND_ONLY, dest_qp=1, psn=0, payload=M.encode_cm(M.Rtu(1, 2), 5),
                 deth=(0x1234, 1))                   # wrong Q_Key
    server.receive_datagram(append_icrc(pkt, client.ip, server.ip, client.port, server.port),
                            client.address, 0.0)
    assert scm.counters["cm_bad"] == 2 and server.counters["rcvd_bad_mad"] == 1
    assert not scm.conns and not scm.events


def _wrap(mad: bytes, src: Device, dst: Device) -> bytes:
    pkt = encode(Opcode.UD_SEND_ONLY, dest_qp=1, psn=0, payload=mad, deth=(M.GSI_QKEY, 1))
    return append_icrc(pkt, src.ip, dst.ip, src.port, dst.port)


def test_mad_codecs_round_trip():
    req = M.Req(local_comm_id=0xA1B2C3D4, service_id=SID, local_ca_guid=0x0102030405060708,
                local_qpn=0x123456, starting_psn=0xABCDEF,
                primary_local_port_gid=M.gid_bytes("10.0.0.1"),
                primary_remote_port_gid=M.gid_bytes("10.0.0.2"), responder_resources=3,
                initiator_depth=5, retry_count=6, rnr_retry_count=7, path_mtu=3,
                private_data=b"x" * 92)
    h, back = M.decode_cm(M.encode_cm(req, 99))
    assert h.tid == 99 and h.attr_id == M.Attr.REQ and back == req
    for msg in (M.Rep(1, 2, 0x11, 0x22, 0x33, responder_resources=4, private_data=b"r" * 196),
                M.Rej(1, 2, M.RejReason.CONSUMER_DEFINED, ari=b"\0" * 72,
                      private_data=b"j" * 148),
                M.Rtu(1, 2, b"u" * 224), M.Dreq(1, 2, 0x33, b"d" * 220),
                M.Drep(1, 2, b"p" * 224), M.Mra(1, 2, 1, 20, b"m" * 222),
                M.SidrReq(9, SID, private_data=b"s" * 216),
                M.SidrRep(9, 0, 0x44, SID, 0x01234567, additional_info=b"\0" * 72,
                          private_data=b"q" * 136)):
        assert M.decode_cm(M.encode_cm(msg, 1))[1] == msg
    with pytest.raises(M.MadError):
        M.encode_cm(M.Rtu(1, 2, b"u" * 225), 1)
    hdr = M.CmaHeader("10.1.2.3", "10.4.5.6", 5555)
    assert M.CmaHeader.decode(hdr.encode()) == hdr and len(hdr.encode()) == 36
    assert M.service_port(SID) == (M.RDMA_PS_TCP, 7174)


def test_listen_backlog_rejects_requests_beyond_it_until_one_is_accepted():
    fabric, server, clients = _world(1, 3, FaultModel.none())
    scm = _cm(server, 1)
    scm.listen(SID, backlog=1)
    cms = [_cm(d, 10 + i) for i, d in enumerate(clients)]
    cms[0].connect(server.address, service_id=SID, remote_gid=server.gid, local_qpn=0x11,
                   psn=1, owner=0, now=0.0)
    fabric.run(until=0.01)
    cms[1].connect(server.address, service_id=SID, remote_gid=server.gid, local_qpn=0x12,
                   psn=1, owner=1, now=fabric.now)
    fabric.run(until=0.02)
    assert [(e.kind, e.status) for e in cms[1].events] == [(EventKind.REJECTED,
                                                             M.RejReason.NO_RESOURCES)]
    (req,) = scm.events
    scm.accept(req.conn, local_qpn=0x20, psn=2, now=fabric.now)   # the backlog frees up
    fabric.flush()
    cms[2].connect(server.address, service_id=SID, remote_gid=server.gid, local_qpn=0x13,
                   psn=1, owner=2, now=fabric.now)
    fabric.run(until=0.03)
    assert [e.kind for e in scm.events] == [EventKind.CONNECT_REQUEST] * 2
    assert [e.kind for e in cms[0].events] == [EventKind.CONNECT_RESPONSE]
