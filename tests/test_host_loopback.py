"""What rdma-core's rdma_cm tests need of a device, as a kernel RoCE device gives it:
its network interface in sysfs (``/sys/class/infiniband/<dev>/device/net/<netdev>``,
answered by softnic's preload from ``SOFTNIC_SYSFS``), the host's loopback address
shared by every process (a listener on 127.0.0.1 in one process is reached from
another, ``softnic/driver/rdmacm_host.py``), and a Python program that forks before it uses
its devices (the C face: the child starts afresh)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from softnic.driver import config as _config
from softnic.driver import rdmacm_host as H
from softnic.faces.libibverbs import sysfs
from softnic.core.errors import VerbsError

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent
SOFTNIC = [sys.executable, "-m", "softnic.cli"]
BASE = 100 + os.getpid() % 100


def _missing(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (.ci/run installs it)")
    pytest.skip(why)


def _env(**kw):
    env = dict(os.environ, **kw)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT)] + ([env["PYTHONPATH"]]
                                                         if env.get("PYTHONPATH") else []))
    return env


def _exec(args, env, timeout=120):
    r = subprocess.run([*SOFTNIC, "exec", *args], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=PROJECT)
    if r.returncode and "building libibverbs" in r.stderr:
        _missing(f"softnic's libibverbs.so.1 cannot be built here: {r.stderr[-300:]}")
    return r


# ------------------------------------------------------------------ the host table

def test_host_table_publish_lookup_withdraw(tmp_path, monkeypatch):
    monkeypatch.setenv("SOFTNIC_STATS_DIR", str(tmp_path))
    assert H.lookup(0x106, 7471, "127.0.0.1") is None
    H.publish(0x106, 7471, "127.0.0.1", ("127.0.0.9", 4791))
    assert H.lookup(0x106, 7471, "127.0.0.1") == ("127.0.0.9", 4791)
    assert H.lookup(0x111, 7471, "127.0.0.1") is None          # another port space
    assert H.lookup(0x106, 7472, "127.0.0.1") is None
    H.withdraw(0x106, 7471, "127.0.0.1")
    assert H.lookup(0x106, 7471, "127.0.0.1") is None


def test_host_table_one_live_listener_per_address(tmp_path, monkeypatch):
    monkeypatch.setenv("SOFTNIC_STATS_DIR", str(tmp_path))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        H._entry(0x106, 7471, "127.0.0.1").parent.mkdir(parents=True, exist_ok=True)
        H._entry(0x106, 7471, "127.0.0.1").write_text(
            f'{{"pid": {other.pid}, "ip": "127.0.0.5", "port": 4791}}')
        assert H.lookup(0x106, 7471, "127.0.0.1") == ("127.0.0.5", 4791)
        with pytest.raises(VerbsError) as ex:
            H.publish(0x106, 7471, "127.0.0.1", ("127.0.0.9", 4791))
        assert ex.value.errno == errno.EADDRINUSE
        H.withdraw(0x106, 7471, "127.0.0.1")                  # not ours: stays
        assert H.lookup(0x106, 7471, "127.0.0.1") == ("127.0.0.5", 4791)
    finally:
        other.kill()
        other.wait()
    # its owner is gone: nobody listens, and the entry is taken over
    assert H.lookup(0x106, 7471, "127.0.0.1") is None
    H.publish(0x106, 7471, "127.0.0.1", ("127.0.0.9", 4791))
    assert H.lookup(0x106, 7471, "127.0.0.1") == ("127.0.0.9", 4791)


def test_two_processes_meet_on_the_hosts_loopback_address(tmp_path):
    """A server bound to 127.0.0.1 (no device's: its own device is 127.B.93.2) and a
    client in another process, with a device of its own, connecting to 127.0.0.1."""
    a, b = f"127.{BASE}.93.2", f"127.{BASE}.93.3"
    port = str(7810 + os.getpid() % 50)
    script = str(HERE / "rdmacm" / "pyverbs_cm_sync.py")
    stats = str(tmp_path)
    srv = subprocess.Popen([*SOFTNIC, "exec", sys.executable, script, "server", "127.0.0.1",
                            port], env=_env(SOFTNIC_DEVICES=f"softnic0={a}",
                                            SOFTNIC_STATS_DIR=stats),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 50
        while True:
            time.sleep(0.5)
            cli = subprocess.run([*SOFTNIC, "exec", sys.executable, script, "client",
                                  "127.0.0.1", port],
                                 env=_env(SOFTNIC_DEVICES=f"softnic0={b}",
                                          SOFTNIC_STATS_DIR=stats),
                                 capture_output=True, text=True, timeout=60)
            if cli.returncode == 0 or time.monotonic() > deadline:
                break
        out, _ = srv.communicate(timeout=30)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert cli.returncode == 0 and srv.returncode == 0, (cli.stdout + cli.stderr, out)
    assert "client got b'SOFTNIC RDMA_CM'" in cli.stdout
    assert "server got b'softnic rdma_cm'" in out
    assert not list(tmp_path.glob("rdmacm-*/*.json"))        # the listener withdrew


# ------------------------------------------------------------------ sysfs

def test_netdev_of_a_device_address():
    rows = [("lo", "127.0.0.1", 8), ("eth0", "10.1.2.3", 24), ("eth1", "10.1.0.1", 16)]
    assert sysfs.netdev_for(None, rows) == "lo"                # a free loopback address
    assert sysfs.netdev_for("127.5.6.7", rows) == "lo"
    assert sysfs.netdev_for("10.1.2.3", rows) == "eth0"        # the interface's own address
    assert sysfs.netdev_for("10.1.2.77", rows) == "eth0"       # the longest prefix holding it
    assert sysfs.netdev_for("10.1.9.9", rows) == "eth1"
    assert sysfs.netdev_for("192.0.2.1", rows) is None


def test_tree_is_named_by_its_content(tmp_path):
    cfg = _config.RuntimeConfig(devices=_config.parse_devices("2"))
    t = sysfs.tree(cfg, tmp_path)
    assert sysfs.tree(cfg, tmp_path) == t
    assert sorted(p.name for p in t.iterdir()) == ["softnic0", "softnic1"]
    assert [p.name for p in (t / "softnic1" / "device" / "net").iterdir()] == ["lo"]


def test_exec_answers_the_devices_sysfs_entries():
    if shutil.which("ls") is None or shutil.which("ip") is None:
        _missing("needs ls and ip (Debian: coreutils, iproute2)")
    probe = ("import os, subprocess, json; "
             "p = '/sys/class/infiniband/softnic0/device/net/'; "
             "print(os.path.exists(p), os.path.isdir(p), sorted(os.listdir('/sys/class/infiniband'))); "
             "net = subprocess.check_output(['ls', p]).decode().split()[0]; "
             "addr = json.loads(subprocess.check_output(['ip', '-j', 'addr', 'show', net]))"
             "[0]['addr_info'][0]['local']; print(net, addr); "
             "print(os.path.exists('/sys/class/infiniband/softnic7'), os.path.isdir('/sys/class/net/lo'))")
    r = _exec(["--devices", "2", "--", sys.executable, "-c", probe], _env())
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "True True ['softnic0', 'softnic1']"
    assert lines[1] == "lo 127.0.0.1"
    assert lines[2] == "False True"             # no such device; real paths as they are


def test_exec_answers_rdma_link_and_the_pkey_entry():
    """Under softnic exec, ``rdma link`` (iproute2, which asks the kernel over RDMA netlink)
    lists softnic's devices on their netdev, in text and JSON, filtered by DEV/PORT, as
    rdma-core 64's tests read it; ports/1/pkeys/0 holds the default P_Key; other ``rdma``
    commands are the host's own."""
    if shutil.which("cat") is None:
        _missing("needs cat (Debian: coreutils)")
    probe = ("import json, subprocess; "
             "out = lambda *a: subprocess.check_output(list(a)).decode(); "
             "print(json.dumps([json.loads(out('rdma', 'link', 'show', '-j')), "
             "out('rdma', 'link').splitlines(), "
             "json.loads(out('rdma', '-j', 'link', 'show', 'softnic1/1')), "
             "subprocess.run(['rdma', 'link', 'show', 'softnic7'], capture_output=True)"
             ".returncode, out('cat', '/sys/class/infiniband/softnic0/ports/1/pkeys/0')]))")
    r = _exec(["--devices", "2", "--", sys.executable, "-c", probe], _env())
    assert r.returncode == 0, r.stderr
    links, text, one, missing, pkey = json.loads(r.stdout)
    assert [(x["ifname"], x["port"], x["state"], x["netdev"]) for x in links
            if x["ifname"].startswith("softnic")] == [("softnic0", 1, "ACTIVE", "lo"),
                                                    ("softnic1", 1, "ACTIVE", "lo")]
    assert [ln for ln in text if "softnic" in ln] == [
        "link softnic0/1 state ACTIVE physical_state LINK_UP netdev lo",
        "link softnic1/1 state ACTIVE physical_state LINK_UP netdev lo"]
    assert [x["ifname"] for x in one] == ["softnic1"]
    assert (missing, pkey) == (1, "0xffff\n")


def test_c_face_python_fork_before_devices_are_open():
    """Debian's pyverbs over softnic's libibverbs.so.1: a device opened and closed, then
    os.fork: the child opens its own (rdma-core's rdma_cm tests fork so); a child forked
    while a device is open opens its own too (rdma-core's multicast tests keep a Context
    open across their fork), and the parent's objects fail there with EIO rather than
    share the parent's device."""
    if not Path("/usr/bin/python3").exists() or subprocess.run(
            ["/usr/bin/python3", "-c", "import pyverbs.device"], capture_output=True,
            timeout=60).returncode:
        _missing("/usr/bin/python3 cannot import pyverbs (Debian: python3-pyverbs)")
    prog = r"""
import os, sys
import pyverbs.device as d
from pyverbs.pd import PD
def child():
    try:
        with d.Context(name='softnic0') as c:
            PD(c).close()
        os._exit(0)
    except Exception as e:
        print('child:', e, flush=True)
        os._exit(3)
def parents(c):
    try:
        PD(c)
        os._exit(0)
    except Exception as e:
        print('parents:', e, flush=True)
        os._exit(4 if 'Errno: 5' in str(e) else 3)
def fork_status(fn=child, *a):
    pid = os.fork()
    if pid == 0:
        fn(*a)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
c = d.Context(name='softnic0'); c.close()
print('closed', fork_status())
c = d.Context(name='softnic0')
print('open', fork_status())
print('parents', fork_status(parents, c))
PD(c).close()
c.close()
print('parent ok')
"""
    r = _exec(["--pyverbs", "system", "--", "/usr/bin/python3", "-c", prog], _env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "closed 0" in r.stdout
    assert "open 0" in r.stdout
    assert "parents 4" in r.stdout                  # EIO
    assert "parent ok" in r.stdout


def test_tree_has_the_gid_entries_ucx_reads(tmp_path):
    """ports/1/gid_attrs/types/N says RoCE v2 for each GID ibv_query_gid answers, ndevs/N
    the netdev, and gids/N the GID in the kernel's text when the address is known."""
    from verbs_api.addr import GID_POPULATED
    cfg = _config.RuntimeConfig(devices=_config.parse_devices("softnic0=127.0.0.9,softnic1=::1"))
    t = sysfs.tree(cfg, tmp_path)
    for name, gid in (("softnic0", "0000:0000:0000:0000:0000:ffff:7f00:0009"),
                      ("softnic1", "0000:0000:0000:0000:0000:0000:0000:0001")):
        port = t / name / "ports" / "1"
        for i in range(GID_POPULATED):
            assert (port / "gids" / str(i)).read_text() == gid + "\n"
            assert (port / "gid_attrs" / "types" / str(i)).read_text() == "RoCE v2\n"
            assert (port / "gid_attrs" / "ndevs" / str(i)).read_text() == "lo\n"
        assert not (port / "gids" / str(GID_POPULATED)).exists()
    t2 = sysfs.tree(_config.RuntimeConfig(devices=_config.parse_devices("1")), tmp_path)
    port = t2 / "softnic0" / "ports" / "1"
    assert (port / "gid_attrs" / "types" / "0").read_text() == "RoCE v2\n"
    assert not (port / "gids").exists() or not list((port / "gids").iterdir())
