"""Unmodified C verbs programs on softnic's libibverbs.so.1 (cffi embedding).

Debian's ibverbs-utils and perftest binaries run as two processes through
``softnic exec``; our own C programs (tests/c) check every byte and the error
statuses; a pyverbs program and a C program talk to each other.  Needs gcc,
libibverbs-dev, ibverbs-utils and perftest: skipped where they are missing,
failed under CI=true (.ci/run installs them).  Every subprocess has a timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CDIR = HERE / "c"
SOFTNIC = [sys.executable, "-m", "softnic.cli"]
TIMEOUT = 60


def _missing(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (.ci/run installs it; CI must run the libibverbs tests)")
    pytest.skip(why)


def need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        _missing(f"needs {binary} (Debian: ibverbs-utils / perftest)")
    return path


def need_face(face: str) -> None:
    """``face`` (softnic.faces.availability.FACES) can be built here, or the test skips
    (fails under CI=true) saying what is missing and what installs it."""
    from softnic.faces.availability import face_status
    st = face_status()[face]
    if not st.ok:
        _missing(f"softnic's {face} face cannot be built here: {st.reason} ({st.install})")


@pytest.fixture(scope="module")
def libdir():
    from softnic.faces.libibverbs.build import BuildError, build
    need_face("libibverbs")
    try:
        return build()
    except BuildError as e:
        _missing(str(e))


def softnic_exec(*args, faults=None, devices=None, extra_env=None, **kw):
    cmd = [*SOFTNIC, "exec"]
    if faults:
        cmd += ["--faults", faults, "--seed", "7"]
    if devices:
        cmd += ["--devices", devices]
    env = dict(os.environ, **(extra_env or {}))
    return cmd + ["--", *args], env


def run(*args, timeout=TIMEOUT, **kw) -> subprocess.CompletedProcess:
    cmd, env = softnic_exec(*args, **kw)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[1].endswith(f":{port:04X}") and f[3] == "0A":
                return True
    return False


def pair(binary: str, args: list[str], faults=None, timeout=TIMEOUT, extra_env=None):
    """Server and client of ``binary`` (both with ``args``) over 127.0.0.1; returns both
    CompletedProcess-like results.  The exchange port is a free one, so runs in
    parallel do not meet."""
    port = free_tcp_port()
    port_opt = ["-p", str(port)]
    scmd, env = softnic_exec(binary, *args, *port_opt, faults=faults, extra_env=extra_env)
    server = subprocess.Popen(scmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + 20
        while not listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                out = server.communicate(timeout=5)[0]
                pytest.fail(f"{binary} server did not listen (exit {server.returncode}):\n{out}")
            time.sleep(0.05)
        client = run(binary, *args, *port_opt, "127.0.0.1", faults=faults, timeout=timeout,
                     extra_env=extra_env)
        sout = server.communicate(timeout=timeout)[0]
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert client.returncode == 0 and server.returncode == 0, (
        f"{binary} {' '.join(args)}: client exit {client.returncode}, server exit "
        f"{server.returncode}\n--- client\n{client.stdout}{client.stderr}\n--- server\n{sout}")
    return client.stdout, sout


# ---------------------------------------------------------------- ibverbs-utils


@pytest.mark.unprivileged
@pytest.mark.compat("ibverbs-utils")
def test_devices_and_devinfo(libdir):
    need("ibv_devices")
    r = run("ibv_devices", devices="2")
    assert r.returncode == 0, r.stderr
    assert "softnic0" in r.stdout and "softnic1" in r.stdout
    r = run(need("ibv_devinfo"), "-v", devices="1")
    assert r.returncode == 0, r.stderr
    for want in ("hca_id:\tsoftnic0", "PORT_ACTIVE (4)", "link_layer:\t\tEthernet",
                 "atomic_cap:\t\t\tATOMIC_HCA (1)", "GID[  0]:\t\t::ffff:127.", "RoCE v2",
                 # the default line rate, 100 Gbit/s, as a 100 GbE port reports it
                 "active_width:\t\t4X (2)", "active_speed:\t\t25.0 Gbps (32)"):
        assert want in r.stdout, (want, r.stdout)


@pytest.mark.unprivileged
@pytest.mark.compat("ibverbs-utils")
@pytest.mark.parametrize("gbps,width,speed", [("25", "1X (1)", "25.0 Gbps (32)"),
                                              ("200", "4X (2)", "50.0 Gbps (64)"),
                                              ("0.5", "1X (1)", "2.5 Gbps (1)")])
def test_devinfo_port_speed_follows_the_line_rate(libdir, gbps, width, speed):
    """SOFTNIC_LINK_GBPS sets the port's active width and speed as Linux maps an
    Ethernet port's line rate (25 Gbit/s: 1X EDR; 200: 4X HDR; below 1: 1X SDR)."""
    r = run(need("ibv_devinfo"), "-v", devices="1", extra_env={"SOFTNIC_LINK_GBPS": gbps})
    assert r.returncode == 0, r.stderr
    assert f"active_width:\t\t{width}" in r.stdout, r.stdout
    assert f"active_speed:\t\t{speed}" in r.stdout, r.stdout


