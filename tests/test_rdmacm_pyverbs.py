"""pyverbs' rdma_cm API (verbs_api.cmid) over softnic: programs written for
rdma-core's pyverbs run unmodified under ``softnic exec``, and the errors the
API gives where rdma_cm refuses."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import softnic.driver.nic as _nic
from softnic.driver import config as _config
from softnic.driver import rdmacm as R
from verbs_api import cm_enums as ce
from verbs_api.cmid import AddrInfo, CMEvent, CMEventChannel, CMID, ConnParam
from verbs_api.pyverbs_error import PyverbsRDMAError

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent
SOFTNIC = [sys.executable, "-m", "softnic.cli"]
BASE = 100 + os.getpid() % 100


def _env(devices):
    env = dict(os.environ, SOFTNIC_DEVICES=devices)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT)] + ([env["PYTHONPATH"]]
                                                         if env.get("PYTHONPATH") else []))
    return env


def test_async_program_one_process_two_devices():
    a, b = f"127.{BASE}.90.2", f"127.{BASE}.90.3"
    r = subprocess.run([*SOFTNIC, "exec", sys.executable, str(HERE / "rdmacm" /
                        "pyverbs_cm_async.py"), a, b, "7800"],
                       env=_env(f"softnic0={a},softnic1={b}"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "connected, exchanged, disconnected" in r.stdout


@pytest.mark.compat("pyverbs-softnic")
def test_sync_programs_as_two_processes():
    a, b = f"127.{BASE}.91.2", f"127.{BASE}.91.3"
    script = str(HERE / "rdmacm" / "pyverbs_cm_sync.py")
    srv = subprocess.Popen([*SOFTNIC, "exec", sys.executable, script, "server", a, "7801"],
                           env=_env(f"softnic0={a}"), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 50
        while True:
            time.sleep(0.5)
            cli = subprocess.run([*SOFTNIC, "exec", sys.executable, script, "client", a, "7801"],
                                 env=_env(f"softnic0={b}"), capture_output=True, text=True,
                                 timeout=60)
            if cli.returncode == 0 or "ECONNREFUSED" not in cli.stderr + cli.stdout \
                    and "Errno: 111" not in cli.stderr or time.monotonic() > deadline:
                break
        out, _ = srv.communicate(timeout=30)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert cli.returncode == 0 and srv.returncode == 0, (cli.stdout + cli.stderr, out)
    assert "client got b'SOFTNIC RDMA_CM'" in cli.stdout
    assert "server got b'softnic rdma_cm'" in out


@pytest.fixture
def two_devices():
    a, b = f"127.{BASE}.92.2", f"127.{BASE}.92.3"
    _nic.configure(_config.RuntimeConfig(devices=_config.parse_devices(
        f"softnic0={a},softnic1={b}")))
    R.reset()
    yield a, b
    R.reset()
    _nic.configure(None)


def test_connect_to_a_port_nobody_listens_on_is_rejected(two_devices):
    a, b = two_devices
    ch = CMEventChannel()
    cid = CMID(ch)
    cid.resolve_addr(AddrInfo(src=b, dst=a, dst_service="7900"))
    assert CMEvent(ch).event_type == ce.RDMA_CM_EVENT_ADDR_RESOLVED
    cid.resolve_route()
    assert CMEvent(ch).event_type == ce.RDMA_CM_EVENT_ROUTE_RESOLVED
    cid.connect(ConnParam())
    ev = CMEvent(ch)
    assert ev.event_type == ce.RDMA_CM_EVENT_REJECTED and ev.status == 8   # invalid service ID
    cid.close()
    ch.close()


def test_bind_errors(two_devices):
    a, b = two_devices
    ch = CMEventChannel()
    with pytest.raises(PyverbsRDMAError) as ex:
        CMID(ch).bind_addr(AddrInfo(src="192.0.2.77", src_service="7901",
                                    flags=ce.RAI_PASSIVE))
    assert ex.value.error_code == errno.EADDRNOTAVAIL
    first = CMID(ch)
    first.bind_addr(AddrInfo(src=a, src_service="7902", flags=ce.RAI_PASSIVE))
    with pytest.raises(PyverbsRDMAError) as ex:
        CMID(ch).bind_addr(AddrInfo(src="0.0.0.0", src_service="7902", flags=ce.RAI_PASSIVE))
    assert ex.value.error_code == errno.EADDRINUSE
    other = CMID(ch, port_space=ce.RDMA_PS_UDP)       # another port space: no clash
    other.bind_addr(AddrInfo(src=a, src_service="7902", flags=ce.RAI_PASSIVE))
    assert first.dev_name == "softnic0" and other.dev_name == "softnic0"
    for x in (first, other, ch):
        x.close()


def test_listen_on_any_serves_every_device(two_devices):
    a, b = two_devices
    sch, cch = CMEventChannel(), CMEventChannel()
    lst = CMID(sch)
    lst.bind_addr(AddrInfo(src="0.0.0.0", src_service="7903", flags=ce.RAI_PASSIVE))
    lst.listen(2)
    for dst, src in ((a, b), (b, a)):
        cid = CMID(cch)
        cid.resolve_addr(AddrInfo(src=src, dst=dst, dst_service="7903"))
        CMEvent(cch)
        cid.resolve_route()
        CMEvent(cch)
        cid.connect(ConnParam(qp_num=0x99))
        ev = CMEvent(sch)
        assert ev.event_type == ce.RDMA_CM_EVENT_CONNECT_REQUEST
        child = CMID(ev, listen_id=lst)
        assert child.dev_name == ("softnic0" if dst == a else "softnic1")
        child.reject(b"busy")
        ev = CMEvent(cch)
        assert ev.event_type == ce.RDMA_CM_EVENT_REJECTED and ev.status == 28
        assert ev.private_data[:4] == b"busy"
        child.close()
        cid.close()
    lst.close()


@pytest.mark.compat("pyverbs-softnic", transport="sim", faults="loss")
@pytest.mark.parametrize("seed", [1, 2])
def test_async_program_in_the_simulated_fabric_with_loss_and_duplication(seed):
    """The same program in virtual time, with 5 % loss and 5 % duplication on every
    link: the CM's retransmissions and the QPs' carry it through.  Replays from its seed."""
    r = subprocess.run([*SOFTNIC, "exec", "--faults", "loss=0.05,duplicate=0.05", "--seed",
                        str(seed), sys.executable,
                        str(HERE / "rdmacm" / "pyverbs_cm_async.py"), "10.0.0.1", "10.0.0.2",
                        "7800"],
                       env=dict(_env("softnic0=10.0.0.1,softnic1=10.0.0.2"),
                                SOFTNIC_BACKEND="sim"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"seed {seed}:\n{r.stdout}{r.stderr}"
    assert "connected, exchanged, disconnected" in r.stdout


@pytest.mark.compat("pyverbs-debian")
def test_the_same_program_on_debians_pyverbs_over_softnics_librdmacm():
    """rdma-core's own pyverbs (Debian's python3-pyverbs, Cython over librdmacm.so.1)
    runs the program unchanged over softnic's C libraries, in a Python host."""
    py = "/usr/bin/python3"
    probe = subprocess.run([py, "-c", "import pyverbs.cmid"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs Debian's python3-pyverbs (.ci/run installs it)")
        pytest.skip("needs Debian's python3-pyverbs")
    from test_libibverbs import need_face
    need_face("librdmacm")
    a, b = f"127.{BASE}.93.2", f"127.{BASE}.93.3"
    r = subprocess.run([*SOFTNIC, "exec", "--pyverbs", "system", py,
                        str(HERE / "rdmacm" / "pyverbs_cm_async.py"), a, b, "7810"],
                       env=_env(f"softnic0={a},softnic1={b}"), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "connected, exchanged, disconnected" in r.stdout


def test_resolve_addrinfo_reports_its_event():
    """rdma_resolve_addrinfo (rdma-core 64's tests): the resolution arrives as
    RDMA_CM_EVENT_ADDRINFO_RESOLVED on the id's channel, and query_addrinfo gives it (the
    source with RAI_PASSIVE, else the destination); before it, query_addrinfo is EINVAL."""
    ch = CMEventChannel()
    try:
        cmid = CMID(creator=ch)
        with pytest.raises(PyverbsRDMAError) as ex:
            cmid.query_addrinfo()
        assert ex.value.error_code == errno.EINVAL
        cmid.resolve_addrinfo(node='127.0.0.1', service='7902', flags=ce.RAI_PASSIVE)
        ev = CMEvent(ch)
        assert ev.event_type == ce.RDMA_CM_EVENT_ADDRINFO_RESOLVED
        assert ev.event_str() == 'RDMA_CM_EVENT_ADDRINFO_RESOLVED'
        ev.ack_cm_event()
        ai = cmid.query_addrinfo()
        assert ai.src[:2] == ('127.0.0.1', 7902) and ai.dst is None
        cmid.resolve_addrinfo(node='127.0.0.1', service='7903')
        CMEvent(ch).ack_cm_event()
        assert cmid.query_addrinfo().dst[:2] == ('127.0.0.1', 7903)
        cmid.close()
    finally:
        ch.close()
