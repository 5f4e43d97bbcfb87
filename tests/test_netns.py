"""Two hosts: network namespaces joined by a veth pair, one softnic device in each.

Each side is an unmodified pyverbs program under `softnic exec`, its device on
the namespace's real interface address (not loopback), exchanging QPN, GID
and rkey out of band and then doing a WRITE_WITH_IMM and a READ across the
link, over each transport (``/udp``: RoCEv2, ``/tcp``: iWARP).  Needs root (or CAP_NET_ADMIN) and iproute2; skipped without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_verbs_api_traffic import PEER_PROGRAM, run_peers

ROOT = Path(__file__).resolve().parent.parent


def _not_here(why: str) -> None:
    """Skip where this machine cannot make namespaces; in CI (root there) fail instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI must run the two-host test)")
    pytest.skip(why)


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def two_hosts():
    if shutil.which("ip") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("iproute2 is required in CI (.ci/run installs it)")
        pytest.skip("needs iproute2 for network namespaces")
    if os.geteuid() != 0:
        _not_here("needs root (CAP_NET_ADMIN) for network namespaces")
    tag = f"sn{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    try:
        _ip("netns", "add", a)
    except subprocess.CalledProcessError as e:
        _not_here(f"cannot create network namespaces here: {e.stderr.decode().strip()}")
    try:
        _ip("netns", "add", b)
        _ip("link", "add", f"{tag}va", "type", "veth", "peer", "name", f"{tag}vb")
        _ip("link", "set", f"{tag}va", "netns", a)
        _ip("link", "set", f"{tag}vb", "netns", b)
        for ns, dev, addr in ((a, f"{tag}va", "10.99.0.1"), (b, f"{tag}vb", "10.99.0.2")):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield (a, "10.99.0.1"), (b, "10.99.0.2")
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_pyverbs_programs_on_two_hosts(tmp_path, two_hosts, transport):
    prog = tmp_path / "peer.py"
    prog.write_text(PEER_PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTNIC_")}
    env["PYTHONPATH"] = str(ROOT)
    cmds = {role: ["ip", "netns", "exec", ns, sys.executable, "-m", "softnic.cli", "exec",
                   "--devices", f"softnic0={addr}/{transport}", "--", sys.executable, str(prog),
                   role,
                   "softnic0"]
            for role, (ns, addr) in zip(("server", "client"), two_hosts)}

    def on_veth(info):      # the server's GID is its veth address 10.99.0.1, IPv4-mapped
        assert info["gid"].endswith("ffff:0a63:0001")

    run_peers(cmds, tmp_path, env, on_veth)
