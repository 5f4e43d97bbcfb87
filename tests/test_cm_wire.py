"""The CM's MADs as another decoder reads them: every message the CM sends
(REQ, MRA, REP, RTU, REJ, DREQ, DREP, SIDR_REQ, SIDR_REP), captured from the
simulated fabric, goes through tshark, which must call each one InfiniBand CM,
read the fields we wrote, and find nothing malformed."""

from __future__ import annotations

import os
import random
import shutil
import subprocess

import pytest

from softnic.driver.capture import Capture
from softnic.core.cm import CM, CMConfig, EventKind
from softnic.core.device import Device, DeviceConfig
from softnic.driver.faults import FaultModel
from softnic.transport.sim import Fabric
from softnic.wire import mad as M

SID = M.service_id(M.RDMA_PS_TCP, 7174)
UDP_SID = M.service_id(M.RDMA_PS_UDP, 7175)


@pytest.fixture(scope="module")
def tshark() -> str:
    path = shutil.which("tshark")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tshark is not installed, and CI must run the tshark cross-check")
        pytest.skip("tshark is not installed")
    return path


def _exchange(pcap) -> tuple[Device, Device]:
    cap = Capture(str(pcap))
    fabric = Fabric(3, default_faults=FaultModel.none(), default_delay=20e-6, capture=cap)
    cfg = DeviceConfig(min_timer=1e-3)
    a = Device("a", "192.0.2.1", config=cfg)
    b = Device("b", "192.0.2.2", config=cfg)
    fabric.attach(a)
    fabric.attach(b)
    ca = a.gsi = CM(a.gid, 0xA, random.Random(1), config=CMConfig(response_timeout=12))
    cb = b.gsi = CM(b.gid, 0xB, random.Random(2), config=CMConfig(response_timeout=12))
    cb.listen(SID)
    cb.listen(UDP_SID)
    hdr = M.CmaHeader(a.ip, b.ip, 40001).encode()
    # 1: REQ, a duplicate REQ (MRA), REP, RTU, DREQ, DREP
    c = ca.connect(b.address, service_id=SID, remote_gid=b.gid, local_qpn=0x4242, psn=0x1234,
                   responder_resources=2, initiator_depth=3, path_mtu=3, owner=1,
                   private_data=hdr + b"hello", now=0.0)
    fabric.run(until=0.001)
    (req,) = cb.events
    ca._send_raw(c.last, c.peer)          # the REQ again, as if retransmitted: an MRA answers
    fabric.flush()
    fabric.run(until=fabric.now + 0.001)
    cb.accept(req.conn, local_qpn=0x4343, psn=0x5678, responder_resources=3,
              initiator_depth=2, private_data=b"rep", now=fabric.now)
    fabric.flush()
    fabric.run(until=fabric.now + 0.001)
    ca.establish(c, now=fabric.now)
    fabric.flush()
    fabric.run(until=fabric.now + 0.001)
    ca.disconnect(c, now=fabric.now)
    fabric.flush()
    fabric.run(until=fabric.now + 0.001)
    # 2: a REQ rejected by the consumer (REJ with private data)
    c2 = ca.connect(b.address, service_id=SID, remote_gid=b.gid, local_qpn=0x4444, psn=1,
                    owner=2, private_data=hdr, now=fabric.now)
    fabric.run(until=fabric.now + 0.001)
    ev = [e for e in cb.events if e.kind is EventKind.CONNECT_REQUEST][-1]
    cb.reject(ev.conn, private_data=b"no", now=fabric.now)
    fabric.flush()
    fabric.run(until=fabric.now + 0.001)
    # 3: SIDR
    s = ca.sidr_request(b.address, service_id=UDP_SID, private_data=hdr, owner=3,
                        now=fabric.now)
    fabric.run(until=fabric.now + 0.001)
    ev = [e for e in cb.events if e.kind is EventKind.CONNECT_REQUEST][-1]
    cb.sidr_reply(ev.conn, status=0, qpn=0x4545, qkey=0x01234567, now=fabric.now)
    fabric.flush()
    fabric.run(until=fabric.now + 0.001)
    cap.close()
    kinds = [e.kind for e in ca.events]
    assert kinds == [EventKind.CONNECT_RESPONSE, EventKind.DISCONNECTED, EventKind.REJECTED,
                     EventKind.SIDR_REPLY], kinds
    assert c2 is not None and s is not None
    return a, b


FIELDS = ["ip.src", "infiniband.bth.destqp", "infiniband.deth.q_key", "infiniband.mad.mgmtclass",
          "infiniband.mad.attributeid", "infiniband.cm.req.localqpn",
          "infiniband.cm.req.startpsn", "infiniband.cm.req.serviceid.dport",
          "infiniband.cm.req.prim_localgid_ipv4", "infiniband.cm.req.prim_remotegid_ipv4",
          "infiniband.cm.req.ip_cm.sip4", "infiniband.cm.req.ip_cm.dip4",
          "infiniband.cm.req.ip_cm.sport", "infiniband.cm.rep.localqpn",
          "infiniband.cm.rep.startpsn", "infiniband.cm.rej.reason"]


def test_tshark_decodes_every_cm_message(tshark, tmp_path):
    pcap = tmp_path / "cm.pcap"
    a, b = _exchange(pcap)
    cmd = [tshark, "-r", str(pcap), "-T", "fields", "-E", "separator=|"]
    for f in FIELDS:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [dict(zip(FIELDS, line.split("|"))) for line in out.splitlines()]
    attrs = [int(r["infiniband.mad.attributeid"], 0) for r in rows]
    assert attrs == [M.Attr.REQ, M.Attr.REQ, M.Attr.MRA, M.Attr.REP, M.Attr.RTU, M.Attr.DREQ,
                     M.Attr.DREP, M.Attr.REQ, M.Attr.REJ, M.Attr.SIDR_REQ, M.Attr.SIDR_REP]
    for r in rows:
        assert int(r["infiniband.bth.destqp"], 0) == 1
        assert int(r["infiniband.deth.q_key"], 0) == M.GSI_QKEY
        assert int(r["infiniband.mad.mgmtclass"], 0) == M.MGMT_CLASS_CM
    req, rep, rej = rows[0], rows[3], rows[8]
    assert int(req["infiniband.cm.req.localqpn"], 0) == 0x4242
    assert int(req["infiniband.cm.req.startpsn"], 0) == 0x1234
    assert int(req["infiniband.cm.req.serviceid.dport"], 0) == 7174
    assert (req["infiniband.cm.req.prim_localgid_ipv4"],
            req["infiniband.cm.req.prim_remotegid_ipv4"]) == (a.ip, b.ip)
    assert (req["infiniband.cm.req.ip_cm.sip4"], req["infiniband.cm.req.ip_cm.dip4"]) == (a.ip, b.ip)
    assert int(req["infiniband.cm.req.ip_cm.sport"], 0) == 40001
    assert int(rep["infiniband.cm.rep.localqpn"], 0) == 0x4343
    assert int(rep["infiniband.cm.rep.startpsn"], 0) == 0x5678
    assert int(rej["infiniband.cm.rej.reason"], 0) == M.RejReason.CONSUMER_DEFINED
    info = subprocess.run([tshark, "-r", str(pcap)], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    for name in ("ConnectRequest", "ConnectReply", "ReadyToUse", "DisconnectRequest",
                 "DisconnectReply", "ConnectReject", "MsgRcptAck"):
        assert f"CM: {name}" in info, (name, info)
    bad = subprocess.run([tshark, "-r", str(pcap), "-Y", "_ws.malformed || _ws.expert"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert bad.strip() == ""
