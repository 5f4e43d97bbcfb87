"""UCX and Open MPI, unmodified (Debian's 1.13.1 and 4.1.4), on softnic under
``softnic exec``: ucx_info sees softnic's devices with rc_verbs and ud_verbs;
ucx_perftest runs between two processes over each; an MPI program checks every
element of its point-to-point, collective and one-sided transfers over each, also
under 2 % loss.  Every byte between ranks crosses softnic: UCX_TLS names only
rc_verbs or ud_verbs (and self, a rank to itself), and the devices' counters are read.

Needs ucx-utils, openmpi-bin and libopenmpi-dev (mpicc): skipped where missing,
failed under CI=true (.ci/run installs them).  Every subprocess has a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_libibverbs import _missing, free_tcp_port, libdir, listening, softnic_exec  # noqa: F401
from test_netns import two_hosts  # noqa: F401

HERE = Path(__file__).resolve().parent
CDIR = HERE / "c"
TIMEOUT = 120

MPIRUN_ARGS = ["--allow-run-as-root", "--oversubscribe",
               # pml ucx rates only mlx* devices by itself (as on rxe): take any
               "--mca", "pml", "ucx", "--mca", "pml_ucx_devices", "any",
               # no shared-memory or TCP byte transfer layers, no libfabric
               "--mca", "btl", "self", "--mca", "osc", "ucx", "--mca", "mtl", "^ofi"]


def need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        _missing(f"needs {binary} (Debian: ucx-utils / openmpi-bin / libopenmpi-dev)")
    return path


def run(cmd, env, timeout=TIMEOUT, **kw):
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {timeout} s: {' '.join(cmd)}\n{e.stdout}\n{e.stderr}")


# ---------------------------------------------------------------- UCX


@pytest.mark.unprivileged
@pytest.mark.compat("ucx")
def test_ucx_info_lists_softnic_devices_with_rc_and_ud_verbs(libdir):
    cmd, env = softnic_exec(need("ucx_info"), "-d", devices="2")
    r = run(cmd, env)
    assert r.returncode == 0, r.stderr
    for dev in ("softnic0", "softnic1"):
        block = r.stdout.split(f"# Memory domain: {dev}\n", 1)
        assert len(block) == 2, r.stdout
        block = block[1].split("# Memory domain:", 1)[0]
        for tl in ("rc_verbs", "ud_verbs"):
            assert f"#      Transport: {tl}\n#         Device: {dev}:1" in block, block
        assert "atomic_fadd: 64 bit" in block and "atomic_cswap: 64 bit" in block


def _tag_protocols(extra_env: dict) -> str:
    """ucx_info's protocol line for tag sends over rc_verbs on softnic0."""
    cmd, env = softnic_exec(need("ucx_info"), "-e", "-u", "t", "-D", "net", devices="1",
                            extra_env=dict(extra_env, UCX_TLS="rc_v,self",
                                           UCX_NET_DEVICES="softnic0:1"))
    r = run(cmd, env)
    assert r.returncode == 0, r.stderr
    line = next((ln for ln in r.stdout.splitlines() if "tag_send:" in ln), None)
    assert line is not None, r.stdout
    return line


def _rndv_from(line: str) -> int:
    """The size from which a ``tag_send`` line of ucx_info goes by rendezvous."""
    return int(line.split("..<rndv>")[0].rsplit("..", 1)[1])


@pytest.mark.unprivileged
@pytest.mark.compat("ucx")
def test_ucx_sizes_its_protocols_by_the_port_speed(libdir):
    """UCX chooses eager or rendezvous by the port's reported speed: at the default
    100 Gbit/s (4X EDR) a 64 KiB message goes by rendezvous and mid-sized ones by eager
    zero-copy, as on a 100 GbE ConnectX port; at SOFTNIC_LINK_GBPS=1 (1X SDR) the
    rendezvous threshold is several hundred KiB."""
    fast = _tag_protocols({})
    slow = _tag_protocols({"SOFTNIC_LINK_GBPS": "1"})
    assert "<egr/zcopy>" in fast and _rndv_from(fast) < 65536, fast
    assert "<egr/zcopy>" not in slow and _rndv_from(slow) > 262144, slow


