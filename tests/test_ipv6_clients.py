"""Unmodified C programs over IPv6 devices: rdma_cm (rping, ucmatose), verbs with
IPv6 GIDs (ibv_devinfo, perftest), UCX, under ``softnic exec``.

A device's GID is its address, so two processes need two IPv6 addresses; on
loopback there is only ::1.  The programs therefore run in a network namespace
of their own whose loopback carries ::1 and two ULA addresses (fd00:6::2,
fd00:6::3), the server on one, the client on the other (or on ::1, as
``rping -a ::1`` asks).  Needs root (CAP_NET_ADMIN) and iproute2: skipped
without them, failed under CI=true, as tests/test_netns.py.

Debian's perftest (4.5) and qperf (0.4.11) resolve an rdma_cm server's name as
IPv4 only (``hints.ai_family = AF_INET`` in perftest's rdma_client_connect and
qperf's cm_open_client), so ``ib_write_bw -R`` and ``qperf -cm1`` cannot be
given an IPv6 address on any provider; perftest runs here with IPv6 GIDs over
its TCP exchange instead (``-x 0``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER, CLIENT = "fd00:6::2", "fd00:6::3"
TIMEOUT = 150
PROJECT = Path(__file__).resolve().parent.parent
#: what a client prints when it came before its server listened
REFUSED = ("REJECTED", "error 8", "Connection refused", "rdma_connect: ", "Failed to handle",
           "connect error")


def _missing(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI must run the IPv6 client tests)")
    pytest.skip(why)


def need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        _missing(f"needs {binary} (Debian: rdmacm-utils / ibverbs-utils / perftest / "
                 f"ucx-utils)")
    return path


# softnic's libraries, built once (the face check is softnic.faces.availability's)
from test_rdmacm_clients import libs  # noqa: E402,F401  (an autouse fixture)


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def ns():
    """A network namespace whose loopback holds ::1, fd00:6::2 and fd00:6::3."""
    if shutil.which("ip") is None:
        _missing("needs iproute2 for a network namespace")
    if os.geteuid() != 0:
        _missing("needs root (CAP_NET_ADMIN) for a network namespace")
    name = f"sn6{os.getpid() % 100000}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as e:
        _missing(f"cannot create a network namespace here: {e.stderr.decode().strip()}")
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        for addr in (SERVER, CLIENT):      # (nodad: usable at once, no duplicate detection)
            _ip("-n", name, "addr", "add", f"{addr}/128", "dev", "lo", "nodad")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _cmd(ns: str, ip: str, args, *, faults=None, capture=None, env_extra=None):
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "softnic.cli", "exec",
           "--devices", f"softnic0=[{ip}]"]
    if capture:
        cmd += ["--capture", str(capture)]
    if faults:
        cmd += ["--faults", faults, "--seed", "11"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTNIC_")}
    env.update(env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT)] + ([env["PYTHONPATH"]]
                                                         if env.get("PYTHONPATH") else []))
    return cmd + ["--", *args], env


def _bound(ns: str, ip: str) -> bool:
    """Does a UDP socket of the namespace hold [ip]:4791 (the server's device is open)?"""
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hunl"], capture_output=True,
                         text=True).stdout
    return f"[{ip}]:4791" in out


