"""Two hosts: network namespaces joined by a veth pair, one softnic device in each.

Each side is an unmodified pyverbs program under `softnic exec`, its device on
the namespace's real interface address (not loopback), exchanging QPN, GID
and rkey out of band and then doing a WRITE_WITH_IMM and a READ across the
link.  Needs root (or CAP_NET_ADMIN) and iproute2; skipped without them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from test_verbs_api_traffic import PEER_PROGRAM

ROOT = Path(__file__).resolve().parent.parent


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def two_hosts():
    if shutil.which("ip") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("iproute2 is required in CI (.ci/run installs it)")
        pytest.skip("needs iproute2 for network namespaces")
    if os.geteuid() != 0:
        pytest.skip("needs root (CAP_NET_ADMIN) for network namespaces")
    tag = f"sn{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    try:
        _ip("netns", "add", a)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot create network namespaces here: {e.stderr.decode().strip()}")
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


def test_pyverbs_programs_on_two_hosts(tmp_path, two_hosts):
    prog = tmp_path / "peer.py"
    prog.write_text(PEER_PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTNIC_")}
    env["PYTHONPATH"] = str(ROOT)
    procs = {}
    for role, (ns, addr) in zip(("server", "client"), two_hosts):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "softnic.cli", "exec",
               "--devices", f"softnic0={addr}", "--", sys.executable, str(prog), role,
               "softnic0"]
        procs[role] = subprocess.Popen(cmd, cwd=tmp_path, env=env, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    watchdog = threading.Timer(60, lambda: [p.kill() for p in procs.values()])
    watchdog.start()
    try:
        s, c = procs["server"], procs["client"]
        s_info, c_info = s.stdout.readline(), c.stdout.readline()
        # the server's GID is its veth address 10.99.0.1, IPv4-mapped
        assert json.loads(s_info)["gid"].endswith("ffff:0a63:0001")
        s.stdin.write(c_info)
        s.stdin.flush()
        c.stdin.write(s_info)
        c.stdin.flush()
        assert s.stdout.readline().strip() == "ready"
        c.stdin.write("go\n")
        c.stdin.flush()
        assert json.loads(s.stdout.readline()) == {"imm": 77, "data": "over two processes"}
        assert json.loads(c.stdout.readline()) == {"read": "over two processes"}
        s.stdin.write("done\n")
        s.stdin.flush()
        assert s.wait(30) == 0 and c.wait(30) == 0
    finally:
        watchdog.cancel()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