@pytest.mark.unprivileged
def test_exec_reaches_the_whole_process_tree_unless_told_not_to(libdir, tmp_path):
    """Every program softnic exec starts, and their children, get softnic's libibverbs
    directory on LD_LIBRARY_PATH and its preload on LD_PRELOAD (a shell script, which
    links nothing, included); --no-libibverbs leaves both alone."""
    from softnic.faces.libibverbs.launch import links_libibverbs
    assert links_libibverbs(need("ibv_devinfo"))
    assert not links_libibverbs(sys.executable)
    assert not links_libibverbs(str(tmp_path / "nothing-here"))
    script = tmp_path / "tree.sh"
    script.write_text('#!/bin/sh\nsh -c \'echo "LDP=$LD_LIBRARY_PATH"; echo "PRE=$LD_PRELOAD"\'\n')
    script.chmod(0o755)
    r = run(str(script), extra_env={"LD_LIBRARY_PATH": "/opt/x", "LD_PRELOAD": ""})
    assert r.returncode == 0, r.stderr
    ldp = next(ln[4:] for ln in r.stdout.splitlines() if ln.startswith("LDP=")).split(":")
    assert str(libdir) in ldp and ldp[-1] == "/opt/x", r.stdout    # softnic's first, then ours
    assert f"PRE={libdir}/libsoftnic_preload.so" in r.stdout, r.stdout
    cmd, env = softnic_exec(str(script), extra_env={"LD_LIBRARY_PATH": "/opt/x"})
    cmd.insert(cmd.index("exec") + 1, "--no-libibverbs")
    env.pop("LD_PRELOAD", None)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert "LDP=/opt/x\n" in r.stdout and "PRE=\n" in r.stdout, r.stdout


# Under loss this needs the linger of ibv_destroy_qp (docs/libibverbs.md): without it a
# lost final ACK leaves one side retransmitting to a peer that has exited, until its
# retry_cnt runs out and a SEND whose data arrived fails with RETRY_EXC_ERR.
@pytest.mark.unprivileged
@pytest.mark.compat("ibverbs-utils")
@pytest.mark.parametrize("args,faults", [
    (["-n", "20"], None),
    (["-n", "20", "-e", "-s", "1"], "loss=0.05"),
], ids=["poll", "events-1B-loss"])
def test_rc_pingpong(libdir, args, faults):
    binary = need("ibv_rc_pingpong")
    cout, sout = pair(binary, ["-g", "0", *args], faults=faults)
    iters = args[args.index("-n") + 1]
    for out in (cout, sout):
        assert f"{iters} iters in" in out, out
        assert "GID ::ffff:127." in out