def pair(ns, server, client, *, server_ip=SERVER, client_ip=CLIENT, faults=None,
         capture=None, env_extra=None, ready=None):
    """Run ``server`` on ``server_ip``'s device, then ``client`` on ``client_ip``'s
    (again while it is refused because the server was not listening yet); returns
    ((rc, output), (rc, output)).  ``ready``: a function telling that the server
    listens (default: its device's UDP socket is bound, and a moment more)."""
    scmd, senv = _cmd(ns, server_ip, server, faults=faults, env_extra=env_extra,
                      capture=capture and capture.with_name(f"{capture.stem}-s.pcap"))
    srv = subprocess.Popen(scmd, env=senv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while srv.poll() is None and time.monotonic() < deadline and \
                not (ready() if ready else _bound(ns, server_ip)):
            time.sleep(0.1)
        if ready is None:
            time.sleep(1.5)                 # (the device opens at bind; listen follows)
        while True:
            ccmd, cenv = _cmd(ns, client_ip, client, faults=faults, env_extra=env_extra,
                              capture=capture and capture.with_name(f"{capture.stem}-c.pcap"))
            cli = subprocess.run(ccmd, env=cenv, capture_output=True, text=True,
                                 timeout=max(5.0, deadline - time.monotonic()))
            out = cli.stdout + cli.stderr
            if cli.returncode == 0 or srv.poll() is not None or \
                    time.monotonic() > deadline - 10 or not any(r in out for r in REFUSED):
                break
            time.sleep(0.5)
        try:
            sout, _ = srv.communicate(timeout=max(5.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            srv.kill()
            sout, _ = srv.communicate()
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    return (srv.returncode, sout), (cli.returncode, out)


def check(res):
    (src, sout), (crc, cout) = res
    assert crc == 0 and src == 0, f"server rc={src}:\n{sout}\nclient rc={crc}:\n{cout}"
    return sout, cout


# ---------------------------------------------------------------- rdma_cm


@pytest.mark.compat("rdmacm-utils", transport="roce6")
@pytest.mark.parametrize("faults", [None, "loss=0.02"])
def test_rping_over_ipv6(ns, faults):
    need("rping")
    count = 20 if faults else 10
    sout, cout = check(pair(ns, ["rping", "-s", "-a", SERVER, "-C", str(count)],
                            ["rping", "-c", "-a", SERVER, "-C", str(count), "-v"],
                            faults=faults))
    lines = [ln for ln in cout.splitlines() if ln.startswith("ping data: rdma-ping-")]
    assert len(lines) == count
    assert lines[0].startswith("ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@pytest.mark.compat("rdmacm-utils", transport="roce6")
@pytest.mark.parametrize("server_ip", ["::1", SERVER], ids=["device-on-::1", "host-::1"])
def test_rping_a_ipv6_loopback(ns, server_ip):
    """``rping -s -a ::1`` / ``rping -c -a ::1``: the server's device is ::1, or ::1 is
    no device's and stands for the host's loopback, bound to the server's IPv6 device
    and found by the client in the host's table (softnic/driver/rdmacm_host.py), as
    127.0.0.1 is."""
    need("rping")
    sout, cout = check(pair(ns, ["rping", "-s", "-a", "::1", "-C", "5"],
                            ["rping", "-c", "-a", "::1", "-C", "5", "-v"], server_ip=server_ip))
    assert cout.count("ping data: rdma-ping-") == 5


def test_rping_ipv6_capture_shows_the_cm_exchange_in_tshark(ns, tmp_path):
    need("rping")
    tshark = shutil.which("tshark")
    if tshark is None:
        _missing("needs tshark")
    check(pair(ns, ["rping", "-s", "-a", SERVER, "-C", "5"],
               ["rping", "-c", "-a", SERVER, "-C", "5", "-v"], capture=tmp_path / "r6.pcap"))
    caps = sorted(tmp_path.glob("r6-*-softnic0.pcap"))
    assert len(caps) == 2, list(tmp_path.iterdir())
    for cap in caps:
        info = subprocess.run([tshark, "-n", "-r", str(cap)], capture_output=True, text=True,
                              timeout=60, check=True).stdout
        assert "CM: ConnectRequest" in info and "CM: ConnectReply" in info, info
        assert "RC Send Only" in info and "RC RDMA Read" in info
        rows = subprocess.run([tshark, "-n", "-r", str(cap), "-T", "fields", "-e", "ipv6.src",
                               "-e", "ipv6.dst"], capture_output=True, text=True, timeout=60,
                              check=True).stdout.split()
        assert set(rows) == {SERVER, CLIENT}
        bad = subprocess.run([tshark, "-r", str(cap), "-Y", "_ws.malformed || _ws.expert"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert bad.strip() == "", bad


@pytest.mark.compat("rdmacm-utils", transport="roce6")
def test_ucmatose_over_ipv6(ns):
    need("ucmatose")
    sout, cout = check(pair(ns, ["ucmatose", "-b", SERVER, "-c", "2", "-C", "20"],
                            ["ucmatose", "-s", SERVER, "-c", "2", "-C", "20"]))
    assert "data transfers complete" in cout and "data transfers complete" in sout


@pytest.mark.compat("pyverbs-softnic", transport="roce6")
def test_pyverbs_rdma_cm_over_ipv6(ns):
    """The Python face's rdma_cm (pyverbs' CMID from an AddrInfo) with IPv6 addresses."""
    prog = str(PROJECT / "tests" / "rdmacm" / "pyverbs_cm_sync.py")
    sout, cout = check(pair(ns, [sys.executable, prog, "server", SERVER, "7471"],
                            [sys.executable, prog, "client", SERVER, "7471"]))
    assert "server got b'softnic rdma_cm'" in sout
    assert "client got b'SOFTNIC RDMA_CM'" in cout


# ---------------------------------------------------------------- verbs with IPv6 GIDs


@pytest.mark.compat("ibverbs-utils", transport="roce6")
def test_ibv_devinfo_shows_the_ipv6_gid(ns):
    need("ibv_devinfo")
    cmd, env = _cmd(ns, SERVER, ["ibv_devinfo", "-v"])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert f"\tGID[  0]:\t\t{SERVER}, RoCE v2\n" in r.stdout, r.stdout


@pytest.mark.compat("perftest", transport="roce6")
def test_perftest_write_with_ipv6_gids(ns):
    need("ib_write_bw")
    port = "18615"
    sout, cout = check(pair(ns, ["ib_write_bw", "-x", "0", "-n", "200", "-p", port],
                            ["ib_write_bw", "-x", "0", "-n", "200", "-p", port, "127.0.0.1"]))
    # perftest prints each side's GID: the fd00:6:: addresses, byte by byte in decimal
    for who in (SERVER, CLIENT):
        assert f"GID: 253:00:00:06:00:00:00:00:00:00:00:00:00:00:00:0{who[-1]}" in cout, cout
    table = cout.split("#bytes", 1)[1].splitlines()[1].split()
    assert table[1] == "200"                 # iterations done


@pytest.mark.parametrize("tls, tl, test", [("rc_v,self", "rc_verbs", "ucp_put_bw"),
                                           ("ud_v,self", "ud_verbs", "tag_lat")])
@pytest.mark.compat("ucx", transport="roce6")
def test_ucx_over_an_ipv6_device(ns, tls, tl, test):
    """rc_verbs addresses its QPs by the IPv6 GIDs; ud_verbs also checks each
    receive's GRH (the IPv6 header, ``wc.sl`` 1) against the port's GIDs."""
    need("ucx_info")
    binary = need("ucx_perftest")
    env = {"UCX_TLS": tls, "UCX_NET_DEVICES": "softnic0:1"}
    cmd, cenv = _cmd(ns, SERVER, ["ucx_info", "-d"], env_extra=env)
    r = subprocess.run(cmd, env=cenv, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert f"#      Transport: {tl}\n#         Device: softnic0:1" in r.stdout, r.stdout
    port = "13590" if tl == "rc_verbs" else "13591"

    def ready() -> bool:
        out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Htln"], capture_output=True,
                             text=True).stdout
        return f":{port} " in out
    # (its own exchange over TCP on 127.0.0.1; the RDMA traffic between the IPv6 devices)
    sout, cout = check(pair(ns, [binary, "-p", port],
                            [binary, "127.0.0.1", "-p", port, "-t", test, "-n", "100",
                             "-s", "4096" if test == "ucp_put_bw" else "8"], env_extra=env,
                            ready=ready))
    final = [ln for ln in cout.splitlines() if ln.startswith("Final:")]
    assert final and final[0].split()[1] == "100", cout
