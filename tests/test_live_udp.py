"""The engine over real UDP sockets on loopback: one process, two processes, faults, capture.

These drive live NICs (``softnic.driver.nic.NIC``) at the engine level; the pyverbs
API over the same NICs has its own tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from softnic.driver.config import DeviceSpec, RuntimeConfig
from softnic.core.enums import QPState, SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import RecvWR, SendWR
from softnic.driver.faults import FaultModel
from softnic.driver.nic import NIC, _loopback_candidates
from softnic.experiments.rig import bring_up, endpoint

ROOT = Path(__file__).resolve().parent.parent


def _nics(cfg: RuntimeConfig, n: int = 2) -> list[NIC]:
    return [NIC(DeviceSpec(f"t{i}", None, 0), cfg) for i in range(n)]   # port 0: any free port


def _pair(a: NIC, b: NIC, mtu: int = 1024, size: int = 4 << 20, retry_cnt: int = 7):
    with a.lock, b.lock:
        ea, eb = endpoint(a.dev, buf_size=size), endpoint(b.dev, buf_size=size)
        bring_up(ea, eb, mtu=mtu, timeout=10, retry_cnt=retry_cnt)
        bring_up(eb, ea, mtu=mtu, timeout=10, retry_cnt=retry_cnt)
    return ea, eb


def _wait(nic: NIC, cq, n: int, timeout: float = 30.0) -> list:
    got = []
    nic.wait_until(lambda: got.extend(nic.dev.poll_cq(cq, 64)) or len(got) >= n, timeout)
    return got


@pytest.mark.parametrize("faults", ["", "loss=0.05", "reorder=0.05/300us,dup=0.02",
                                    "loss=0.05,corrupt=0.01"])
def test_rc_operations_over_loopback_sockets(faults):
    cfg = RuntimeConfig(faults=FaultModel.parse(faults), seed=3, min_timer=2e-3)
    a, b = _nics(cfg)
    try:
        ea, eb = _pair(a, b)
        data = os.urandom(1 << 20)
        ea.buf.view[:len(data)] = data
        eb.buf.view[2 << 20:(2 << 20) + 65536] = os.urandom(65536)
        eb.buf.view[3 << 20:(3 << 20) + 8] = (10).to_bytes(8, sys.byteorder)
        b.call(b.dev.post_recv, eb.qp, RecvWR(9, [eb.sge(1 << 20, 70000)]))
        wrs = [SendWR(1, W.RDMA_WRITE, [ea.sge(0, 1 << 20)], SendFlags.SIGNALED,
                      remote_addr=eb.buf.addr, rkey=eb.mr.rkey),
               SendWR(2, W.RDMA_READ, [ea.sge(2 << 20, 65536)], SendFlags.SIGNALED,
                      remote_addr=eb.buf.addr + (2 << 20), rkey=eb.mr.rkey),
               SendWR(3, W.SEND_WITH_IMM, [ea.sge(0, 70000)], SendFlags.SIGNALED, imm_data=77)]
        wrs += [SendWR(10 + i, W.ATOMIC_FETCH_AND_ADD, [ea.sge((3 << 20) + 8 * i, 8)],
                       SendFlags.SIGNALED, remote_addr=eb.buf.addr + (3 << 20), rkey=eb.mr.rkey,
                       compare_add=i + 1) for i in range(20)]
        for wr in wrs:
            a.call(a.dev.post_send, ea.qp, wr)
        got = _wait(a, ea.send_cq, len(wrs))
        assert [(w.wr_id, w.status) for w in got] == [(w.wr_id, WCStatus.SUCCESS) for w in wrs]
        # the target made progress with no call of its own: only its thread ran
        assert bytes(eb.buf.view[:1 << 20]) == data
        assert bytes(ea.buf.view[2 << 20:(2 << 20) + 65536]) == \
            bytes(eb.buf.view[2 << 20:(2 << 20) + 65536])
        assert int.from_bytes(eb.buf.view[3 << 20:(3 << 20) + 8], sys.byteorder) == 10 + 210
        rwc = _wait(b, eb.recv_cq, 1)
        assert rwc[0].byte_len == 70000 and rwc[0].imm_data == 77
        assert bytes(eb.buf.view[1 << 20:(1 << 20) + 70000]) == data[:70000]
        if "loss" in faults:
            assert a.counters["fault_dropped_loss"] > 0
        if faults in ("", "loss=0.05"):
            # a model that only drops leaves the WRITE's runs gathered from memory
            # (what survives of each), as none does
            assert a.counters["udp_gather_pkts"] > 100
        else:
            assert a.counters["udp_gather_pkts"] == 0   # the model needs each datagram's bytes
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("fast", [True, False], ids=["kernel-io", "engine-io"])
def test_long_writes_stream_from_memory_to_memory(fast, monkeypatch):
    """Long WRITEs back to back, at two MTUs, odd lengths and offsets: the sender's
    MIDDLEs go out gathered from its memory (``sn_send_gather``), the receiver's
    progress thread takes them run after run (``sn_rx_stream``), and every byte
    lands where it should, nothing around it touched; the same with both off."""
    import softnic.driver.nic as nicmod
    from softnic import accel
    if accel.load() is None:
        pytest.fail(f"no kernel: {accel.error}")
    monkeypatch.setattr(nicmod, "GATHER", fast)
    monkeypatch.setattr(nicmod, "RX_STREAM", fast)
    a, b = _nics(RuntimeConfig(min_timer=2e-3))
    try:
        for mtu in (4096, 1024):
            ea, eb = _pair(a, b, mtu=mtu, size=12 << 20)
            data = os.urandom(12 << 20)
            ea.buf.view[:] = data
            eb.buf.view[:] = b"\xee" * (12 << 20)
            spans = [(0, 0, 3 << 20), (5, 3 << 20, (2 << 20) + 4093), (12, 6 << 20, 333333),
                     (1, 7 << 20, (4 << 20) + 7)]
            wrs = [SendWR(i, W.RDMA_WRITE, [ea.sge(src, n)], SendFlags.SIGNALED,
                          remote_addr=eb.buf.addr + dst, rkey=eb.mr.rkey)
                   for i, (src, dst, n) in enumerate(spans)]
            for wr in wrs:
                a.call(a.dev.post_send, ea.qp, wr)
            got = _wait(a, ea.send_cq, len(wrs))
            assert [(w.wr_id, w.status) for w in got] == [(i, WCStatus.SUCCESS)
                                                          for i in range(len(wrs))]
            want = bytearray(b"\xee" * (12 << 20))
            for src, dst, n in spans:
                want[dst:dst + n] = data[src:src + n]
            assert bytes(eb.buf.view) == bytes(want), f"MTU {mtu}"
        if fast:
            assert a.counters["udp_gather_pkts"] > 1000
            assert b.counters["rx_stream_pkts"] > 1000
        else:
            assert a.counters["udp_gather_pkts"] == 0 == b.counters["rx_stream_pkts"]
        assert b.counters.get("rcvd_icrc_err", 0) == 0 == a.counters["udp_send_errors"]
    finally:
        a.close()
        b.close()


def test_one_device_loops_back_to_itself():
    (a,) = _nics(RuntimeConfig(), 1)
    try:
        ea, eb = _pair(a, a)
        ea.buf.view[:5000] = b"x" * 5000
        a.call(a.dev.post_send, ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 5000)],
                                              SendFlags.SIGNALED, remote_addr=eb.buf.addr + 100,
                                              rkey=eb.mr.rkey))
        assert _wait(a, ea.send_cq, 1)[0].status == WCStatus.SUCCESS
        assert bytes(eb.buf.view[100:5100]) == b"x" * 5000
    finally:
        a.close()


def test_busy_polling_sees_progress_without_waiting():
    """A caller that spins on poll() (never blocking) still completes: poll drives progress."""
    a, b = _nics(RuntimeConfig())
    try:
        ea, eb = _pair(a, b)
        a.call(a.dev.post_send, ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 100000)],
                                              SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                              rkey=eb.mr.rkey))
        got = []
        for _ in range(2_000_000):
            a.poll()
            b.poll()
            with a.lock:
                got += a.dev.poll_cq(ea.send_cq, 1)
            if got:
                break
        assert got and got[0].status == WCStatus.SUCCESS
    finally:
        a.close()
        b.close()


def test_close_does_not_hang_with_work_in_flight():
    a, b = _nics(RuntimeConfig())
    ea, eb = _pair(a, b)
    for i in range(50):
        a.call(a.dev.post_send, ea.qp, SendWR(i, W.RDMA_WRITE, [ea.sge(0, 65536)], 0,
                                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    b.close()
    a.close()
    a.close()                                  # idempotent
    assert a.wait_until(lambda: False, timeout=0.1) is False


def test_retry_exhausted_when_the_peer_is_gone():
    a, b = _nics(RuntimeConfig(min_timer=1e-3))
    ea, eb = _pair(a, b, retry_cnt=2)
    b.close()
    try:
        a.call(a.dev.post_send, ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 10)],
                                              SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                              rkey=eb.mr.rkey))
        got = _wait(a, ea.send_cq, 1, timeout=20)
        assert got[0].status == WCStatus.RETRY_EXC_ERR
        assert ea.qp.state == QPState.ERR
    finally:
        a.close()


TARGET = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from softnic.driver.config import DeviceSpec, RuntimeConfig
    from softnic.driver.nic import NIC
    from softnic.core.qp import QPAttr
    from softnic.experiments.rig import endpoint, bring_up
    nic = NIC(DeviceSpec("target", None, 0), RuntimeConfig())
    with nic.lock:
        ep = endpoint(nic.dev, buf_size=1 << 20)
    print(json.dumps(dict(gid=nic.gid, port=nic.port, qpn=ep.qp.qpn, addr=ep.buf.addr,
                          rkey=ep.mr.rkey)), flush=True)
    peer = json.loads(sys.stdin.readline())
    class Peer: pass
    p = Peer(); p.dev = Peer(); p.dev.gid = peer["gid"]; p.dev.port = peer["port"]
    p.qp = Peer(); p.qp.qpn = peer["qpn"]
    with nic.lock:
        bring_up(ep, p, mtu=1024)
    sys.stdin.readline()             # the initiator says it is done; no verbs call till then
    print(json.dumps(dict(data=bytes(ep.buf.view[:200000]).hex())), flush=True)
    nic.close()
""")