@pytest.mark.compat("ibverbs-utils")
@pytest.mark.parametrize("spin_us", [20000, 0], ids=["spin", "no-spin"])
def test_rc_pingpong_events_busy_poll_before_they_sleep(libdir, tmp_path, spin_us):
    """``ibv_rc_pingpong -e``: each side sleeps in ``ibv_get_cq_event`` for the peer's
    answer, and first looks at the socket without sleeping for
    ``SOFTNIC_PROGRESS_SPIN_US`` (shim.c's ``sn_cq_wait``), so an answer that lands
    meanwhile wakes no sleeping thread.  With a spin longer than any answer takes
    here (20 ms) the waiters find datagrams while spinning
    (``waiter_spin_datagram``); with none they never do."""
    binary = need("ibv_rc_pingpong")
    stats = tmp_path / "stats"
    pair(binary, ["-g", "0", "-n", "50", "-e"],
         extra_env={"SOFTNIC_PROGRESS_SPIN_US": str(spin_us), "SOFTNIC_STATS_DIR": str(stats)})
    found = []
    for f in sorted(stats.glob("*.json")):
        c = json.loads(f.read_text())
        c = c.get("counters", c)
        if c.get("rcvd_pkts"):
            found.append(c["waiter_spin_datagram"])
    assert len(found) == 2, found                  # the two programs' devices
    if spin_us:
        assert min(found) >= 25, found               # 50 answers each, or their ACKs
    else:
        assert found == [0, 0]


