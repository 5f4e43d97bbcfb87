"""``softnic perf`` (perftest's tests between two processes), the benchmark
harness's smoke run, and the engine's bulk-WRITE receive shortcut.

Nothing here depends on how fast anything runs: the perf runs check the
output's shape and the JSON's fields, the shortcut test checks that it leaves
the same bytes on the wire and in memory as the general path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from softnic.cli import doctor, perf
from softnic.cli import main as cli_main
from softnic.core import dispatch, responder
from softnic.core.device import DeviceConfig
from softnic.wire.roce import Opcode as O, decode

from enginekit import fill, pair, pattern, read, write_wr

ROOT = Path(__file__).resolve().parent.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]]
                                                        if env.get("PYTHONPATH") else []))
    for k in ("SOFTNIC_FAULTS", "SOFTNIC_CAPTURE", "SOFTNIC_BACKEND", "SOFTNIC_TRANSPORT"):
        env.pop(k, None)
    return env


def run_pair(test: str, *args: str) -> tuple[str, str]:
    """Server and client of ``softnic perf TEST ARGS`` as two processes: their stdouts."""
    port = str(_port())
    cmd = [sys.executable, "-m", "softnic.cli", "perf", test, "-p", port, "--no-progress",
           *args]
    server = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        client = subprocess.run(cmd + ["127.0.0.1"], env=_env(), capture_output=True,
                                text=True, timeout=120)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert client.returncode == 0, client.stderr
    assert server.returncode == 0, err
    return client.stdout, out


def test_write_bw_prints_perftest_table():
    client, server = run_pair("write_bw", "-s", "4096", "-n", "40", "-m", "1024", "-q", "2")
    assert "RDMA_Write BW Test" in client and "Waiting for client" in server
    head = next(line for line in client.splitlines() if line.startswith(" #bytes"))
    assert "BW peak[MB/sec]" in head and "BW average[MB/sec]" in head and "MsgRate[Mpps]" in head
    row = client.splitlines()[client.splitlines().index(head) + 1].split()
    assert row[:2] == ["4096", "40"]
    peak, avg, rate = map(float, row[2:5])
    assert peak >= avg > 0 and rate > 0
    assert " Number of qps   : 2" in client and " Mtu             : 1024[B]" in client


@pytest.mark.parametrize("test,extra", [("send_lat", ["-s", "64"]), ("read_lat", ["-s", "16"]),
                                        ("atomic_lat", []), ("write_lat", ["-s", "8"])])
def test_latency_json_fields(test, extra):
    client, server = run_pair(test, "-n", "30", "--json", *extra)
    doc = json.loads(client)
    assert doc["test"] == test and doc["role"] == "client"
    (r,) = doc["results"]
    assert r["bytes"] == (8 if test == "atomic_lat" else int(extra[1]))
    assert r["iterations"] == 30
    for k in ("t_min_us", "t_typical_us", "t_avg_us", "t_99_us", "t_max_us"):
        assert r[k] > 0
    assert r["t_min_us"] <= r["t_typical_us"] <= r["t_max_us"]
    assert r["t_min_us"] <= r["t_99_us"] <= r["t_max_us"]
    assert r["one_way"] == (test in ("send_lat", "write_lat"))
    assert json.loads(server)["role"] == "server"


@pytest.mark.parametrize("test", ["send_bw", "read_bw", "atomic_bw"])
def test_bandwidth_json_and_sweep(test):
    args = ["-a", "--max-bytes", "4096", "-n", "20"] if test == "send_bw" else ["-n", "25"]
    client, server = run_pair(test, "--json", "--report_gbits", *args)
    doc = json.loads(client)
    rows = doc["results"]
    if test == "send_bw":
        assert [r["bytes"] for r in rows] == [1 << i for i in range(1, 24)]
        # --max-bytes caps large sizes (2 iterations at least), small ones keep -n
        assert rows[0]["iterations"] == 20 and rows[-1]["iterations"] == 2
        # the server counted every SEND it received
        assert all(r["server"]["received"] == r["iterations"] for r in rows)
    else:
        assert [r["bytes"] for r in rows] == [8 if test == "atomic_bw" else 65536]
    for r in rows:
        assert r["bytes_per_sec"] > 0 and r["peak_bytes_per_sec"] >= r["bytes_per_sec"]
        assert r["msg_rate"] > 0
    assert doc["counters"]["sent_pkts"] > 0


def test_bad_options_are_clear_errors(capsys):
    with pytest.raises(SystemExit):
        cli_main(["perf", "write_bw", "-s", "0"])
    assert "size 0 outside" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["perf", "write_bw", "-m", "1000"])
    with pytest.raises(SystemExit):
        cli_main(["perf", "nosuch_bw"])
    port = _port()                     # nothing listens there
    rc = cli_main(["perf", "write_bw", "127.0.0.1", "-p", str(port), "--connect-timeout", "0.3"])
    assert rc == 1
    assert "cannot reach the server" in capsys.readouterr().err


def test_plan_follows_perftest_defaults():
    import argparse
    ap = argparse.ArgumentParser()
    perf.add_arguments(ap)
    p = perf.plan(ap.parse_args(["write_lat"]))
    assert p["sizes"] == [2] and p["iters"] == 1000 and p["qps"] == 1
    p = perf.plan(ap.parse_args(["read_bw", "-a", "-q", "3"]))
    assert p["sizes"][0] == 2 and p["sizes"][-1] == 1 << 23 and p["qps"] == 3
    assert p["iters"] == 5000
    p = perf.plan(ap.parse_args(["atomic_bw", "-s", "4096"]))
    assert p["sizes"] == [8]
    # a SEND bandwidth test keeps perftest's 512 receives posted (--rx-depth)
    assert perf.plan(ap.parse_args(["send_bw"]))["rx_depth"] == 512
    assert perf.plan(ap.parse_args(["send_bw", "-r", "64"]))["rx_depth"] == 64
    assert perf.plan(ap.parse_args(["send_lat"]))["rx_depth"] == 4
    assert not perf.plan(ap.parse_args(["write_lat"]))["poll_each"]
    assert perf.plan(ap.parse_args(["write_lat", "--poll-each"]))["poll_each"]


class _ScriptedWriteLat:
    """An endpoint for ``perf.lat_run``'s WRITE loop that logs each call: the peer's
    next WRITE lands at the first poll after a post (the responder's first before
    anything), the post's own completion at the third (its ACK comes behind the
    peer's next WRITE, as softnic's responder holds it)."""

    def __init__(self, initiator: bool):
        import ctypes
        import types
        self.mem = ctypes.create_string_buffer(256)
        self.mr = types.SimpleNamespace(buf=ctypes.addressof(self.mem))
        self.half = 64
        self.e = types.SimpleNamespace(IBV_WC_SUCCESS=0)
        self.qps = [types.SimpleNamespace(post_send=self._post)]
        self.cq = types.SimpleNamespace(poll=self._poll)
        self.log: list = []
        self.posts = self.taken = self.polls_since_post = 0
        self.ahead = 0 if initiator else 1    # the peer's WRITEs before our first
        self.mem[self.half + 1] = self.ahead

    def _post(self, wr):
        self.posts += 1
        self.polls_since_post = 0
        self.log.append(("post", self.taken))   # (completions taken before it)

    def _poll(self, n):
        import types
        self.polls_since_post += 1
        if self.polls_since_post == 1:        # the peer's WRITE lands: its sequence byte
            self.mem[self.half + 1] = (self.posts + self.ahead - 1) % 255 + 1
        if self.polls_since_post >= 3 and self.taken < self.posts:
            self.taken += 1
            return 1, [types.SimpleNamespace(status=0, wr_id=0)]
        return 0, []


@pytest.mark.parametrize("initiator", [True, False])
def test_write_lat_poll_each_takes_each_completion_before_the_next_write(monkeypatch,
                                                                         initiator):
    """``--poll-each`` is perftest's ib_write_lat loop: each side takes its WRITE's
    completion before it writes again; without it a side moves on at the peer's
    WRITE and its completions trail."""
    import types
    monkeypatch.setattr(perf, "_wr", lambda *a: object())
    monkeypatch.setattr(perf, "STALL", 2.0)
    tick = types.SimpleNamespace(tick=lambda i: None)
    for poll_each in (True, False):
        ep = _ScriptedWriteLat(initiator)
        p = {"op": "write", "iters": 20, "max_bytes": None, "poll_each": poll_each}
        perf.lat_run(ep, p, {}, 2, initiator, tick)
        behind = [k - taken for k, (what, taken) in enumerate(ep.log)]
        assert ep.posts == 20 + min(50, 20)
        if poll_each:
            assert behind == [0] * ep.posts and ep.taken == ep.posts
        else:
            assert max(behind) > 0


def test_harness_smoke(tmp_path):
    """The harness end to end with tiny sizes and counts: every figure present."""
    if not __import__("shutil").which("sockperf") and os.environ.get("CI") != "true":
        if not __import__("shutil").which("gcc"):
            pytest.skip("neither sockperf nor gcc here")
    for tool in ("ib_write_lat", "ib_send_lat", "ib_read_lat", "ib_atomic_lat", "ib_write_bw",
                 "ib_send_bw", "ib_read_bw", "ibv_rc_pingpong", "gcc"):
        if not __import__("shutil").which(tool):
            if os.environ.get("CI") == "true":
                pytest.fail(f"needs {tool} (.ci/run installs perftest, ibverbs-utils, gcc)")
            pytest.skip(f"needs {tool} for the C-face rows")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "perf_harness.py"), "--quick",
                          "--out", str(tmp_path)], env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads((tmp_path / "perf.json").read_text())
    keys = [r["key"] for r in res["table"]]
    assert keys == ["write_vs_sockperf", "write_vs_python_blast", "lat_p50_vs_python",
                    "lat_p99_vs_python", "loss_goodput", "qps_1024_vs_1", "rss_per_qp_kib",
                    # the C face against its Python twins (perftest, ibverbs-utils)
                    "c_write_lat_vs_py", "c_write_lat_vs_py_same_loop",
                    "c_pingpong_events_vs_poll",
                    "py_pingpong_events_vs_poll", "c_write_bw_vs_py", "c_write_bw_long_vs_py",
                    # SEND and READ against WRITE on each face
                    "c_send_vs_write_bw", "c_read_vs_write_bw", "py_send_vs_write_bw",
                    "py_read_vs_write_bw",
                    "write_1m_vs_gso", "loss_goodput_1m",
                    # SEND, READ and ATOMIC latency against WRITE's (ATOMIC's: READ's)
                    "c_send_lat_vs_write", "c_read_lat_vs_write", "c_atomic_lat_vs_read",
                    "py_send_lat_vs_write", "py_read_lat_vs_write", "py_atomic_lat_vs_read"]
    for r in res["table"]:
        assert r["softnic"] > 0 and r["reference"] > 0 and r["ratio"] > 0
    assert res["executable"] == sys.executable
    shared = doctor.libpython_shared()
    assert res["python_build"] == ("libpython shared" if shared else "statically linked")
    md = (tmp_path / "perf.md").read_text()
    assert f"({sys.executable}, {res['python_build']})" in md
    assert md.count("\n| ") >= 8 and "WRITE 64 KiB" in md
    assert (tmp_path / "perf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res["write_bw_loss_counters"]["fault_dropped_loss"] > 0


def test_harness_one_row(tmp_path):
    """``--only qps``: the many-QP row and its 1-QP reference alone, every round with
    its counts per WRITE.  With one WRITE in flight on each QP, each WRITE is
    acknowledged on its own (a responder coalesces ACKs within a QP, not across
    QPs); one QP with 16 in flight needs at most one ACK per WRITE."""
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "perf_harness.py"), "--only",
                          "qps", "--quick", "--repeat", "2", "--out", str(tmp_path)],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads((tmp_path / "qps.json").read_text())
    assert len(res["rounds"]) == 2 and res["trees"] == [str(ROOT)]
    spec = importlib.util.spec_from_file_location("perf_harness",
                                                  ROOT / "tools" / "perf_harness.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    for r in res["rounds"]:
        pair = r[str(ROOT)]
        assert pair["write_bw_many"]["qps"] == 32 and pair["write_bw"]["qps"] == 1
        many = harness.per_write(pair, "write_bw_many")
        one = harness.per_write(pair, "write_bw")
        assert many["acks_received"] >= 1.0 and 0 < one["acks_received"] <= 1.0
    assert f"median of 2): {ROOT} " in out.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "perf_harness.py"), "--against",
                          str(ROOT)], env=_env(), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--against needs --only" in bad.stderr


# ------------------------------------------------------------------ the receive shortcut

def _bulk_run(shortcut: bool, monkeypatch, seed: int, faults=None, sr: bool = False,
              placed: list | None = None):
    """Three WRITEs and a bad one through the fabric: with ``shortcut`` the
    common-case branches (``responder.receive_common``) counted; without, the
    general path only (``fast_path=False``)."""
    monkeypatch.undo()
    taken = []
    if shortcut:
        for op in (O.RC_RDMA_WRITE_MIDDLE, O.RC_RDMA_WRITE_LAST):
            def counting(*args, _real=dispatch._COMMON[op]):
                ok = _real(*args)
                taken.append(ok)
                return ok
            monkeypatch.setitem(dispatch._COMMON, op, counting)
        if placed is not None:
            real_hold = responder.hold

            def hold(dev, qp, psn, ackreq, item):
                if type(item) is responder.PlacedWrite:
                    placed.append(psn)
                return real_hold(dev, qp, psn, ackreq, item)
            monkeypatch.setattr(responder, "hold", hold)
    cfg = DeviceConfig(min_timer=1e-3, selective_repeat=sr, fast_path=shortcut)
    p = pair(seed, mtu=256, faults=faults, endpoint_args={"buf_size": 1 << 15}, config=cfg)
    fill(p.ea, 0, pattern(20000, 3))
    # three WRITEs (the middle one lands over the end of the first) and a bad one
    # whose length runs past the target MR: that one must still be refused
    for i, (off, n, roff) in enumerate([(0, 9000, 0), (100, 5000, 8000), (7, 4097, 30000)]):
        p.ea.dev.post_send(p.ea.qp, write_wr(i, p.ea, p.eb, off, n, roff))
    p.run()
    # buffer addresses differ between runs, so RETHs (and ICRCs) do: compare the rest
    wire = []
    for r in p.fabric.trace:
        pkt = decode(r.data[:-4])
        wire.append((r.time, r.kind, r.src, pkt.bth, len(r.data), bytes(pkt.payload),
                     pkt.aeth, pkt.reth and pkt.reth.dma_len))
    return (read(p.eb, 0, 1 << 15), wire, [(w.wr_id, w.status) for w in p.send_wcs()],
            {k: v for k, v in p.b.counters.items() if v}, taken)


@pytest.mark.parametrize("seed", [1, 2])
def test_write_shortcut_matches_general_path(monkeypatch, seed):
    from softnic.driver.faults import FaultModel
    faults = FaultModel.parse("loss=0.05,dup=0.02,reorder=0.02/20us") if seed == 2 else None
    fast = _bulk_run(True, monkeypatch, seed, faults)
    slow = _bulk_run(False, monkeypatch, seed, faults)
    assert fast[0] == slow[0]          # target memory
    assert fast[1] == slow[1]          # every datagram, byte for byte, in order
    assert fast[2] == slow[2]          # completions
    assert fast[3] == slow[3]          # counters
    assert fast[0][:5000] != bytes(5000)
    assert sum(fast[4]) >= 40                     # the shortcut placed most packets
    assert fast[2][-1][1] != fast[2][0][1]        # and the WRITE past the MR end failed


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_write_shortcut_beyond_a_hole_matches_general_path(monkeypatch, seed):
    """Selective repeat: WRITE packets held beyond a hole are placed at once by
    the shortcut; memory, wire, completions and counters are the general path's."""
    from softnic.driver.faults import FaultModel
    faults = FaultModel.parse("loss=0.05,dup=0.03,reorder=0.03/20us")
    placed: list = []
    fast = _bulk_run(True, monkeypatch, seed, faults, sr=True, placed=placed)
    slow = _bulk_run(False, monkeypatch, seed, faults, sr=True)
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    assert fast[3] == slow[3]
    assert fast[0][:5000] != bytes(5000)
    assert placed                                 # some packets landed beyond a hole
    assert fast[2][-1][1] != fast[2][0][1]