def perftest(tls: str, test: str, *args: str, faults: str | None = None) -> str:
    """ucx_perftest server and client, two processes on 127.0.0.1, over ``tls`` only."""
    binary = need("ucx_perftest")
    port = free_tcp_port()
    extra = {"UCX_TLS": tls, "UCX_NET_DEVICES": "softnic0:1"}
    scmd, env = softnic_exec(binary, "-p", str(port), faults=faults, extra_env=extra)
    server = subprocess.Popen(scmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + 30
        while not listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ucx_perftest server did not listen:\n{server.communicate(timeout=5)[0]}")
            time.sleep(0.05)
        ccmd, env = softnic_exec(binary, "127.0.0.1", "-p", str(port), "-t", test, *args,
                                 faults=faults, extra_env=extra)
        client = run(ccmd, env)
        sout = server.communicate(timeout=TIMEOUT)[0]
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    out = client.stdout + client.stderr
    assert client.returncode == 0 and server.returncode == 0, f"{out}\n--- server\n{sout}"
    assert "ERROR" not in out and "ERROR" not in sout, f"{out}\n--- server\n{sout}"
    final = [ln for ln in client.stdout.splitlines() if ln.startswith("Final:")]
    assert final, out
    return final[0]


RC_TESTS = ["tag_lat", "tag_bw", "ucp_put_bw", "ucp_get", "ucp_add", "ucp_fadd", "ucp_swap",
            "ucp_cswap"]
UNPRIVILEGED = pytest.mark.unprivileged


@pytest.mark.compat("ucx")
@pytest.mark.parametrize("test", [pytest.param(t, marks=UNPRIVILEGED) if t == "tag_bw" else t
                                  for t in RC_TESTS])
def test_ucx_perftest_rc_verbs(libdir, test):
    final = perftest("rc_v,self", test, "-n", "100", "-s", "8")
    assert final.split()[1] == "100", final             # iterations done


@pytest.mark.compat("ucx")
@pytest.mark.parametrize("test", ["tag_lat", "tag_bw"])
def test_ucx_perftest_ud_verbs(libdir, test):
    final = perftest("ud_v,self", test, "-n", "100", "-s", "8")
    assert final.split()[1] == "100", final


@pytest.mark.compat("ucx")
@pytest.mark.parametrize("tls", ["rc_v,self", "ud_v,self"])
def test_ucx_perftest_asleep_between_messages(libdir, tls):
    """``ucx_perftest -E sleep``: a side whose progress finds nothing arms its CQs
    and sleeps in ``ucp_worker_wait``.  A completion that lands between that empty
    progress and the arm must wake it: the arm raises the event for completions
    queued and not yet polled (``CQ.req_notify``, as mlx5 arms at the consumer
    index).  Before it did, 3 runs of 4 of 2000 round trips slept for good, both
    sides in ``ucp_worker_wait`` with every packet delivered (2026-12-05)."""
    final = perftest(tls, "tag_lat", "-n", "2000", "-s", "8", "-E", "sleep")
    assert final.split()[1] == "2000", final


@pytest.mark.compat("ucx", faults="loss")
@pytest.mark.parametrize("tls,test,size", [
    ("rc_v,self", "tag_lat", "8"), ("rc_v,self", "ucp_put_bw", "65536"),
    ("rc_v,self", "ucp_get", "8"), ("rc_v,self", "ucp_fadd", "8"), ("ud_v,self", "tag_bw", "8"),
], ids=lambda v: str(v))
def test_ucx_perftest_with_2_percent_loss(libdir, tls, test, size):
    final = perftest(tls, test, "-n", "50", "-s", size, faults="loss=0.02")
    assert final.split()[1] == "50", final


# ---------------------------------------------------------------- Open MPI


@pytest.fixture(scope="module")
def mpi_check(tmp_path_factory):
    mpicc = need("mpicc")
    need("mpirun")
    exe = tmp_path_factory.mktemp("mpi") / "mpi_check"
    r = subprocess.run([mpicc, "-O1", "-Wall", "-Werror", "-o", str(exe),
                        str(CDIR / "mpi_check.c")], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return str(exe)


def mpirun(tmp_path: Path, np: int, tls: str, program: list[str], faults=None,
           timeout=TIMEOUT) -> tuple[str, list[dict]]:
    """``softnic exec mpirun ...``; returns the output and the counters every rank's
    softnic devices published."""
    stats = tmp_path / "stats"
    cmd, env = softnic_exec(need("mpirun"), "-np", str(np), *MPIRUN_ARGS,
                            "-x", f"UCX_TLS={tls}", "-x", "UCX_NET_DEVICES=softnic0:1",
                            *program, faults=faults,
                            extra_env={"SOFTNIC_STATS_DIR": str(stats)})
    r = run(cmd, env, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    docs = [json.loads(f.read_text()) for f in sorted(stats.glob("*.json"))]
    return out, docs


def assert_ranks_used_softnic(docs: list[dict], np: int) -> None:
    used = {d["pid"] for d in docs if d["device"] == "softnic0"
            and d["counters"].get("sent_pkts", 0) > 100 and d["counters"].get("rcvd_pkts", 0) > 100}
    assert len(used) == np, [(d["pid"], d["device"], d["counters"].get("sent_pkts")) for d in docs]


@pytest.mark.compat("openmpi")
@pytest.mark.parametrize("np,tls,top", [pytest.param(2, "rc_v,self", 1 << 20, marks=UNPRIVILEGED),
                                        (4, "rc_v,self", 4 << 20), (3, "ud_v,self", 4 << 20)],
                         ids=["2-ranks-rc", "4-ranks-rc", "3-ranks-ud"])
def test_mpi_program_every_element_checked(libdir, mpi_check, tmp_path, np, tls, top):
    out, docs = mpirun(tmp_path, np, tls, [mpi_check, str(top), "16"])
    for what in ("Sendrecv ring", "Allreduce", "Bcast", "Alltoall", "Allgather",
                 "Put (fence epoch)"):
        assert f"{what} ok up to {top} bytes, {np} ranks" in out, out
    assert "all checked" in out
    assert_ranks_used_softnic(docs, np)


@pytest.mark.compat("openmpi", faults="loss")
@pytest.mark.parametrize("tls", ["rc_v,self", "ud_v,self"])
def test_mpi_program_with_2_percent_loss(libdir, mpi_check, tmp_path, tls):
    out, docs = mpirun(tmp_path, 3, tls, [mpi_check, str(1 << 20), "32"], faults="loss=0.02",
                       timeout=240)
    assert "Put (fence epoch) ok up to 1048576 bytes, 3 ranks" in out, out
    assert "all checked" in out
    assert_ranks_used_softnic(docs, 3)
    assert sum(d["counters"].get("sent_pkts", 0) for d in docs) > 0


@pytest.mark.compat("mpi4py")
@pytest.mark.parametrize("tls", ["rc_v,self", "ud_v,self"])
def test_mpi4py_in_debian_python_every_element_checked(libdir, tmp_path, tls):
    """Debian's /usr/bin/python3 (3.11.2) with Debian's mpi4py: softnic's backend runs in
    that interpreter (one interpreter per process); mpi4py holds its lock through
    MPI_Init and finalizes MPI after the interpreter is gone, which the preload takes
    care of (MPI_Init without the lock, MPI_Finalize from a Python exit handler)."""
    need("mpirun")
    r = subprocess.run(["/usr/bin/python3", "-c", "import mpi4py"], capture_output=True,
                       timeout=TIMEOUT)
    if r.returncode:
        _missing("needs Debian's python3-mpi4py")
    out, docs = mpirun(tmp_path, 3, tls, ["/usr/bin/python3", str(CDIR / "mpi4py_check.py"),
                                         str(1 << 18), "16"])
    for what in ("Sendrecv ring", "Allreduce", "Bcast", "Alltoall", "Allgather",
                 "Put (fence epoch)"):
        assert f"{what} ok up to 262144 bytes, 3 ranks" in out, out
    assert "all checked (mpi4py" in out and "Python 3.11.2 at /usr/bin/python3" in out, out
    assert "Segmentation fault" not in out and "after this Python process's interpreter" \
        not in out, out
    assert_ranks_used_softnic(docs, 3)


@pytest.mark.compat("ucx")
def test_ucx_perftest_between_two_network_namespaces(libdir, two_hosts):
    """Two hosts (network namespaces joined by a veth pair, test_netns's fixture), one
    softnic device on each namespace's veth address: ucx_perftest over rc_verbs crosses
    the veth link, the out-of-band exchange too."""
    (ns_a, addr_a), (ns_b, addr_b) = two_hosts
    binary = need("ucx_perftest")
    port = str(free_tcp_port())
    env = dict(os.environ, UCX_TLS="rc_v,self", UCX_NET_DEVICES="softnic0:1")
    base = [sys.executable, "-m", "softnic.cli", "exec"]
    server = subprocess.Popen(["ip", "netns", "exec", ns_a, *base, "--devices",
                               f"softnic0={addr_a}", "--", binary, "-p", port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while f":{int(port):04X} 00000000:0000 0A" not in subprocess.run(
                ["ip", "netns", "exec", ns_a, "cat", "/proc/net/tcp", "/proc/net/tcp6"],
                capture_output=True, text=True, timeout=10).stdout:   # that namespace's
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ucx_perftest server did not listen:\n{server.communicate()[0]}")
            time.sleep(0.1)
        client = run(["ip", "netns", "exec", ns_b, *base, "--devices", f"softnic0={addr_b}",
                      "--", binary, addr_a, "-p", port, "-t", "tag_lat", "-n", "100", "-s",
                      "8"], env)
        sout = server.communicate(timeout=TIMEOUT)[0]
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert client.returncode == 0 and server.returncode == 0, (
        client.stdout + client.stderr + "\n--- server\n" + sout)
    final = [ln.split() for ln in client.stdout.splitlines() if ln.startswith("Final:")]
    assert final and final[0][1] == "100", client.stdout
