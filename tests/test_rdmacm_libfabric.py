"""libfabric's verbs provider (Debian's 1.17) on softnic's librdmacm and libibverbs.

The provider only offers MSG endpoints on interfaces that are up and not
loopback, so each side runs in a network namespace of its own, joined by a veth
pair, with its softnic device on the namespace's address.  Needs root
(CAP_NET_ADMIN), iproute2 and libfabric-bin: skipped without them, failed under
CI=true.  Every subprocess has a timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
SOFTNIC = [sys.executable, "-m", "softnic.cli"]


def _missing(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI must run the libfabric tests)")
    pytest.skip(why)


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@pytest.fixture(scope="module")
def two_hosts():
    if shutil.which("fi_pingpong") is None or shutil.which("fi_info") is None:
        _missing("needs libfabric-bin (fi_info, fi_pingpong)")
    if shutil.which("ip") is None:
        _missing("needs iproute2 for network namespaces")
    if os.geteuid() != 0:
        _missing("needs root (CAP_NET_ADMIN) for network namespaces")
    from softnic.faces.libibverbs.build import BuildError, build
    from softnic.faces.librdmacm.build import build as build_rdmacm
    try:
        build()
        build_rdmacm()
    except BuildError as e:
        _missing(str(e))
    tag = f"sf{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    net = f"10.{97 - os.getpid() % 40}.{os.getpid() % 250}"
    try:
        _ip("netns", "add", a)
    except subprocess.CalledProcessError as e:
        _missing(f"cannot create network namespaces here: {e.stderr.decode().strip()}")
    try:
        _ip("netns", "add", b)
        _ip("link", "add", f"{tag}va", "type", "veth", "peer", "name", f"{tag}vb")
        _ip("link", "set", f"{tag}va", "netns", a)
        _ip("link", "set", f"{tag}vb", "netns", b)
        for ns, dev, addr in ((a, f"{tag}va", f"{net}.1"), (b, f"{tag}vb", f"{net}.2")):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield (a, f"{net}.1"), (b, f"{net}.2")
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def _cmd(ns, ip, args, faults=None):
    env = dict(os.environ, SOFTNIC_DEVICES=f"softnic0={ip}")
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT)] + ([env["PYTHONPATH"]]
                                                         if env.get("PYTHONPATH") else []))
    lossy = ["--faults", faults, "--seed", "11"] if faults else []
    return ["ip", "netns", "exec", ns, *SOFTNIC, "exec", *lossy, "--", *args], env


@pytest.mark.compat("libfabric")
def test_fi_info_lists_softnic_devices(two_hosts):
    (a, aip), _ = two_hosts
    cmd, env = _cmd(a, aip, ["fi_info", "-p", "verbs"])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "domain: softnic0\n" in r.stdout and "type: FI_EP_MSG" in r.stdout
    assert "domain: softnic0-dgram" in r.stdout


@pytest.mark.compat("libfabric")
@pytest.mark.parametrize("faults", [None, "loss=0.02"])
@pytest.mark.parametrize("mode", [["-p", "verbs", "-e", "msg"],
                                  ["-p", "verbs;ofi_rxm", "-e", "rdm"]],
                         ids=["verbs-msg", "verbs-ofi_rxm-rdm"])
def test_fi_pingpong(two_hosts, mode, faults):
    (a, aip), (b, bip) = two_hosts
    port = str(20000 + os.getpid() % 20000 + len(mode[1]) + (100 if faults else 0))
    args = ["fi_pingpong", *mode, "-I", "50", "-S", "1024", "-B", port]
    scmd, senv = _cmd(a, aip, args, faults)
    srv = subprocess.Popen(scmd, env=senv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            time.sleep(1.0)
            ccmd, cenv = _cmd(b, bip, ["fi_pingpong", *mode, "-I", "50", "-S", "1024",
                                       "-P", port, aip], faults)
            cli = subprocess.run(ccmd, env=cenv, capture_output=True, text=True, timeout=120)
            # the control connection is refused until the server listens: try again
            if cli.returncode == 0 or srv.poll() is not None or time.monotonic() > deadline \
                    or "ctrl" not in cli.stdout + cli.stderr:
                break
        out, _ = srv.communicate(timeout=120)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert cli.returncode == 0 and srv.returncode == 0, (cli.stdout + cli.stderr, out)
    for text in (cli.stdout, out):
        rows = [ln.split() for ln in text.splitlines() if ln.startswith("1k")]
        assert rows and rows[0][1] == "50" and rows[0][2] == "=50", text