def test_two_processes_one_sided_write():
    """The target process makes no verbs call while the WRITE lands."""
    child = subprocess.Popen([sys.executable, "-c", TARGET.format(root=str(ROOT))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    (a,) = _nics(RuntimeConfig(), 1)
    try:
        t = json.loads(child.stdout.readline())
        with a.lock:
            ea = endpoint(a.dev, buf_size=1 << 20)

            class Peer:
                pass
            p = Peer()
            p.dev, p.qp = Peer(), Peer()
            p.dev.gid, p.dev.port, p.qp.qpn = t["gid"], t["port"], t["qpn"]
            bring_up(ea, p, mtu=1024)
        child.stdin.write(json.dumps(dict(gid=a.gid, port=a.port, qpn=ea.qp.qpn)) + "\n")
        child.stdin.flush()
        data = os.urandom(200000)
        ea.buf.view[:200000] = data
        import time
        time.sleep(0.2)                          # let the child reach RTR
        a.call(a.dev.post_send, ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 200000)],
                                              SendFlags.SIGNALED, remote_addr=t["addr"],
                                              rkey=t["rkey"]))
        assert _wait(a, ea.send_cq, 1)[0].status == WCStatus.SUCCESS
        child.stdin.write("done\n")
        child.stdin.flush()
        assert bytes.fromhex(json.loads(child.stdout.readline())["data"]) == data
    finally:
        a.close()
        child.kill()
        child.wait()


def test_live_capture_decodes_in_tshark(tmp_path):
    if shutil.which("tshark") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tshark is required in CI")
        pytest.skip("tshark not installed")
    cfg = RuntimeConfig(capture=str(tmp_path / "live.pcap"))
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
    pcap = tmp_path / "live-t0.pcap"
    out = subprocess.run(["tshark", "-r", str(pcap), "-d", f"udp.port=={b.port},infiniband",
                          "-d", f"udp.port=={a.port},infiniband", "-T", "fields",
                          "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.psn"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    rows = [r.split("\t") for r in out if r.strip()]
    # 5000 bytes at MTU 1024: WRITE FIRST, 3 MIDDLE, LAST (PSN 0..4), then an ACK for PSN 4
    assert [r[0] for r in rows[:5]] == ["6", "7", "7", "7", "8"]
    assert [int(r[1]) for r in rows[:5]] == [0, 1, 2, 3, 4]
    assert ["17", "4"] in rows