def test_middle_packets_encode_as_before():
    """encode_middle gives encode's bytes for every MIDDLE opcode, flag and PSN."""
    from softnic.wire.roce import Opcode as O, encode, encode_middle
    payload = pattern(1024, 5)
    for op in (O.RC_SEND_MIDDLE, O.RC_RDMA_WRITE_MIDDLE):
        for psn in (0, 1, 0xFFFFFF, 0x123456):
            for ackreq in (False, True):
                for qpn in (1, 0xFFFFFF, 0x1000001):
                    assert encode_middle(op, qpn, psn, ackreq, memoryview(payload)) == \
                        encode(op, dest_qp=qpn, psn=psn, ackreq=ackreq, payload=payload)


# ------------------------------------------------------------------ segmentation offload

@pytest.mark.parametrize("offload", [True, False])
def test_send_batch_delivers_each_datagram_as_sent(offload):
    """Runs of equal datagrams leave in one sendmsg (UDP_SEGMENT) and may arrive as one
    buffer (UDP_GRO); the receiver still sees every datagram, whole and in order."""
    import time as _time
    from softnic.transport.udp import UdpSocket
    rx = UdpSocket("127.0.0.1", 0, offload=offload)
    rx2 = UdpSocket("127.0.0.1", 0, offload=offload)
    tx = UdpSocket("127.0.0.1", 0, offload=offload)
    try:
        sizes = [1040] * 20 + [600] + [1040] * 3 + [4124] * 40 + [77, 77, 77, 12]
        sent = [(pattern(n, i), rx.address) for i, n in enumerate(sizes)]
        sent.insert(30, (b"elsewhere", rx2.address))
        tx.send_batch(sent)
        got = []
        deadline = _time.monotonic() + 5
        while len(got) < len(sizes) and _time.monotonic() < deadline:
            got += [d for d, _ in rx.recv_batch()]
        assert got == [d for d, a in sent if a == rx.address]
        assert rx2.recv_batch() == [(b"elsewhere", tx.address)] or \
            _wait_one(rx2) == [(b"elsewhere", tx.address)]
        assert tx.send_errors == 0 and rx.recv_truncated == 0
    finally:
        for s in (rx, rx2, tx):
            s.close()


def _wait_one(sock):
    import time as _time
    deadline = _time.monotonic() + 2
    while _time.monotonic() < deadline:
        got = sock.recv_batch()
        if got:
            return got
    return []
