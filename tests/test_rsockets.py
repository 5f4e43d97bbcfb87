"""rsockets on softnic's librdmacm.so.1: unmodified rdmacm-utils programs.

``rstream``, ``riostream`` and ``rcopy`` (Debian's rdmacm-utils) run as a server and a
client process under ``softnic exec``, each with a device of its own on a loopback
address, with and without a lossy wire; their own data checks (``-T v``) and exit
codes, and rcopy's file compared byte for byte.  ``tests/rdmacm/rsocket_api.py``
drives the calls themselves (rpoll and rselect with a pipe among the rsockets,
non-blocking connect, end of stream, errors).  Skipped where a tool is missing,
failed under CI=true (.ci/run installs them).  Every subprocess has a timeout.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import time
from pathlib import Path

import pytest

from test_rdmacm_clients import (REFUSED, TIMEOUT, _addresses, _cmd, _free_tcp_port,
                                 _missing, _wait_bound, check, need, pair)

HERE = Path(__file__).resolve().parent


# softnic's libraries, built once (the face check is softnic.faces.availability's)
from test_rdmacm_clients import libs  # noqa: E402,F401  (an autouse fixture)


def _perf_rows(out: str) -> list[list[str]]:
    """rstream's and riostream's result rows (after the header), split in fields."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("name "))
    return [ln.split() for ln in lines[start + 1:] if ln.strip()]


def _stream(tool: str, args: list[str], faults=None, timeout=TIMEOUT):
    need(tool)
    return check(pair([tool, "-b", "{S}", "-p", "{PORT}", *args],
                      [tool, "-s", "{S}", "-p", "{PORT}", *args],
                      faults=faults, timeout=timeout))


# rstream: -T v checks every byte received (common.c's verify_buf); b blocking calls,
# n (the default) non-blocking ones, a rpoll before each call
@pytest.mark.compat("rdmacm-utils")
@pytest.mark.parametrize("mode", ["b", "n", "a"])
def test_rstream(mode):
    for size, count in (("100", "2000"), ("100000", "100"), ("3000000", "10")):
        sout, cout = _stream("rstream", ["-S", size, "-C", count, "-T", mode, "-T", "v"])
        for out in (sout, cout):
            rows = _perf_rows(out)
            assert len(rows) == 1 and rows[0][0] == "custom", out
            assert rows[0][2] == ("2k" if count == "2000" else count), out


@pytest.mark.compat("rdmacm-utils")
@pytest.mark.parametrize("faults", ["loss=0.02"])
def test_rstream_loss(faults):
    sout, cout = _stream("rstream", ["-S", "100000", "-C", "200", "-T", "v"], faults=faults)
    assert len(_perf_rows(cout)) == 1 and len(_perf_rows(sout)) == 1


@pytest.mark.compat("rdmacm-utils")
def test_rstream_default_set():
    """rstream's own test set: latency then bandwidth, 64 B to 1 MiB (4 sizes each)."""
    sout, cout = _stream("rstream", ["-T", "v"], timeout=900)
    for out in (sout, cout):
        names = [r[0] for r in _perf_rows(out)]
        assert names == ["64_lat", "4k_lat", "64k_lat", "1m_lat",
                         "64_bw", "4k_bw", "64k_bw", "1m_bw"], out


@pytest.mark.compat("rdmacm-utils")
@pytest.mark.parametrize("faults", [None, "loss=0.02"])
def test_riostream(faults):
    """riomap/riowrite: the client RDMA-writes into the region the server mapped and
    the server watches the region's last byte; -T v checks the bytes."""
    sout, cout = _stream("riostream", ["-S", "100000", "-C", "50", "-T", "v"], faults=faults)
    for out in (sout, cout):
        rows = _perf_rows(out)
        assert len(rows) == 1 and rows[0][2] == "50", out


