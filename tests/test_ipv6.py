"""RoCEv2 over IPv6: a device's address and GID, the engine's traffic over
AF_INET6 sockets on ::1, and a capture that tshark and scapy decode (the ICRC
over the IPv6 pseudo header: tests/test_wire.py checks it against scapy too).

The live tests put two devices on ::1 (the only IPv6 loopback address) with distinct
UDP ports, driven at the engine level, where an address vector carries the peer's
port; without IPv6 on loopback they skip, except under CI.  The simulated fabric
and rdma_cm's routing use fd00:: addresses with no sockets.  C programs over IPv6:
tests/test_ipv6_clients.py."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from softnic.trace.ladder import from_pcap
from softnic.experiments.rig import bring_up, endpoint
from softnic.core.device import Device
from softnic.core.enums import QPType, SendFlags, WCFlags, WCStatus, WROpcode as W
from softnic.core.errors import VerbsError
from softnic.core.qp import AHAttr, RecvWR, SendWR, gid_of
from softnic.driver.config import DeviceSpec, RuntimeConfig, parse_devices
from softnic.driver.faults import FaultModel
from softnic.driver import nic as _nic, rdmacm
from softnic.driver.capture import Capture
from softnic.driver.nic import NIC
from softnic.wire.icrc import append_icrc
from softnic.wire.mad import CmaHeader
from softnic.wire.roce import Opcode, encode


def _need_ipv6_loopback() -> None:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"IPv6 loopback (::1) is needed in CI: {e}")
        pytest.skip(f"no IPv6 loopback here: {e}")


# --------------------------------------------------------------- addresses and GIDs


def test_devices_take_ipv6_addresses_in_brackets_with_a_port():
    specs = parse_devices("softnic0=[::1]:4792,softnic1=[fd00::2],softnic2=fd00::3,"
                          "softnic3=127.0.0.2:4793/udp,softnic4=[FD00:0:0::4]:5000/udp")
    assert [(s.name, s.ip, s.port) for s in specs] == [
        ("softnic0", "::1", 4792), ("softnic1", "fd00::2", 4791), ("softnic2", "fd00::3", 4791),
        ("softnic3", "127.0.0.2", 4793), ("softnic4", "fd00::4", 5000)]
    assert specs[4].transport == "udp"


@pytest.mark.parametrize("text, why", [
    ("softnic0=[::1", "matching"),
    ("softnic0=[::1]4792", "matching"),
    ("softnic0=[::1]:x", "bad port"),
    ("softnic0=[::1]:70000", "bad port"),
    ("softnic0=[fe80::1]", "link-local"),
    ("softnic0=[::ffff:127.0.0.2]", "IPv4-mapped"),
    ("softnic0=[::g]", "not an IPv4 or IPv6 address"),
    ("softnic0=127.0.0.300", "not an IPv4 or IPv6 address"),
])
def test_bad_ipv6_device_items_say_why(text, why):
    with pytest.raises(ValueError, match=why):
        parse_devices(text)


def test_the_gid_of_an_ipv6_device_is_its_address():
    assert gid_of("::1") == "::1"
    assert gid_of("fd00:0::2") == "fd00::2"
    assert gid_of("127.0.0.2") == "::ffff:127.0.0.2"
    assert Device("d", "fd00::2").gid == "fd00::2"
    assert AHAttr("fd00::2", 4792).addr == ("fd00::2", 4792)
    assert AHAttr("0:0:0:0:0:ffff:7f00:2", 4791).addr == ("127.0.0.2", 4791)
    assert AHAttr("127.0.0.2", 4791).addr == ("127.0.0.2", 4791)


@pytest.mark.parametrize("dgid", ["::", "fe80::1", "not-a-gid"])
def test_gids_that_name_no_peer_are_einval(dgid):
    with pytest.raises(VerbsError) as e:
        AHAttr(dgid).addr
    assert e.value.errno == errno.EINVAL


@pytest.mark.parametrize("local, peer", [("::1", "::ffff:127.0.0.2"), ("127.0.0.2", "::1")])
def test_a_device_reaches_only_its_own_ip_version(local, peer):
    dev = Device("d", local)
    assert dev.route(AHAttr(dev.gid, 4791)) == (local, 4791)
    with pytest.raises(VerbsError) as e:
        dev.route(AHAttr(peer, 4791))
    assert e.value.errno == errno.EINVAL
    ep = endpoint(dev)
    other = endpoint(Device("e", local))
    # the QP's address vector is checked at RTR, as a RoCE NIC resolves it there
    other.dev.gid = peer            # a peer of the other IP version
    with pytest.raises(VerbsError) as e:
        bring_up(ep, other)
    assert e.value.errno == errno.EINVAL


def test_iwarp_devices_refuse_ipv6():
    from softnic.driver.nic import TcpNIC
    with pytest.raises(OSError) as e:
        TcpNIC(DeviceSpec("t", "::1", 0, "tcp"), RuntimeConfig())
    assert e.value.errno == errno.EAFNOSUPPORT


# --------------------------------------------------------------- live traffic on ::1


def _nics(cfg: RuntimeConfig) -> list[NIC]:
    _need_ipv6_loopback()
    return [NIC(DeviceSpec(f"v6t{i}", "::1", 0), cfg) for i in range(2)]   # port 0: any free


def _wait(nic: NIC, cq, n: int, timeout: float = 30.0) -> list:
    got = []
    nic.wait_until(lambda: got.extend(nic.dev.poll_cq(cq, 64)) or len(got) >= n, timeout)
    return got


def _pair(a: NIC, b: NIC, size: int = 4 << 20):
    with a.lock, b.lock:
        ea, eb = endpoint(a.dev, buf_size=size), endpoint(b.dev, buf_size=size)
        bring_up(ea, eb, mtu=1024, timeout=10)
        bring_up(eb, ea, mtu=1024, timeout=10)
    return ea, eb


@pytest.mark.parametrize("faults", ["", "loss=0.05,corrupt=0.01"])
def test_write_read_send_atomic_over_ipv6_loopback(faults):
    cfg = RuntimeConfig(faults=FaultModel.parse(faults), seed=5, min_timer=2e-3)
    a, b = _nics(cfg)
    try:
        assert (a.ip, b.ip) == ("::1", "::1") and a.port != b.port
        assert a.gid == "::1" and a.sock.sock.family == socket.AF_INET6
        ea, eb = _pair(a, b)
        data = os.urandom(1 << 20)
        ea.buf.view[:len(data)] = data
        eb.buf.view[2 << 20:(2 << 20) + 65536] = os.urandom(65536)
        b.call(b.dev.post_recv, eb.qp, RecvWR(9, [eb.sge(1 << 20, 70000)]))
        wrs = [SendWR(1, W.RDMA_WRITE, [ea.sge(0, 1 << 20)], SendFlags.SIGNALED,
                      remote_addr=eb.buf.addr, rkey=eb.mr.rkey),
               SendWR(2, W.RDMA_READ, [ea.sge(2 << 20, 65536)], SendFlags.SIGNALED,
                      remote_addr=eb.buf.addr + (2 << 20), rkey=eb.mr.rkey),
               SendWR(3, W.SEND_WITH_IMM, [ea.sge(0, 70000)], SendFlags.SIGNALED, imm_data=77),
               SendWR(4, W.ATOMIC_FETCH_AND_ADD, [ea.sge(3 << 20, 8)], SendFlags.SIGNALED,
                      remote_addr=eb.buf.addr + (3 << 20), rkey=eb.mr.rkey, compare_add=5)]
        for wr in wrs:
            a.call(a.dev.post_send, ea.qp, wr)
        got = _wait(a, ea.send_cq, len(wrs))
        assert [(w.wr_id, w.status) for w in got] == [(w.wr_id, WCStatus.SUCCESS) for w in wrs]
        assert bytes(eb.buf.view[:1 << 20]) == data
        assert bytes(ea.buf.view[2 << 20:(2 << 20) + 65536]) == \
            bytes(eb.buf.view[2 << 20:(2 << 20) + 65536])
        assert int.from_bytes(eb.buf.view[3 << 20:(3 << 20) + 8], "little") == 5
        rwc = _wait(b, eb.recv_cq, 1)
        assert rwc[0].status == WCStatus.SUCCESS
        assert rwc[0].byte_len == 70000 and rwc[0].imm_data == 77
        assert bytes(eb.buf.view[1 << 20:(1 << 20) + 70000]) == data[:70000]
        assert a.counters["rcvd_pkts"] > 0 and b.counters["rcvd_pkts"] > 0
        if faults:
            assert a.counters["fault_dropped_loss"] + b.counters["fault_dropped_loss"] > 0
            # corrupted packets reached the other end and failed the ICRC there
            assert a.counters["fault_corrupted"] + b.counters["fault_corrupted"] > 0
            assert a.counters["rcvd_icrc_err"] + b.counters["rcvd_icrc_err"] > 0
    finally:
        a.close()
        b.close()


def test_ud_over_ipv6_puts_the_ipv6_header_in_the_grh():
    """A UD receive's 40-byte GRH area holds the IPv6 header (as rxe writes it): the
    sender's address, which ibv_init_ah_from_wc and UCX's ud_verbs read."""
    a, b = _nics(RuntimeConfig())
    try:
        with a.lock, b.lock:
            ea, eb = endpoint(a.dev, qp_type=QPType.UD), endpoint(b.dev, qp_type=QPType.UD)
            bring_up(ea, eb)
            bring_up(eb, ea)
        data = os.urandom(300)
        ea.buf.view[:300] = data
        b.call(b.dev.post_recv, eb.qp, RecvWR(5, [eb.sge(0, 2048)]))
        a.call(a.dev.post_send, ea.qp, SendWR(
            1, W.SEND, [ea.sge(0, 300)], SendFlags.SIGNALED, ah=AHAttr(b.gid, b.port),
            remote_qpn=eb.qp.qpn, remote_qkey=0x11111111))
        assert _wait(a, ea.send_cq, 1)[0].status == WCStatus.SUCCESS
        wc = _wait(b, eb.recv_cq, 1)[0]
        assert (wc.status, wc.byte_len, wc.src_qp) == (WCStatus.SUCCESS, 340, ea.qp.qpn)
        assert wc.wc_flags & WCFlags.GRH
        grh = bytes(eb.buf.view[:40])
        assert grh[0] >> 4 == 6 and grh[6] == 17             # IPv6, next header UDP
        assert int.from_bytes(grh[4:6], "big") == 8 + 300    # UDP header and payload
        assert grh[8:24] == grh[24:40] == socket.inet_pton(socket.AF_INET6, "::1")
        assert bytes(eb.buf.view[40:340]) == data
        # an address vector of the other IP version is refused at the post
        with pytest.raises(VerbsError) as e:
            a.call(a.dev.post_send, ea.qp, SendWR(
                2, W.SEND, [ea.sge(0, 8)], SendFlags.SIGNALED, ah=AHAttr("::ffff:127.0.0.2"),
                remote_qpn=eb.qp.qpn, remote_qkey=0x11111111))
        assert e.value.errno == errno.EINVAL
    finally:
        a.close()
        b.close()


def _tshark() -> str:
    path = shutil.which("tshark")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tshark is required in CI")
        pytest.skip("tshark not installed")
    return path


def test_ipv6_capture_decodes_in_tshark_and_its_icrc_checks_in_scapy(tmp_path):
    tshark = _tshark()
    cfg = RuntimeConfig(capture=str(tmp_path / "live6.pcap"))
    a, b = _nics(cfg)
    try:
        ea, eb = _pair(a, b)
        a.call(a.dev.post_send, ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 5000)],
                                              SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                              rkey=eb.mr.rkey))
        assert _wait(a, ea.send_cq, 1)[0].status == WCStatus.SUCCESS
    finally:
        a.close()
        b.close()
    pcap = tmp_path / "live6-v6t0.pcap"
    out = subprocess.run([tshark, "-n", "-r", str(pcap), "-d", f"udp.port=={b.port},infiniband",
                          "-d", f"udp.port=={a.port},infiniband", "-o", "udp.check_checksum:TRUE",
                          "-T", "fields", "-E", "occurrence=f",
                          "-e", "ipv6.src", "-e", "ipv6.dst", "-e", "udp.checksum.status",
                          "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.psn",
                          "-e", "infiniband.invariant.crc"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    rows = [r.split("\t") for r in out if r.strip()]
    assert all(r[0] == "::1" and r[1] == "::1" for r in rows)
    assert all(r[2] in ("1", "Good") for r in rows), rows     # the UDP checksum IPv6 requires
    # 5000 bytes at MTU 1024: WRITE FIRST, 3 MIDDLE, LAST (PSN 0..4), then an ACK for PSN 4
    assert [r[3] for r in rows[:5]] == ["6", "7", "7", "7", "8"]
    assert [int(r[4]) for r in rows[:5]] == [0, 1, 2, 3, 4]
    assert [r[3:5] for r in rows].count(["17", "4"]) >= 1

    # the ICRC tshark shows is the one scapy computes over the IPv6 pseudo header
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import UDP
    from scapy.layers.inet6 import IPv6
    from scapy.utils import rdpcap
    frames = rdpcap(str(pcap))
    assert len(frames) == len(rows)
    for frame, row in zip(frames, rows):
        ip6 = IPv6(bytes(frame))
        udp = ip6[UDP]
        roce = bytes(udp.payload)
        bth = BTH(roce)
        udp.payload = bth           # (the ports are not 4791: BTH bound by hand)
        bth.underlayer = udp        # (where compute_icrc finds the IPv6 header)
        icrc = bth.compute_icrc(None)
        assert icrc == roce[-4:]
        assert int(row[5], 16) == int.from_bytes(icrc, "big")

    # softnic's own reader of captures (the ladder) checks IPv6 ICRCs too
    events = from_pcap(pcap, port=None)
    assert len(events) == len(rows) and all(e.icrc_ok is True for e in events)


# --------------------------------------------------------------- the simulated fabric


def test_a_pyverbs_program_over_ipv6_devices_in_the_simulated_fabric():
    """SOFTNIC_BACKEND=sim carries IPv6 addresses as it does IPv4 ones: the same
    program, GIDs fd00::2 and fd00::3, a lossy fabric."""
    root = Path(__file__).resolve().parent.parent
    prog = (root / "examples" / "rc_write_pingpong.py").read_text() + (
        "\nimport softnic.driver.nic as n\n"
        "print('gids', *(str(Context(name=d).query_gid(1, 0)) for d in ('softnic0', 'softnic1')))"
        "\nprint('dropped', n.sim_world().fabric.counters['dropped_loss'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTNIC_")}
    env.update(SOFTNIC_BACKEND="sim", SOFTNIC_FAULTS="loss=0.03", SOFTNIC_SEED="5",
               SOFTNIC_DEVICES="softnic0=[fd00::2],softnic1=[fd00::3]",
               PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-m", "softnic.cli", "exec", "--", sys.executable, "-c",
                        prog], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "10 x FETCH_AND_ADD(5) on 100: 150" in r.stdout
    assert "RDMA READ: b'hello from b'" in r.stdout
    gids = next(ln for ln in r.stdout.splitlines() if ln.startswith("gids")).split()[1:]
    assert gids == ["fd00:0000:0000:0000:0000:0000:0000:0002",
                    "fd00:0000:0000:0000:0000:0000:0000:0003"]
    dropped = next(ln for ln in r.stdout.splitlines() if ln.startswith("dropped")).split()[1]
    assert int(dropped) > 0


# --------------------------------------------------------------- rdma_cm's addresses


@pytest.fixture
def sim_devices():
    """Devices of both IP versions in the simulated fabric (no sockets)."""
    def use(devices: str):
        _nic.configure(RuntimeConfig(devices=parse_devices(devices), backend="sim"))
        rdmacm.reset()
        return rdmacm
    yield use
    rdmacm.reset()
    _nic.configure(None)


def test_rdma_cm_routes_within_an_ip_version(sim_devices):
    R = sim_devices("softnic0=127.0.0.2,softnic1=[fd00:7::2],softnic2=[fd00:8::2]")
    assert R.route("fd00:7::99").name == "softnic1"        # the longest prefix
    assert R.route("fd00:8:1::5").name == "softnic2"
    assert R.route("fd00:8::2").name == "softnic2"         # its own address
    assert R.route("10.1.2.3").name == "softnic0"          # IPv4 goes to the IPv4 device
    assert R.gid_of("fd00:7::2") == bytes.fromhex("fd000007" + "00" * 10 + "0002")
    assert R.gid_of("127.0.0.2") == bytes(10) + b"\xff\xff\x7f\x00\x00\x02"
    R = sim_devices("softnic0=127.0.0.2")
    with pytest.raises(VerbsError) as e:
        R.route("fd00:7::99")
    assert e.value.errno == errno.EADDRNOTAVAIL


def test_rdma_cm_binds_and_resolves_ipv6(sim_devices):
    R = sim_devices("softnic0=127.0.0.2,softnic1=[fd00:7::2]")
    ch = R.EventChannel()
    cid = R.CmId(ch, ps=R.M.RDMA_PS_TCP, qp_type=R.IBV_QPT_RC)
    cid.resolve_addr(None, "fd00:7::5", 7000)
    assert cid.nic.name == "softnic1" and cid.src[0] == "fd00:7::2"
    assert cid.dgid == R.gid_of("fd00:7::5")
    other = R.CmId(ch, ps=R.M.RDMA_PS_TCP, qp_type=R.IBV_QPT_RC)
    other.bind("::ffff:127.0.0.2", 0)          # an IPv4-mapped address names the IPv4 device
    assert other.nic.name == "softnic0" and other.src[0] == "127.0.0.2"
    with pytest.raises(VerbsError) as e:
        R.CmId(ch, ps=R.M.RDMA_PS_TCP, qp_type=R.IBV_QPT_RC).bind("fd00:7::3", 0)
    assert e.value.errno == errno.EADDRNOTAVAIL
    assert R.getaddrinfo("fd00:7::5", "7000")["dst"] == ("fd00:7::5", 7000)
    assert R.getaddrinfo("::ffff:127.0.0.9", "1")["dst"] == ("127.0.0.9", 1)


def test_the_rdma_cm_header_carries_ipv6_addresses():
    h = CmaHeader("fd00:7::2", "fd00:8::3", 40000)
    raw = h.encode()
    assert raw[1] >> 4 == 6 and raw[4:20] == bytes.fromhex("fd000007" + "00" * 10 + "0002")
    assert CmaHeader.decode(raw) == h


def test_the_ladder_tells_a_corrupted_ipv6_packet(tmp_path):
    src, dst = ("fd00:7::2", 50000), ("fd00:7::3", 4791)
    good = bytes(append_icrc(encode(Opcode.RC_SEND_ONLY, dest_qp=17, psn=5, payload=b"x" * 64),
                             src[0], dst[0], src[1], dst[1]))
    bad = good[:20] + bytes([good[20] ^ 0x10]) + good[21:]
    with Capture(tmp_path / "c.pcap") as cap:
        cap.record(good, src, dst, 1.0)
        cap.record(bad, src, dst, 2.0)
    assert [e.icrc_ok for e in from_pcap(tmp_path / "c.pcap")] == [True, False]