@pytest.mark.compat("ibverbs-utils")
def test_rc_pingpong_timeline(libdir, tmp_path):
    """``SOFTNIC_TIMELINE``: both programs' calls into softnic and their devices'
    steps, posts and flushes are written when the devices close, and
    ``softnic timeline`` sums them (docs/performance.md, "Where a live run's time
    goes")."""
    from softnic.driver.timeline import read, summary
    binary = need("ibv_rc_pingpong")
    tl = tmp_path / "tl"
    pair(binary, ["-g", "0", "-n", "30"], extra_env={"SOFTNIC_TIMELINE": str(tl)})
    by_pid = read([tl])
    assert len(by_pid) == 2                        # the two programs
    for events in by_pid.values():
        rows = {r.what: r for r in summary(events)}
        assert rows["call sn_poll_cq"].count >= 30
        assert rows["call sn_post_send_list"].count >= 30
        assert "call sn_post_recv_list" in rows
        posts = sum(r.count for w, r in rows.items() if w.startswith("post"))
        assert posts == rows["call sn_post_send_list"].count
        steps = [e for e in events if e.kind == "step"]
        assert sum(int(e.fields[1]) for e in steps) >= 30   # each of the peer's SENDs
    r = subprocess.run([sys.executable, "-m", "softnic.cli", "timeline", str(tl)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "call sn_poll_cq" in r.stdout, r.stderr


@pytest.mark.unprivileged
@pytest.mark.compat("perftest")
def test_ib_write_bw(libdir):
    binary = need("ib_write_bw")
    cout, sout = pair(binary, ["-x", "0", "-n", "20", "-s", "65536"], faults="loss=0.02")
    row = [ln.split() for ln in cout.splitlines() if ln.strip().startswith("65536")]
    assert row and row[0][1] == "20", cout          # bytes, iterations, peak, average, rate
    assert float(row[0][3]) > 0


@pytest.mark.compat("perftest")
@pytest.mark.parametrize("tool", ["ib_send_bw", "ib_read_bw"])
def test_ib_send_and_read_bw(libdir, tool):
    """64 KiB SENDs and READs (their MIDDLEs the kernel's, built in runs and placed
    straight into the receive or READ buffer), under 2 % loss."""
    binary = need(tool)
    cout, sout = pair(binary, ["-x", "0", "-n", "20", "-s", "65536"], faults="loss=0.02")
    row = [ln.split() for ln in cout.splitlines() if ln.strip().startswith("65536")]
    assert row and row[0][1] == "20", cout          # bytes, iterations, peak, average, rate
    assert float(row[0][3]) > 0


@pytest.mark.parametrize("op", ["send", "write"])
def test_cface_loop_tool_runs(libdir, op, capsys):
    """tools/cface_loop.py (docs/performance.md quotes it): messages between two
    devices of one process through the C face, each completed on both sides, the
    last one's bytes where they were sent (the program checks both), and a CPU
    time per message printed."""
    need("gcc")
    path = CDIR.parent.parent / "tools" / "cface_loop.py"
    spec = importlib.util.spec_from_file_location("cface_loop", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--op", op, "-n", "50", "-s", "5000"]) == 0
    out = capsys.readouterr().out
    m = re.search(rf": {op} 5000 B: cpu ([\d.]+) us, wall ([\d.]+) us per message", out)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, out


# ---------------------------------------------------------------- our C programs


def compile_c(name: str, tmp_path: Path) -> str:
    if shutil.which("gcc") is None:
        _missing("needs gcc")
    exe = tmp_path / name
    r = subprocess.run(["gcc", "-O1", "-Wall", "-Werror", "-o", str(exe), str(CDIR / f"{name}.c"),
                        "-libverbs"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return str(exe)


@pytest.mark.parametrize("faults", [None, "loss=0.03"])
def test_c_datacheck_every_byte(libdir, tmp_path, faults):
    exe = compile_c("datacheck", tmp_path)
    r = run(exe, *(["--lossy"] if faults else []), faults=faults)
    assert r.returncode == 0, r.stdout + r.stderr
    wants = ["RC classic verbs: ok", "RC extended verbs (ibv_qp_ex, ibv_cq_ex): ok", "SRQ: ok",
             "completion channel (poll()ed fd): ok", "all bytes checked"]
    if not faults:
        wants += ["UC: ok", "UD: ok"]
    for want in wants:
        assert want in r.stdout, r.stdout


def test_c_wc_errors_leave_memory_untouched(libdir, tmp_path):
    r = run(compile_c("wc_errors", tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("memory untouched") == 9, r.stdout
    assert "all statuses as expected" in r.stdout


def test_c_chain_with_a_bad_wr_posts_those_before_it(libdir, tmp_path):
    """tests/c/post_chain.c: chains of 40 work requests, longer than one call of the
    C face posts at a time, with a bad one beyond the first call: the error, bad_wr
    the first WR refused, the WRs before it posted and none after it (mlx5's rule),
    for ibv_post_recv, ibv_post_srq_recv and ibv_post_send (too many SGEs: EINVAL for a
    receive, ENOMEM for a send, as mlx5's ``mlx5_post_recv`` and ``_mlx5_post_send``); and a WR of 2^20 SGEs over
    a list of one that ends at an unmapped page, refused without a read past it."""
    r = run(compile_c("post_chain", tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    for want in ["ibv_post_recv: a bad WR at 35 of 40 refused with EINVAL",
                 "ibv_post_srq_recv: a bad WR at 35 of 40 refused with EINVAL",
                 "ibv_post_send: a bad WR at 33 of 40 refused with ENOMEM",
                 "2^20 SGEs over a list of one: refused unread (recv EINVAL, srq EINVAL, "
                 "send ENOMEM)", "all chains: ok"]:
        assert want in r.stdout, r.stdout


def test_c_a_held_post_leaves_without_the_next_call(libdir, tmp_path):
    """tests/c/post_held.c: a spinner (it polled its CQ) with a WRITE outstanding posts
    another, whose output the device holds for the program's next call
    (``NIC.post``), and then spins on memory without calling: the held WRITE still
    lands, sent by the progress thread, without a retransmission (every datagram is
    delayed 5 ms, the retransmission timeout is about 4 s); the device's
    ``posts_held`` counts the held post."""
    exe = compile_c("post_held", tmp_path)
    stats = tmp_path / "stats"
    r = run(exe, faults="delay=5ms", extra_env={"SOFTNIC_STATS_DIR": str(stats)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the held WRITE landed after" in r.stdout and "all checks: ok" in r.stdout, r.stdout
    files = sorted(stats.glob("*-softnic0.json"))
    assert files, list(stats.iterdir())
    c = json.loads(files[-1].read_text())["counters"]
    assert c["posts_held"] >= 1, c
    assert c.get("timeouts", 0) == 0 and c.get("retransmitted_pkts", 0) == 0, c


@pytest.mark.unprivileged
@pytest.mark.compat("pyverbs-softnic")
def test_pyverbs_program_and_c_program_are_peers(libdir, tmp_path):
    exe = compile_c("datacheck", tmp_path)
    r = run(sys.executable, str(CDIR / "pypeer.py"), *SOFTNIC, "exec", exe, "--peer")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all checked" in r.stdout


# ---------------------------------------------------------------- loading, waits, every pointer


def test_every_reachable_pointer_works_or_fails_with_eopnotsupp(libdir, tmp_path):
    r = run(compile_c("ops_walk", tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "wr_atomic_write                          wr_complete: EOPNOTSUPP" in r.stdout
    # a QP that asks for ATOMIC_WRITE gets it (as rxe); one that did not, fails the builder
    assert "create_qp_ex(WITH_ATOMIC_WRITE)          works" in r.stdout
    assert "all 154 pointers answered" in r.stdout, r.stdout


def _compile_loading(tmp_path: Path, linked: bool) -> str:
    if shutil.which("gcc") is None:
        _missing("needs gcc")
    exe = tmp_path / ("loading-linked" if linked else "loading-dl")
    cmd = ["gcc", "-O1", "-Wall", "-Werror", "-o", str(exe), str(CDIR / "loading.c"), "-ldl"]
    if linked:
        cmd[1:1] = ["-DLINKED"]
        cmd.append("-libverbs")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return str(exe)


def test_dlopen_rtld_local_from_a_program_that_does_not_link_it(libdir, tmp_path):
    """As UCX's libuct_ib loads it: the embedded interpreter's extension modules must
    still find libpython's symbols."""
    r = run(_compile_loading(tmp_path, linked=False), "dlopen", devices="2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dlopen(RTLD_LOCAL): 2 devices, first softnic0: ok" in r.stdout
    assert "open, PD, MR: ok" in r.stdout


def test_fork_after_first_verbs_call_gives_the_child_a_clear_error(libdir, tmp_path):
    r = run(_compile_loading(tmp_path, linked=True), "fork", timeout=40)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "child: clear error after fork (ibv_open_device errno 5" in r.stdout, r.stdout
    assert "forked after its parent's first verbs call" in r.stderr
    assert "parent: verbs still work after fork: ok" in r.stdout


RDMA_CORE_TESTS = Path("/usr/share/doc/rdma-core/tests")


def rdma_core_tests(tmp_path: Path) -> Path:
    """Debian ships rdma-core's pyverbs tests compressed: a runnable copy."""
    import gzip
    if not Path("/usr/bin/python3").exists() or not (RDMA_CORE_TESTS / "run_tests.py").exists():
        _missing("needs Debian's python3-pyverbs and its tests (rdma-core)")
    r = subprocess.run(["/usr/bin/python3", "-c", "import pyverbs.device"], capture_output=True,
                       timeout=TIMEOUT)
    if r.returncode:
        _missing("needs Debian's python3-pyverbs")
    dest = tmp_path / "tests"
    shutil.copytree(RDMA_CORE_TESTS, dest)
    for gz in dest.glob("*.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
    return dest


@pytest.mark.unprivileged
@pytest.mark.compat("pyverbs-debian")
def test_debian_pyverbs_in_debian_python_single_thread_owning_both_ends(libdir, tmp_path):
    """Debian's /usr/bin/python3 (3.11.2) with Debian's real pyverbs over softnic's
    libibverbs: the host interpreter runs softnic's backend (one interpreter), and
    ibv_get_cq_event releases its lock while waiting, so rdma-core's single-threaded
    test_cq_events_rc (both QPs in one thread) completes; test_qp_ex_rc_atomic_write
    passes (ATOMIC_WRITE, as rxe).  ``-E``: the real pyverbs, not softnic's."""
    tests = rdma_core_tests(tmp_path)
    names = ["test_cq_events.CqEventsTestCase.test_cq_events_rc",
             "test_cq_events.CqEventsTestCase.test_cq_events_ud",
             "test_qpex.QpExTestCase.test_qp_ex_rc_atomic_write",
             "test_qpex.QpExTestCase.test_qp_ex_rc_send_imm",
             "test_cqex.CqExTestCase.test_rc_traffic_cq_ex"]
    # a hang is killed with SIGABRT first, so faulthandler prints every thread's stack
    cmd, env = softnic_exec("timeout", "-s", "ABRT", "100", "/usr/bin/python3", "-X",
                            "faulthandler", "-E", str(tests / "run_tests.py"), "-v", *names)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tests)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "test_cq_events_rc (tests.test_cq_events.CqEventsTestCase.test_cq_events_rc) ... ok" \
        in out, out
    assert "test_qp_ex_rc_atomic_write (tests.test_qpex.QpExTestCase." \
        "test_qp_ex_rc_atomic_write) ... ok" in out, out
    assert f"Ran {len(names)} tests" in out


def test_c_flush_through_the_extended_post_api(libdir, tmp_path):
    """tests/c/flush.c: ibv_wr_flush as rdma-core 45 lays it out (the builder after
    wr_atomic_write), against the 44 headers installed here; on the wire (tshark's BTH,
    scapy's UDP) each FLUSH is opcode 28 with its FETH (selectivity level, placement type)
    before the RETH, answered by an empty RDMA READ RESPONSE ONLY (opcode 16)."""
    cap = tmp_path / "flush.pcap"
    r = run(compile_c("flush", tmp_path), extra_env={"SOFTNIC_CAPTURE": str(cap)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "flush: all checks passed" in r.stdout
    if shutil.which("tshark") is None:
        _missing("needs tshark (Debian: tshark)")
    sent = tmp_path / "flush-softnic0.pcap"
    got = subprocess.run(["tshark", "-r", str(sent), "-d", "udp.port==4791,infiniband",
                          "-T", "fields", "-e", "infiniband.bth.opcode",
                          "-e", "infiniband.bth.psn"],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert got.returncode == 0, got.stderr
    # three FLUSHes (range, region, persistent), each PSN once however often a
    # retransmission timer on a busy host sent it again
    flushes = {line.split()[1] for line in got.stdout.splitlines()
               if line.split()[:1] == ["28"]}
    assert len(flushes) == 3, got.stdout
    from scapy.all import UDP, rdpcap
    feths = {}
    for p in rdpcap(str(sent)):
        if UDP in p and bytes(p[UDP].payload)[0] == 0x1C:
            payload = bytes(p[UDP].payload)
            feths.setdefault(payload[9:12], payload[12:16])     # by the BTH's PSN
    # bits 5:4 the selectivity level, 3:0 the placement type
    assert [int.from_bytes(f, "big") for f in feths.values()] == [0x01, 0x11, 0x02]
    back = subprocess.run(["tshark", "-r", str(tmp_path / "flush-softnic1.pcap"), "-d",
                           "udp.port==4791,infiniband", "-T", "fields", "-e",
                           "infiniband.bth.opcode"],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert back.stdout.split().count("16") >= 2, back.stdout   # the two that succeeded


def test_c_import_device_and_dm(libdir, tmp_path):
    """tests/c/imports.c: ibv_import_device from a dup of a context's command fd, the
    imported DM reading what the original wrote, EINVAL for a DM handle that is none,
    EOPNOTSUPP for an fd that is no context's, EBADF for -1, EBUSY freeing a DM while an
    import of it lives, and the imported context closing its fd.  ibv_import_pd and
    ibv_import_mr: a QP of the imported context on the imported PD WRITEs from the
    imported MR's lkey into an MR of the original PD; a handle of a context that does not
    share the command file is ENOENT, one of another kind EINVAL."""
    r = run(compile_c("imports", tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    for want in ("import_pd, import_mr: a WRITE through the imported PD and MR",
                 "foreign handle: ENOENT; another kind: EINVAL", "imports: all checks passed"):
        assert want in r.stdout, r.stdout


def test_c_a_thread_blocked_in_ibv_get_cq_event(libdir, tmp_path):
    """tests/c/cq_wait.c: a thread blocked in ibv_get_cq_event on a blocking channel
    gets its events, a signal ends its wait with EINTR only where the handler was
    installed without SA_RESTART (the kernel's read() of the channel), and a thread
    cancelled while it waits gives the device's lease back (a WRITE lands with
    nobody calling; the waiter's lease is 60 s here, and one the cancelled thread
    kept would leave the WRITE to the progress thread's wake-up to publish its
    counters, once a second: the second of two such WRITEs, which starts just
    after the first landed, would take most of a second; the bound below is half
    that).  And the waiter sleeps on the
    device's socket and takes what arrives itself: b's progress thread hardly ever
    wakes for a datagram (it took every one, a lease's lapse after each, when the
    waiter slept on the channel alone)."""
    exe = compile_c("cq_wait", tmp_path)
    stats = tmp_path / "stats"
    r = run(exe, extra_env={"SOFTNIC_WAITER_LEASE_S": "60", "SOFTNIC_STATS_DIR": str(stats)})
    assert r.returncode == 0, r.stdout + r.stderr
    for want in ["events on a blocking channel: ok", "without SA_RESTART: EINTR: ok",
                 "with SA_RESTART: the wait goes on: ok", "a waiter cancelled: the device goes on: ok",
                 "all checks: ok"]:
        assert want in r.stdout, r.stdout
    landed = [float(x) for x in re.findall(r"the WRITE landed after ([\d.]+) ms", r.stdout)]
    assert len(landed) == 2 and max(landed) < 500, r.stdout
    files = sorted(stats.glob("*-softnic1.json"))
    assert files, list(stats.iterdir())
    c = json.loads(files[-1].read_text())
    c = c.get("counters", c)
    assert c["rcvd_pkts"] >= 40
    assert c["progress_wake_datagram"] < 20, c      # 40 SENDs, each waited for


def test_c_polls_of_one_device(libdir, tmp_path):
    """tests/c/fastpoll.c, on one device (an empty poll may then be answered
    without entering Python: shim.c's sn_cq_idle): completions made while the
    program spins are found (a WRITE WITH IMM received, an error completion of
    the retransmission timer), the event of a SEND that arrives while the program,
    after an armed CQ's empty poll, waits on the channel's fd (every datagram
    leaves 2 ms late, from the progress thread, and a spinner's lease is 5 s
    here), a CQ armed once and then spun on (20 000 empty polls, then a SEND's
    receive and its event), the event of a SEND that arrives while the program,
    having armed the CQ with no poll since (its lease fresh), waits on the fd (as
    UCX's ``ucp_worker_wait`` does: the lease must not keep the SEND from the
    progress thread; told apart on two devices, where the SEND comes from the
    other device's thread: with one device this program passes either way), and
    an overflowed CQ reports it.  (That an armed CQ's
    empty poll gives the lease back is not told apart here: with the poll answered
    in C ignoring the armed flag, this program still passes, the progress thread's
    wake-ups for the delayed send and its timers taking the SEND.  That only the
    first poll after an arm does is: ``_fastpoll``'s count of calls into
    ``NIC.poll``.)"""
    _fastpoll(tmp_path, [])


def test_c_polls_of_two_devices(libdir, tmp_path):
    """tests/c/fastpoll.c with its second QP on a second device of the process:
    the same cases, and an empty poll there is answered without entering Python
    as well (shim.c's sn_cq_idle looks at every open device's socket, deadline
    and held output, as sn_poll_cq's empty poll moves the other devices along)."""
    _fastpoll(tmp_path, ["two"])


def _fastpoll(tmp_path, args):
    """tests/c/fastpoll.c's checks, and its 20 000 empty polls of each of two CQs
    and 20 000 of a CQ armed once, answered in C: each device counts fewer calls
    into ``NIC.poll`` (``inline_polls``) than 10 000 (about 340 with one
    device and 1770 with two, on 2026-12-03; every empty poll entered Python on
    each device when a second device was open: 58 460; and every poll of an armed
    CQ did, the first after the arm or not, before 2026-12-05).  The program's
    later phases enter Python while something is on the way, more often with a
    device beside."""
    exe = compile_c("fastpoll", tmp_path)
    stats = tmp_path / "stats"
    r = run(exe, *args, faults="delay=2ms",
            extra_env={"SOFTNIC_SPIN_LEASE_US": "5000000", "SOFTNIC_STATS_DIR": str(stats)})
    assert r.returncode == 0, r.stdout + r.stderr
    for want in ["empty polls: ok", "completions found while spinning: ok",
                 "an armed CQ's empty poll: ok", "a CQ armed once, spun on: ok",
                 "an arm, then a sleep on the fd: ok",
                 "an error completion from the timer: ok", "all checks: ok"]:
        assert want in r.stdout, r.stdout
    assert re.search(r"an overflowed CQ: -\d+: ok", r.stdout), r.stdout
    names = ["softnic0", "softnic1"] if args else ["softnic0"]
    for name in names:
        files = sorted(stats.glob(f"*-{name}.json"))
        assert files, list(stats.iterdir())
        c = json.loads(files[-1].read_text())
        c = c.get("counters", c)
        assert c["inline_polls"] < 10000, (name, c)