@pytest.mark.compat("rdmacm-utils")
@pytest.mark.parametrize("faults", [None, "loss=0.02"])
def test_rcopy(tmp_path, faults):
    """rcopy's server serves for ever: the client's copy is compared, then it is stopped."""
    need("rcopy")
    src = tmp_path / "src.bin"
    dst = tmp_path / "dst.bin"
    src.write_bytes(os.urandom(5 * 1024 * 1024 + 123))
    sip, cip = _addresses()
    port = str(_free_tcp_port())
    scmd, senv = _cmd(sip, ["rcopy", "-p", port], faults)
    log = tmp_path / "server.out"
    srv = subprocess.Popen(scmd, env=senv, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + TIMEOUT
        _wait_bound(sip, deadline, srv)
        time.sleep(1.5)
        while True:
            ccmd, cenv = _cmd(cip, ["rcopy", str(src), f"{sip}:{dst}", "-p", port], faults)
            cli = subprocess.run(ccmd, env=cenv, capture_output=True, text=True,
                                 timeout=max(5.0, deadline - time.monotonic()))
            out = cli.stdout + cli.stderr
            if cli.returncode == 0 or not any(r in out for r in REFUSED) \
                    or time.monotonic() > deadline - 10:
                break
            time.sleep(0.5)
        assert cli.returncode == 0, out
        assert "done" in out and f"{src.stat().st_size} bytes" in out, out
        assert filecmp.cmp(src, dst, shallow=False)
        # the server's report reaches its (buffered) output when it waits for the next
        # client: after its close, which waits for the client's disconnection or, when
        # the client's DREQ was lost, for its own SHUTDOWN to go unanswered
        while time.monotonic() < deadline and log.read_text().count("waiting for") < 2:
            time.sleep(0.2)
    finally:
        srv.kill()
        srv.wait()
    sout = log.read_text()
    assert f"transferring...{src.stat().st_size} bytes...closing...done" in sout, sout


def test_rsocket_api():
    a, b = _addresses()
    cmd, env = _cmd(a, ["python3", str(HERE / "rdmacm" / "rsocket_api.py"), a, b], None)
    i = cmd.index("--devices")
    cmd[i + 1] = f"softnic0={a},softnic1={b}"
    cmd[cmd.index("python3")] = __import__("sys").executable
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stdout.splitlines()[-1:] == ["ok"], r.stdout + r.stderr


# ---------------------------------------------------------------- librspreload.so

RSPRELOAD = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so"


def _iperf3_json(out: str) -> dict:
    """iperf3 -J's report; the program's warnings on stderr may surround it."""
    import json
    return json.loads(out[out.index("{\n"):out.rindex("}") + 1])


@pytest.mark.compat("iperf3-rspreload")
@pytest.mark.parametrize("faults", [None, "loss=0.02"])
def test_iperf3_rspreload(faults):
    """Debian's librspreload.so turns an unmodified iperf3's TCP sockets (its control
    connection and its data stream) into rsockets.  The server counts what it read
    until the client's end of test arrived on the control connection: all the client
    sent but what was still in flight then, at most the data stream's staging buffer
    and receive ring (256 KiB each)."""
    need("iperf3")
    if not Path(RSPRELOAD).exists():
        _missing(f"needs {RSPRELOAD} (Debian: librdmacm1)")

    def under_rspreload(args: str) -> list[str]:
        # softnic exec sets LD_PRELOAD (its own preload library): add rspreload to it
        return ["sh", "-c", f'LD_PRELOAD="$LD_PRELOAD {RSPRELOAD}" exec iperf3 {args}']

    sout, cout = check(pair(under_rspreload("-s -B {S} -p {PORT} -1 -J"),
                            under_rspreload("-c {S} -p {PORT} -t 3 -J"), faults=faults))
    client, server = _iperf3_json(cout), _iperf3_json(sout)
    sent = client["end"]["sum_sent"]["bytes"]
    assert sent > 0 and client["start"]["connected"], cout
    received = server["end"]["sum_received"]["bytes"]
    assert 0 <= sent - received <= 2 * 256 * 1024, (sout, cout)
    assert client["end"]["sum_received"]["bytes"] == received  # (reported back to the client)


# ---------------------------------------------------------------- mckey, cmtime

@pytest.mark.compat("rdmacm-utils")
@pytest.mark.parametrize("faults", [None])
def test_mckey(faults):
    """Multicast: a receiver joins a group, a sender joins and sends 10 UD messages."""
    need("mckey")
    sout, cout = check(pair(["mckey", "-m", "239.71.0.1", "-b", "{S}", "-C", "10"],
                            ["sh", "-c", "sleep 1; exec mckey -m 239.71.0.1 -s -C 10"],
                            faults=faults))
    for out in (sout, cout):
        assert "joined dgid: ::ffff:239.71.0.1" in out and "return status 0" in out, out
    assert "receiving data transfers" in sout and "data transfers complete" in sout


@pytest.mark.compat("rdmacm-utils")
def test_cmtime():
    """cmtime: 20 connections set up and torn down; its table has every step.  Its
    server serves for ever (rdma-core 44): stopped once the client is done."""
    need("cmtime")
    sip, cip = _addresses()
    port = str(_free_tcp_port())
    scmd, senv = _cmd(sip, ["cmtime", "-b", sip, "-p", port, "-c", "20"], None)
    srv = subprocess.Popen(scmd, env=senv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        _wait_bound(sip, deadline, srv)
        time.sleep(1.5)
        ccmd, cenv = _cmd(cip, ["cmtime", "-s", sip, "-p", port, "-c", "20"], None)
        cli = subprocess.run(ccmd, env=cenv, capture_output=True, text=True,
                             timeout=max(5.0, deadline - time.monotonic()))
    finally:
        srv.kill()
        srv.communicate()
    out = cli.stdout + cli.stderr
    assert cli.returncode == 0, out
    steps = [ln.split(":")[0].strip() for ln in out.splitlines() if ln.count(":") == 1
             and len(ln.split(":")[1].split()) == 4]
    assert steps == ["create id", "resolve addr", "resolve route", "create qp", "connect",
                     "disconnect", "destroy"], out
