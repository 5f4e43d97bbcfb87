#!/usr/bin/env python3
"""softnic's data path against plain UDP, measured in one run on loopback.

Every softnic figure comes from ``softnic perf`` (server and client in two
processes, as perftest runs); every reference runs in the same invocation, so
the ratios compare like with like on a machine whose load changes:

* RDMA WRITE bandwidth, 64 KiB messages, 1 QP, MTU 4096, against C ``sockperf``
  UDP throughput with 4 KiB datagrams (``sockperf tp``; installed from Debian
  with apt-get when missing, else a small C blaster, ``tools/udp_blast.c``,
  built with gcc) and against a raw-Python UDP blast (``sendto`` in a loop, a
  second process counting what arrives);
* 8-byte WRITE latency p50 and p99 (write_lat, half the round trip, as perftest
  reports it) against a raw-Python spin-polled UDP ping-pong (half its round trip);
* WRITE goodput with 1 % of the datagrams dropped (SOFTNIC_FAULTS=loss=0.01 on
  both ends) against lossless;
* 1024 QPs (one 64 KiB WRITE in flight on each) against 1 QP;
* resident memory per idle RC QP (1024 QPs in RTS, RSS before and after);
* 8-byte SEND, READ and ATOMIC latency against WRITE's (ATOMIC's against READ's),
  on each face: perftest's ``ib_send_lat``, ``ib_read_lat``, ``ib_atomic_lat`` and
  ``ib_write_lat`` over the C face, ``softnic perf send_lat`` ... on the Python
  face, each figure as the tool prints it (a SEND or WRITE ping-pong's half round
  trip, a READ's or ATOMIC's whole one, as perftest reports them).

The comparisons run ``--repeat`` rounds, each figure next to its reference; the
best round of each counts (highest bandwidth, lowest median latency), since
the machine may be shared, and every round is listed.  It prints a markdown
table (also written to ``--out``/perf.md), the JSON of every figure
(perf.json) and a PNG of bandwidth and latency against message size
(perf.png).  A benchmark, not a test: nothing here passes or fails on time.

    python tools/perf_harness.py                  # the full run, about two minutes
    python tools/perf_harness.py --quick          # tiny sizes and counts: a smoke run
    python tools/perf_harness.py --only qps --repeat 6 --against ../other-checkout
                                        # the 1024-QP row alone, two trees alternating
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GOALS = {            # figure: (goal, comparison), the targets
    "c_write_lat_vs_py": (1.5, "<="),
    "c_write_lat_vs_py_same_loop": (None, "<="),   # beside it: the Python face in perftest's loop
    "c_pingpong_events_vs_poll": (1.5, "<="),
    "py_pingpong_events_vs_poll": (1.5, "<="),
    "c_write_bw_vs_py": (0.9, ">="),
    "c_write_bw_long_vs_py": (0.9, ">="),
    "c_send_vs_write_bw": (0.9, ">="),     # 64 KiB, each pair in one round
    "c_read_vs_write_bw": (0.9, ">="),
    "py_send_vs_write_bw": (0.9, ">="),
    "py_read_vs_write_bw": (0.9, ">="),
    "write_1m_vs_gso": (None, ">="),
    "write_8m_vs_gso": (None, ">="),
    "loss_goodput_1m": (None, ">="),
    "write_vs_sockperf": (1.0, ">="),
    "write_vs_python_blast": (1.0, ">="),
    "lat_p50_vs_python": (3.0, "<="),      # the goal; its compass keeps 1.5
    "lat_p99_vs_python": (None, "<="),
    "loss_goodput": (0.9, ">="),
    "qps_1024_vs_1": (0.8, ">="),
    "rss_per_qp_kib": (64.0, "<="),
    "c_send_lat_vs_write": (1.1, "<="),
    "c_read_lat_vs_write": (1.3, "<="),
    "c_atomic_lat_vs_read": (1.3, "<="),
    "py_send_lat_vs_write": (1.1, "<="),
    "py_read_lat_vs_write": (1.3, "<="),
    "py_atomic_lat_vs_read": (1.3, "<="),
}


def _env(extra: dict | None = None, root: Path = ROOT) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]]
                                                        if env.get("PYTHONPATH") else []))
    for k in ("SOFTNIC_FAULTS", "SOFTNIC_CAPTURE", "SOFTNIC_BACKEND", "SOFTNIC_CC",
              "SOFTNIC_TRANSPORT"):
        env.pop(k, None)
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ softnic perf

def tree_python(root: Path) -> str:
    """The interpreter that runs the softnic of the checkout ``root``: its own
    ``.venv``'s, else this one."""
    venv = root / ".venv" / "bin" / "python"
    return str(venv) if root != ROOT and venv.exists() else PY


def perf(test: str, args: list[str], env: dict | None = None, timeout: float = 300,
         root: Path = ROOT, server_counters: dict | None = None) -> dict:
    """One ``softnic perf`` run, server and client as two processes; the client's JSON.
    ``root``: the checkout whose softnic runs (this one by default); the server's
    counters go into ``server_counters`` if given.  The client starts once the
    server listens; a server that could not listen on the port chosen (taken
    between ``free_port`` and its bind) is started again on another."""
    e = _env(env, root)
    for attempt in range(3):
        port = str(free_port())
        cmd = [tree_python(root), "-m", "softnic.cli", "perf", test, "-p", port, "--json",
               "--no-progress"]
        server = subprocess.Popen(cmd + args, env=e, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=root)
        try:
            end = time.monotonic() + 60
            while not _listening(int(port)) and server.poll() is None:
                if time.monotonic() > end:
                    raise RuntimeError(f"softnic perf {test} {' '.join(args)}: the server did "
                                       f"not listen on TCP port {port} within 60 s")
                time.sleep(0.01)
            if server.poll() is not None:
                out, serr = server.communicate()
                if "cannot listen" in serr and attempt < 2:
                    continue
                raise RuntimeError(f"softnic perf {test} {' '.join(args)}: the server exited "
                                   f"({server.returncode}) before listening:\n{serr}")
            client = subprocess.run(cmd + args + ["127.0.0.1"], env=e, capture_output=True,
                                    text=True, timeout=timeout, cwd=root)
            if client.returncode != 0:
                try:
                    _, serr = server.communicate(timeout=5)
                except subprocess.TimeoutExpired:
                    serr = "(still running)"
                raise RuntimeError(f"softnic perf {test} {' '.join(args)} failed: "
                                   f"{client.stderr}\n--- server (exit {server.returncode}):"
                                   f"\n{serr}")
            return json.loads(client.stdout)
        finally:
            if server.returncode is None:
                try:
                    out, _ = server.communicate(timeout=30)
                    if server_counters is not None and out.strip():
                        server_counters.update(json.loads(out).get("counters", {}))
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.communicate()
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ references

def ensure_sockperf() -> str | None:
    """The sockperf binary: installed from Debian if missing (when we may)."""
    found = shutil.which("sockperf")
    if found:
        return found
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-q", "sockperf"], env=env,
                       capture_output=True, timeout=300)
    return shutil.which("sockperf")


def sockperf_tp(seconds: float, size: int = 4096) -> dict:
    """C sockperf UDP throughput, ``size``-byte datagrams, loopback."""
    exe = ensure_sockperf()
    port = str(free_port())
    if exe is None:
        return c_blast(seconds, size)
    srv = subprocess.Popen([exe, "sr", "-i", "127.0.0.1", "-p", port], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = subprocess.run([exe, "tp", "-i", "127.0.0.1", "-p", port, "-m", str(size),
                              "-t", str(max(1, round(seconds)))],
                             capture_output=True, text=True, timeout=seconds + 30).stdout
    finally:
        srv.terminate()
        srv.wait()
    rate = re.search(r"Message Rate is ([\d.]+) \[msg/sec\]", out)
    if not rate:
        raise RuntimeError(f"unexpected sockperf output: {out}")
    msgs = float(rate.group(1))
    return {"tool": f"sockperf tp -m {size}", "msg_rate": msgs, "bytes_per_sec": msgs * size}


def c_blast(seconds: float, size: int) -> dict:
    """No sockperf: tools/udp_blast.c (sendto in a loop; the receiver counts)."""
    src = ROOT / "tools" / "udp_blast.c"
    # built where softnic keeps what it builds (the user's own cache, or a 0700
    # directory of its own), not at a name in /tmp another user could take first
    from softnic.driver.hostfiles import cache_home
    exe = cache_home() / "udp-blast"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    port = str(free_port())
    rx = subprocess.Popen([str(exe), "rx", port, str(seconds + 1)], stdout=subprocess.PIPE,
                          text=True)
    time.sleep(0.2)
    subprocess.run([str(exe), "tx", port, str(seconds), str(size)], check=True)
    got = int(rx.communicate(timeout=seconds + 10)[0].split()[0])
    return {"tool": f"udp_blast.c {size} B", "msg_rate": got / size / seconds,
            "bytes_per_sec": got / seconds}


BLAST_RX = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("127.0.0.1", 0)); print(s.getsockname()[1], flush=True)
buf = bytearray(65536); n = 0; t0 = None; s.settimeout(2.0)
try:
    while True:
        k = s.recv_into(buf)
        if k == 1: break
        if t0 is None: t0 = time.perf_counter()
        n += k; t1 = time.perf_counter()
except socket.timeout:
    pass
print(n, t1 - t0 if t0 else 0.0, flush=True)
"""

BLAST_TX = r"""
import socket, sys, time
port, seconds, size = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
data = bytes(size); addr = ("127.0.0.1", port); send = s.sendto
end = time.perf_counter() + seconds
while time.perf_counter() < end:
    for _ in range(64):
        try: send(data, addr)
        except BlockingIOError: pass
for _ in range(20):
    s.sendto(b"x", addr); time.sleep(0.01)
"""


GRO_RX = r"""
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.setsockopt(17, 104, 1)                       # SOL_UDP, UDP_GRO: runs as one buffer
s.bind(("127.0.0.1", 0)); print(s.getsockname()[1], flush=True)
buf = bytearray(1 << 16); n = 0; t0 = None; s.settimeout(2.0); t1 = 0.0
try:
    while True:
        k = s.recv_into(buf)
        if k == 1: break
        if t0 is None: t0 = time.perf_counter()
        n += k; t1 = time.perf_counter()
except socket.timeout:
    pass
print(n, t1 - t0 if t0 else 0.0, flush=True)
"""

GSO_TX = r"""
import socket, struct, sys, time
port, seconds, size = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
n = max(1, 65000 // size)                      # datagrams per sendmsg (64 KiB at most)
data = [bytes(size * n)]; addr = ("127.0.0.1", port)
cmsg = [(17, 103, struct.pack("=H", size))]    # SOL_UDP, UDP_SEGMENT
send = s.sendmsg
end = time.perf_counter() + seconds
while time.perf_counter() < end:
    for _ in range(16):
        try: send(data, cmsg, 0, addr)
        except BlockingIOError: pass
for _ in range(20):
    s.sendto(b"x", addr); time.sleep(0.01)
"""


def python_gso_blast(seconds: float, size: int = 4096) -> dict:
    """A raw-Python UDP blast with GSO on the sending side (one ``sendmsg`` carries
    up to 64 KiB of ``size``-byte datagrams) and GRO on the receiving side (runs
    come up as one buffer): the most bytes Python moves over UDP here."""
    rx = subprocess.Popen([PY, "-c", GRO_RX], stdout=subprocess.PIPE, text=True)
    port = rx.stdout.readline().strip()
    subprocess.run([PY, "-c", GSO_TX, port, str(seconds), str(size)], check=True)
    n, dt = rx.communicate(timeout=30)[0].split()
    n, dt = int(n), float(dt)
    return {"tool": f"python sendmsg GSO/GRO {size} B", "bytes_per_sec": n / dt if dt else 0.0}


def python_blast(seconds: float, size: int = 4096) -> dict:
    """A raw-Python UDP blast: one process sends, another counts what arrives."""
    rx = subprocess.Popen([PY, "-c", BLAST_RX], stdout=subprocess.PIPE, text=True)
    port = rx.stdout.readline().strip()
    subprocess.run([PY, "-c", BLAST_TX, port, str(seconds), str(size)], check=True)
    n, dt = rx.communicate(timeout=30)[0].split()
    n, dt = int(n), float(dt)
    return {"tool": f"python sendto {size} B", "bytes_per_sec": n / dt if dt else 0.0,
            "msg_rate": n / size / dt if dt else 0.0}


PONG = r"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0)); s.setblocking(False); print(s.getsockname()[1], flush=True)
recv, send = s.recvfrom, s.sendto
while True:
    try:
        d, a = recv(2048)
    except BlockingIOError:
        continue
    if d == b"q":
        break
    send(d, a)
"""


def python_pingpong(count: int, size: int = 8) -> dict:
    """Raw-Python UDP ping-pong, both ends spin on non-blocking sockets; half RTT."""
    srv = subprocess.Popen([PY, "-c", PONG], stdout=subprocess.PIPE, text=True)
    port = int(srv.stdout.readline())
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.setblocking(False)
    addr = ("127.0.0.1", port)
    msg = bytes(size)
    times = []
    try:
        for i in range(count + 100):
            t = time.perf_counter()
            c.sendto(msg, addr)
            while True:
                try:
                    c.recvfrom(2048)
                    break
                except BlockingIOError:
                    pass
            if i >= 100:
                times.append(time.perf_counter() - t)
    finally:
        c.sendto(b"q", addr)
        srv.wait(timeout=10)
        c.close()
    xs = sorted(t / 2 * 1e6 for t in times)
    return {"tool": f"python spin ping-pong {size} B", "t_typical_us": statistics.median(xs),
            "t_99_us": xs[min(len(xs) - 1, int(0.99 * len(xs)))]}


# ------------------------------------------------------------------ the C face

def _listening(port: int) -> bool:
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


def cface(binary: str, args: list[str], timeout: float = 300, env: dict | None = None
          ) -> tuple[str, str]:
    """An unmodified C verbs program (perftest, ibverbs-utils) as server and client
    through ``softnic exec`` over 127.0.0.1: both outputs."""
    exe = shutil.which(binary)
    if exe is None:
        raise RuntimeError(f"{binary} is not installed (Debian: perftest / ibverbs-utils)")
    port = str(free_port())
    cmd = [PY, "-m", "softnic.cli", "exec", "--", exe, *args, "-p", port]
    e = _env(env)
    server = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        end = time.monotonic() + 30
        while not _listening(int(port)):
            if server.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"{binary} server did not listen: "
                                   f"{server.communicate(timeout=5)[0]}")
            time.sleep(0.02)
        client = subprocess.run(cmd + ["127.0.0.1"], env=e, capture_output=True, text=True,
                                timeout=timeout)
        sout = server.communicate(timeout=timeout)[0]
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    if client.returncode or server.returncode:
        raise RuntimeError(f"{binary} {' '.join(args)} failed:\n{client.stdout}{client.stderr}"
                           f"\n--- server\n{sout}")
    return client.stdout, sout


def py_pingpong(iters: int, size: int, events: bool) -> dict:
    """tools/pyverbs_pingpong.py, the Python face's ibv_rc_pingpong (``-e``: blocked
    in ``CompChannel.get_cq_event``), as server and client."""
    port = str(free_port())
    cmd = [PY, str(ROOT / "tools" / "pyverbs_pingpong.py"), "-n", str(iters), "-s", str(size),
           "-p", port] + (["-e"] if events else [])
    e = _env()
    server = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        end = time.monotonic() + 30
        while not _listening(int(port)):
            if server.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"pyverbs_pingpong server did not listen: "
                                   f"{server.communicate(timeout=5)[0]}")
            time.sleep(0.02)
        client = subprocess.run(cmd + ["127.0.0.1"], env=e, capture_output=True, text=True,
                                timeout=300)
        server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    m = re.search(r"(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter", client.stdout)
    if client.returncode or not m:
        raise RuntimeError(f"pyverbs_pingpong failed: {client.stdout}{client.stderr}")
    return {"tool": "tools/pyverbs_pingpong.py" + (" -e" if events else ""),
            "usec_per_iter": float(m.group(3))}


def _perftest_row(out: str, size: int) -> list[str]:
    for ln in out.splitlines():
        f = ln.split()
        if f and f[0] == str(size) and len(f) >= 4:
            return f
    raise RuntimeError(f"no {size}-byte row in:\n{out}")


def c_write_lat(size: int, iters: int) -> dict:
    """perftest ``ib_write_lat -x 0`` over softnic's libibverbs.  Its loop posts a
    WRITE, polls for that WRITE's completion and then spins on memory for the peer's:
    the peer's WRITE leaves with the ACK the poll waits for, so that poll mostly
    takes both (``SOFTNIC_TIMELINE``: 97 of 2080 steps the progress thread's,
    docs/performance.md, "Answers received compiled")."""
    return c_lat("ib_write_lat", size, iters)


def c_lat(binary: str, size: int, iters: int) -> dict:
    """perftest's latency test ``binary`` (ib_write_lat, ib_send_lat, ib_read_lat,
    ib_atomic_lat, whose operand is always 8 bytes) with ``-x 0`` over softnic's
    libibverbs, ``t_typical`` and the 99th percentile as it prints them."""
    args = ["-x", "0", "-n", str(iters)]
    if binary != "ib_atomic_lat":
        args += ["-s", str(size)]
    out, _ = cface(binary, args)
    f = _perftest_row(out, size)       # bytes iters t_min t_max t_typical t_avg t_stdev 99% 99.9%
    return {"tool": f"{binary} {' '.join(args)}", "t_typical_us": float(f[4]),
            "t_99_us": float(f[7])}


def c_write_bw(size: int, iters: int, mtu: int = 4096) -> dict:
    return c_bw("write", size, iters, mtu)


def c_bw(op: str, size: int, iters: int, mtu: int = 4096) -> dict:
    """perftest ``ib_<op>_bw -x 0`` (op: write, send, read) over softnic's libibverbs."""
    out, _ = cface(f"ib_{op}_bw", ["-x", "0", "-s", str(size), "-n", str(iters),
                                   "-m", str(mtu)])
    f = _perftest_row(out, size)       # bytes iters BW_peak BW_average MsgRate (MB/s = 2**20)
    return {"tool": f"ib_{op}_bw -x 0 -s {size} -m {mtu}",
            "bytes_per_sec": float(f[3]) * (1 << 20)}


def c_rc_pingpong(iters: int, size: int, events: bool) -> dict:
    """``ibv_rc_pingpong -g 0`` (``-e``: sleeping on the completion channel)."""
    args = ["-g", "0", "-n", str(iters), "-s", str(size)] + (["-e"] if events else [])
    out, _ = cface("ibv_rc_pingpong", args)
    m = re.search(r"(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter", out)
    if not m:
        raise RuntimeError(f"unexpected ibv_rc_pingpong output: {out}")
    return {"tool": "ibv_rc_pingpong -g 0" + (" -e" if events else ""),
            "usec_per_iter": float(m.group(3))}


RSS_PROBE = r"""
import gc, json, os, sys
import verbs_api.enums as e
from verbs_api.addr import AHAttr, GlobalRoute
from verbs_api.cq import CQ
from verbs_api.device import Context
from verbs_api.pd import PD
from verbs_api.qp import QP, QPAttr, QPCap, QPInitAttr
n = int(sys.argv[1])
def rss():
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
ctx = Context(name="softnic0"); pd = PD(ctx); cq = CQ(ctx, 256)
cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
def make():
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap), QPAttr(port_num=1))
    a = QPAttr(port_num=1, path_mtu=e.IBV_MTU_4096)
    a.dest_qp_num = 1000 + len(qps); a.rq_psn = 0; a.sq_psn = 0; a.timeout = 14
    a.retry_cnt = 7; a.rnr_retry = 7; a.max_rd_atomic = 1; a.max_dest_rd_atomic = 1
    a.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
    a.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid="::ffff:127.0.0.99",
                                                               sgid_index=0))
    qp.to_rts(a)
    qps.append(qp)
qps = []
for _ in range(16): make()               # warm every code path first
before = rss()
for _ in range(n): make()
after = rss()
print(json.dumps({"qps": n, "rss_before": before, "rss_after": after,
                  "bytes_per_qp": (after - before) / n}))
ctx.close()
"""


def rss_per_qp(n: int) -> dict:
    out = subprocess.run([PY, "-c", RSS_PROBE, str(n)], env=_env(), capture_output=True,
                         text=True, timeout=120)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the run

def ratio_row(name, what, ours, ref, ratio, key):
    goal, cmp = GOALS[key]
    if goal is None:
        met = ""
    else:
        met = "yes" if (ratio >= goal if cmp == ">=" else ratio <= goal) else "no"
    g = "" if goal is None else f"{cmp} {goal:g}"
    if key == "lat_p50_vs_python":
        g += " (compass 1.5)"
    return {"figure": name, "softnic": ours, "reference": ref, "ratio": ratio,
            "goal": g, "met": met, "what": what, "key": key}


def run(args) -> dict:
    q = args.quick
    secs = 1.0 if q else args.seconds
    big = 65536
    n_bw = 200 if q else args.iters
    from softnic.cli.doctor import libpython_shared
    res: dict = {"python": sys.version.split()[0], "python_full": sys.version,
                 "python_build": "libpython shared" if libpython_shared()
                 else "statically linked",
                 "executable": sys.executable, "machine": os.uname().nodename,
                 "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                  time.gmtime()),
                 "load_start": os.getloadavg()}
    step = _stepper(args)
    rounds = []
    nq = 32 if q else 1024
    n_lat = 300 if q else args.pings
    per = -(-n_bw // nq)          # WRITEs per QP: about the bytes of the 1-QP figure
    for k in range(1 if q else args.repeat):
        # every figure and its reference once per round, side by side; the best of
        # the rounds counts (the machine is shared: a round can lose its CPU)
        r: dict = {}
        step(f"round {k + 1}: C sockperf UDP 4 KiB")
        r["sockperf"] = sockperf_tp(secs)
        step(f"round {k + 1}: raw-Python UDP blast 4 KiB")
        r["python_blast"] = python_blast(0.5 if q else secs)
        step(f"round {k + 1}: softnic write_bw 64 KiB, 1 QP, MTU 4096")
        wr = perf("write_bw", ["-s", str(big), "-n", str(n_bw), "-m", "4096", "-t", "16"])
        r["write_bw"], r["write_bw_counters"] = wr["results"][0], wr["counters"]
        res["data_path"] = wr.get("data_path", "?")
        step(f"round {k + 1}: raw-Python spin UDP ping-pong 8 B")
        r["python_pingpong"] = python_pingpong(n_lat)
        step(f"round {k + 1}: softnic write_lat 8 B")
        r["write_lat"] = perf("write_lat", ["-s", "8", "-n", str(n_lat), "-m", "4096"]
                              )["results"][0]
        step(f"round {k + 1}: softnic write_bw 64 KiB with 1 % loss")
        lossy = perf("write_bw", ["-s", str(big), "-n", str(n_bw), "-m", "4096", "-t", "16",
                                  "-u", str(args.loss_timeout)],
                     env={"SOFTNIC_FAULTS": "loss=0.01", "SOFTNIC_SEED": str(7 + k),
                          "SOFTNIC_RECOVERY": args.loss_recovery})
        r["write_bw_loss"], r["write_bw_loss_counters"] = lossy["results"][0], lossy["counters"]
        step(f"round {k + 1}: softnic write_bw 64 KiB on {nq} QPs")
        many = perf("write_bw", ["-s", str(big), "-n", str(per), "-m", "4096", "-t", "1",
                                 "-q", str(nq)])
        r["write_bw_many"], r["write_bw_many_counters"] = many["results"][0], many["counters"]
        rounds.append(r)
    res["rounds"] = rounds
    step_c_face(args, res, step)
    step_opcode_latency(args, res, step)

    def best(key, field, low=False):
        pick = (min if low else max)(rounds, key=lambda r: r[key][field])
        return pick

    for key in ("sockperf", "python_blast", "write_bw", "write_bw_loss", "write_bw_many"):
        b = best(key, "bytes_per_sec")
        res[key] = b[key]
        if key + "_counters" in b:
            res[key + "_counters"] = b[key + "_counters"]
    for key in ("python_pingpong", "write_lat"):
        res[key] = best(key, "t_typical_us", low=True)[key]
    step("resident memory per idle RC QP")
    res["rss"] = rss_per_qp(64 if q else 1024)
    step("size sweep (write_bw, write_lat)")
    top = 12 if q else 23
    sweep_args = ["-a", "-m", "4096", "--max-bytes", str(1 << 14 if q else args.sweep_bytes)]
    res["sweep_bw"] = perf("write_bw", sweep_args + ["-n", "50" if q else "2000", "-t", "16"]
                           )["results"]
    res["sweep_lat"] = perf("write_lat", sweep_args + ["-n", "20" if q else "200"])["results"]
    res["sweep_bw"] = [r for r in res["sweep_bw"] if r["bytes"] <= 1 << top]
    res["sweep_lat"] = [r for r in res["sweep_lat"] if r["bytes"] <= 1 << top]

    w = res["write_bw"]["bytes_per_sec"]
    rows = [
        ratio_row("WRITE 64 KiB, 1 QP, MTU 4096 vs C sockperf UDP 4 KiB", "MB/s",
                  w / 1e6, res["sockperf"]["bytes_per_sec"] / 1e6,
                  w / res["sockperf"]["bytes_per_sec"], "write_vs_sockperf"),
        ratio_row("WRITE 64 KiB vs raw-Python UDP blast 4 KiB", "MB/s", w / 1e6,
                  res["python_blast"]["bytes_per_sec"] / 1e6,
                  w / res["python_blast"]["bytes_per_sec"], "write_vs_python_blast"),
        ratio_row("8 B WRITE latency p50 vs Python spin UDP ping-pong", "us (one way)",
                  res["write_lat"]["t_typical_us"], res["python_pingpong"]["t_typical_us"],
                  res["write_lat"]["t_typical_us"] / res["python_pingpong"]["t_typical_us"],
                  "lat_p50_vs_python"),
        ratio_row("8 B WRITE latency p99 vs Python spin UDP ping-pong", "us (one way)",
                  res["write_lat"]["t_99_us"], res["python_pingpong"]["t_99_us"],
                  res["write_lat"]["t_99_us"] / res["python_pingpong"]["t_99_us"],
                  "lat_p99_vs_python"),
        ratio_row("WRITE 64 KiB goodput, 1 % loss vs lossless", "MB/s",
                  res["write_bw_loss"]["bytes_per_sec"] / 1e6, w / 1e6,
                  res["write_bw_loss"]["bytes_per_sec"] / w, "loss_goodput"),
        ratio_row(f"WRITE 64 KiB on {nq} QPs vs 1 QP", "MB/s",
                  res["write_bw_many"]["bytes_per_sec"] / 1e6, w / 1e6,
                  res["write_bw_many"]["bytes_per_sec"] / w, "qps_1024_vs_1"),
        ratio_row("resident memory per idle RC QP", "KiB", res["rss"]["bytes_per_qp"] / 1024,
                  64.0, res["rss"]["bytes_per_qp"] / 1024, "rss_per_qp_kib"),
    ]
    res["table"] = rows + res["c_rows"] + res["lat_rows"]
    res["load_end"] = os.getloadavg()
    res["paired"] = paired(rounds)
    return res


WAKES = ("progress_wake_timer", "progress_wake_datagram", "progress_wake_bell",
         "progress_wake_held")


def qps_pair(root: Path, nq: int, n_one: int, per: int) -> dict:
    """The many-QP figure and its 1-QP reference on the checkout ``root``, back to
    back, each with both sides' counters."""
    big = "65536"
    out: dict = {}
    for key, flags in (("write_bw", ["-s", big, "-n", str(n_one), "-m", "4096", "-t", "16"]),
                       ("write_bw_many", ["-s", big, "-n", str(per), "-m", "4096", "-t", "1",
                                          "-q", str(nq)])):
        srv: dict = {}
        r = perf("write_bw", flags, root=root, server_counters=srv)
        out[key], out[key + "_counters"], out[key + "_server_counters"] = (
            r["results"][0], r["counters"], srv)
    return out


def per_write(pair: dict, key: str) -> dict:
    """What one WRITE of the figure ``key`` cost in counts: ACKs (and other
    datagrams) the requester received, progress-thread wake-ups of each side,
    retransmitted packets."""
    r = pair[key]
    n = r["iterations"] * r["qps"]
    c, s = pair[key + "_counters"], pair[key + "_server_counters"]
    return {"acks_received": c.get("rcvd_pkts", 0) / n,
            "requester_wakeups": sum(c.get(k, 0) for k in WAKES) / n,
            "responder_wakeups": sum(s.get(k, 0) for k in WAKES) / n,
            "retransmitted": c.get("retransmitted_pkts", 0) / n}


def run_qps(args) -> dict:
    """``--only qps``: the 1024-QP row alone, ``--repeat`` rounds, each round's own
    ratio; with ``--against``, the same figures on that checkout in each round too,
    the two trees in alternating order."""
    q = args.quick
    nq = 32 if q else 1024
    n_one = 200 if q else args.iters
    per = -(-n_one // nq)
    trees = [str(ROOT)] + ([str(Path(args.against).resolve())] if args.against else [])
    step = _stepper(args)
    res: dict = {"python": sys.version.split()[0], "started": time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "load_start": os.getloadavg(),
        "qps": nq, "trees": trees, "rounds": []}
    for k in range(args.repeat):
        r = {}
        for t in (trees if k % 2 == 0 else trees[::-1]):
            step(f"round {k + 1}: write_bw 64 KiB, 1 QP and {nq} QPs, {t}")
            r[t] = qps_pair(Path(t), nq, n_one, per)
        res["rounds"].append(r)
    res["load_end"] = os.getloadavg()
    lines = [f"WRITE 64 KiB on {nq} QPs against 1 QP, {res['started']}, Python "
             f"{res['python']}, {len(res['rounds'])} round(s); load average "
             f"{_load(res['load_start'])} at the start, {_load(res['load_end'])} at the end", "",
             "| round | tree | 1 QP MB/s | many MB/s | ratio | ACKs/WRITE 1 QP | many | "
             "wake-ups/WRITE requester, responder: 1 QP | many | retransmitted/WRITE many |",
             "|---:|---|---:|---:|---:|---:|---:|---|---|---:|"]
    ratios: dict = {t: [] for t in trees}
    for i, r in enumerate(res["rounds"]):
        for t in trees:
            pr = r[t]
            one, many = (pr[k]["bytes_per_sec"] for k in ("write_bw", "write_bw_many"))
            a, b = per_write(pr, "write_bw"), per_write(pr, "write_bw_many")
            ratios[t].append(many / one)
            lines.append(f"| {i + 1} | {t} | {one / 1e6:.1f} | {many / 1e6:.1f} | "
                         f"{many / one:.2f} | {a['acks_received']:.2f} | "
                         f"{b['acks_received']:.2f} | {a['requester_wakeups']:.2f}, "
                         f"{a['responder_wakeups']:.2f} | {b['requester_wakeups']:.2f}, "
                         f"{b['responder_wakeups']:.2f} | {b['retransmitted']:.2f} |")
    res["paired"] = {t: statistics.median(v) for t, v in ratios.items()}
    lines.append("")
    lines += [f"paired (each round's own ratio, median of {len(v)}): {t} "
              f"{res['paired'][t]:.2f}" for t, v in ratios.items()]
    res["markdown"] = "\n".join(lines) + "\n"
    return res


def step_c_face(args, res: dict, step) -> None:
    """The progress figures: each C program and its Python twin side by side,
    in alternating order, for ``--repeat`` rounds, and the long WRITEs against
    their references (a GSO/GRO blast; lossless for the lossy 1 MiB run); each
    row's ratio is the median of its rounds' own ratios (figures: the median of
    each side)."""
    q = args.quick
    n_lat = 200 if q else args.pings
    n_pp = 100 if q else args.pings // 2
    n_bw = 200 if q else args.iters
    big = [1 << 20] if q else [1 << 20, 8 << 20]
    pairs: dict[str, list] = {k: [] for k in GOALS if k in (
        "c_write_lat_vs_py", "c_write_lat_vs_py_same_loop", "c_pingpong_events_vs_poll",
        "py_pingpong_events_vs_poll",
        "c_write_bw_vs_py", "c_write_bw_long_vs_py", "write_1m_vs_gso", "write_8m_vs_gso",
        "loss_goodput_1m", "c_send_vs_write_bw", "c_read_vs_write_bw", "py_send_vs_write_bw",
        "py_read_vs_write_bw")}
    for k in range(1 if q else args.repeat):
        flip = k % 2 == 1
        step(f"C face round {k + 1}: ib_write_lat -x 0 -s 2 / softnic perf write_lat -s 2 "
             "(and --poll-each)")
        # perftest's loop takes each WRITE's completion before it waits for the peer's
        # WRITE; the Python face's write_lat waits for the peer's only, unless
        # --poll-each: that row compares the faces over the same loop
        runs = [lambda: c_write_lat(2, n_lat),
                lambda: perf("write_lat", ["-s", "2", "-n", str(n_lat)])["results"][0],
                lambda: perf("write_lat", ["-s", "2", "-n", str(n_lat), "--poll-each"]
                             )["results"][0]]
        a, b, c = _alternating(runs, flip)
        pairs["c_write_lat_vs_py"].append((a["t_typical_us"], b["t_typical_us"]))
        pairs["c_write_lat_vs_py_same_loop"].append((a["t_typical_us"], c["t_typical_us"]))
        step(f"C face round {k + 1}: ibv_rc_pingpong -g 0 -e / polling")
        a, b = _alternating([lambda: c_rc_pingpong(n_pp, 4096, True),
                             lambda: c_rc_pingpong(n_pp, 4096, False)], flip)
        pairs["c_pingpong_events_vs_poll"].append((a["usec_per_iter"], b["usec_per_iter"]))
        step(f"C face round {k + 1}: pyverbs_pingpong -e / polling (Python face)")
        a, b = _alternating([lambda: py_pingpong(n_pp, 4096, True),
                             lambda: py_pingpong(n_pp, 4096, False)], flip)
        pairs["py_pingpong_events_vs_poll"].append((a["usec_per_iter"], b["usec_per_iter"]))
        step(f"C face round {k + 1}: ib_write_bw -x 0 -s 65536 -m 4096 / softnic perf write_bw")
        a, b = _alternating([lambda: c_write_bw(65536, n_bw),
                             lambda: perf("write_bw", ["-s", "65536", "-n", str(n_bw), "-m", "4096"]
                                          )["results"][0]], flip)
        pairs["c_write_bw_vs_py"].append((a["bytes_per_sec"], b["bytes_per_sec"]))
        # the same pair for a second or more each: on 2 CPUs the kernel often runs the two
        # processes of a pair on one CPU for the first 50 ms or so of a run (pinned apart
        # with taskset, perftest's 300-WRITE runs went 465-570 -> 1086-1143 MB/s), which
        # decides much of a 0.2 s run, more often for the C face than for the Python one
        n_long = n_bw if q else max(n_bw, 20000)
        step(f"C face round {k + 1}: the same, {n_long} WRITEs")
        a, b = _alternating([lambda: c_write_bw(65536, n_long),
                             lambda: perf("write_bw", ["-s", "65536", "-n", str(n_long), "-m",
                                                       "4096"])["results"][0]], flip)
        pairs["c_write_bw_long_vs_py"].append((a["bytes_per_sec"], b["bytes_per_sec"]))
        # every opcode at WRITE's speed: SEND and READ against WRITE, 64 KiB, in one
        # round (the order turned each round), on each face; as many messages as the
        # long WRITE row, for the same reason (at 2000 messages, 0.1-0.2 s a run, the
        # Python face's send_bw read 700-1372 MB/s in six runs whose peak rates were
        # all 1.36-1.49 GB/s: the slow runs started on one CPU)
        for face in ("c", "py"):
            step(f"{face} face round {k + 1}: 64 KiB WRITE / SEND / READ bandwidth, "
                 f"{n_long} of each")
            if face == "c":
                one = lambda op: c_bw(op, 65536, n_long)                     # noqa: E731
            else:
                one = lambda op: perf(f"{op}_bw", ["-s", "65536", "-n", str(n_long),  # noqa: E731
                                                   "-m", "4096"])["results"][0]
            ops = ["write", "send", "read"]
            got = {op: one(op)["bytes_per_sec"] for op in (ops[::-1] if flip else ops)}
            for op in ("send", "read"):
                pairs[f"{face}_{op}_vs_write_bw"].append((got[op], got["write"]))
        for size, key in zip(big, ("write_1m_vs_gso", "write_8m_vs_gso")):
            step(f"C face round {k + 1}: WRITE {size >> 10} KiB / raw-Python GSO/GRO blast")
            # eight times the 64 KiB rows' bytes (1.5 GB at the default count, about
            # half a second): 23 WRITEs of 8 MiB took some 70 ms, which the first
            # milliseconds of a run (the window filling, the threads waking) decided,
            # and varied 1.6 to 3.2 GB/s from run to run
            n = max(8, (n_bw * 65536 * 8) // size)
            a, b = _alternating([lambda: perf("write_bw", ["-s", str(size), "-n", str(n), "-m",
                                                           "4096", "-t", "4"])["results"][0],
                                 lambda: python_gso_blast(0.5 if q else args.seconds)], flip)
            pairs[key].append((a["bytes_per_sec"], b["bytes_per_sec"]))
        step(f"round {k + 1}: WRITE 1 MiB with 1 % loss / lossless (selective repeat)")
        # the 64 KiB loss row's flags; a long WRITE's MIDDLEs beyond a hole take the
        # receive stream, where a 64 KiB WRITE's come in one run
        n = max(8, (n_bw * 65536 * 4) // (1 << 20))
        flags = ["-s", str(1 << 20), "-n", str(n), "-m", "4096", "-t", "16",
                 "-u", str(args.loss_timeout)]
        a, b = _alternating([lambda: perf("write_bw", flags, env={
                                 "SOFTNIC_FAULTS": "loss=0.01", "SOFTNIC_SEED": str(7 + k),
                                 "SOFTNIC_RECOVERY": args.loss_recovery})["results"][0],
                             lambda: perf("write_bw", flags, env={
                                 "SOFTNIC_RECOVERY": args.loss_recovery})["results"][0]], flip)
        pairs["loss_goodput_1m"].append((a["bytes_per_sec"], b["bytes_per_sec"]))
    res["c_face_rounds"] = pairs
    names = {
        "c_write_lat_vs_py": ("2 B WRITE latency: C ib_write_lat -x 0 (spins on memory) vs "
                              "Python face softnic perf write_lat", "us (one way)", 1),
        "c_write_lat_vs_py_same_loop": ("the same, the Python face in perftest's loop "
                                        "(write_lat --poll-each: each WRITE's completion "
                                        "taken before the peer's WRITE)", "us (one way)", 1),
        "c_pingpong_events_vs_poll": ("ibv_rc_pingpong -g 0 -e (completion channel) vs "
                                      "polling, 4 KiB", "us/iter", 1),
        "py_pingpong_events_vs_poll": ("pyverbs ping-pong in get_cq_event vs polling, 4 KiB "
                                       "(tools/pyverbs_pingpong.py)", "us/iter", 1),
        "c_write_bw_vs_py": ("ib_write_bw -x 0 -s 65536 -m 4096 vs softnic perf write_bw, "
                             "same flags", "MB/s", 1e-6),
        "c_write_bw_long_vs_py": ("the same, 20000 WRITEs each (about a second)", "MB/s",
                                  1e-6),
        "write_1m_vs_gso": ("WRITE 1 MiB vs raw-Python UDP blast with GSO/GRO", "MB/s", 1e-6),
        "write_8m_vs_gso": ("WRITE 8 MiB vs raw-Python UDP blast with GSO/GRO", "MB/s", 1e-6),
        "loss_goodput_1m": ("WRITE 1 MiB goodput, 1 % loss vs lossless (selective repeat)",
                            "MB/s", 1e-6),
        "c_send_vs_write_bw": ("ib_send_bw vs ib_write_bw -x 0 -s 65536 -m 4096, 20000 of "
                               "each", "MB/s", 1e-6),
        "c_read_vs_write_bw": ("ib_read_bw vs ib_write_bw -x 0 -s 65536 -m 4096, 20000 of "
                               "each", "MB/s", 1e-6),
        "py_send_vs_write_bw": ("softnic perf send_bw vs write_bw -s 65536 -m 4096, 20000 of "
                                "each (Python face)", "MB/s", 1e-6),
        "py_read_vs_write_bw": ("softnic perf read_bw vs write_bw -s 65536 -m 4096, 20000 of "
                                "each (Python face)", "MB/s", 1e-6),
    }
    rows = []
    for key, got in pairs.items():
        if not got:
            continue
        name, unit, scale = names[key]
        ours = statistics.median(x for x, _ in got) * scale
        ref = statistics.median(y for _, y in got) * scale
        ratio = statistics.median(x / y for x, y in got)
        rows.append(ratio_row(name, unit, ours, ref, ratio, key))
    res["c_rows"] = rows


#: the opcode latency rows: key -> (the test, the test it is compared with)
OPCODE_LATENCY = {"send_lat_vs_write": ("send_lat", "write_lat"),
                  "read_lat_vs_write": ("read_lat", "write_lat"),
                  "atomic_lat_vs_read": ("atomic_lat", "read_lat")}


def step_opcode_latency(args, res: dict, step) -> None:
    """8 B SEND, READ and ATOMIC latency against WRITE's (ATOMIC's against READ's) on
    both faces: each round runs the four tests of a face back to back (reversed
    every other round), and each row's ratio is the median of its rounds' own
    ratios (figures: the median of each side)."""
    q = args.quick
    n = 200 if q else args.pings
    tests = ("write_lat", "send_lat", "read_lat", "atomic_lat")
    faces = {"c": lambda t: c_lat("ib_" + t, 8, n),
             "py": lambda t: perf(t, ["-s", "8", "-n", str(n)])["results"][0]}
    rounds: dict[str, list] = {"c": [], "py": []}
    for k in range(1 if q else args.repeat):
        for face, run in faces.items():
            order = tests[::-1] if k % 2 else tests
            step(f"opcode latency round {k + 1}, {'C' if face == 'c' else 'Python'} face: "
                 + ", ".join(order))
            rounds[face].append({t: run(t)["t_typical_us"] for t in order})
    res["opcode_latency_rounds"] = rounds
    rows = []
    for face, got in rounds.items():
        who = "C perftest ib_" if face == "c" else "Python face softnic perf "
        for key, (test, ref) in OPCODE_LATENCY.items():
            rows.append(ratio_row(
                f"8 B {test.split('_')[0].upper()} latency vs {ref.split('_')[0].upper()}: "
                f"{who}{test} / {ref.split('_')[0]}_lat", "us", statistics.median(
                    r[test] for r in got), statistics.median(r[ref] for r in got),
                statistics.median(r[test] / r[ref] for r in got), f"{face}_{key}"))
    res["lat_rows"] = rows


def _alternating(runs: list, flip: bool) -> tuple:
    """Run the measurements in the given order or, with ``flip``, the reverse one;
    results in the given order."""
    order = range(len(runs) - 1, -1, -1) if flip else range(len(runs))
    got = {i: runs[i]() for i in order}
    return tuple(got[i] for i in range(len(runs)))


def paired(rounds: list[dict]) -> dict:
    """Each ratio within one round (figure and reference measured side by side),
    the median over the rounds: steadier on a shared machine than best against
    best, where the two bests may come from different rounds."""
    def med(f):
        return statistics.median(f(r) for r in rounds)
    bw = lambda r, k: r[k]["bytes_per_sec"]        # noqa: E731
    return {
        "write_vs_sockperf": med(lambda r: bw(r, "write_bw") / bw(r, "sockperf")),
        "lat_p50_vs_python": med(lambda r: r["write_lat"]["t_typical_us"]
                                 / r["python_pingpong"]["t_typical_us"]),
        "loss_goodput": med(lambda r: bw(r, "write_bw_loss") / bw(r, "write_bw")),
        "qps_1024_vs_1": med(lambda r: bw(r, "write_bw_many") / bw(r, "write_bw")),
    }


def _stepper(args):
    t0 = time.monotonic()

    def step(what):
        print(f"[{time.monotonic() - t0:6.1f} s] {what}", file=sys.stderr, flush=True)
    return step


def markdown(res: dict) -> str:
    lines = [f"softnic perf harness, {res['started']}, Python {res['python']} "
             f"({res['executable']}, {res.get('python_build', 'build not recorded')}), "
             f"{res['cpus']} CPUs, loopback, best of "
             f"{len(res['rounds'])} round(s); per-packet loops: {res.get('data_path', '?')}; "
             f"load average (1, 5, 15 min) {_load(res['load_start'])} at the start, "
             f"{_load(res['load_end'])} at the end",
             "",
             "The first rows take each side's best round; the C-face and progress rows "
             "below them (C program against its Python twin, events against polling, "
             "large WRITEs against the GSO/GRO blast) take the median of each round's "
             "own ratio, the two sides run back to back in alternating order.",
             "",
             "| figure | unit | softnic | reference | ratio | goal | met |",
             "|---|---|---:|---:|---:|---|---|"]
    for r in res["table"]:
        lines.append(f"| {r['figure']} | {r['what']} | {r['softnic']:.1f} | "
                     f"{r['reference']:.1f} | {r['ratio']:.2f} | {r['goal']} | {r['met']} |")
    c = res["write_bw_loss_counters"]
    lines += ["", f"references: {res['sockperf']['tool']}, {res['python_blast']['tool']}, "
              f"{res['python_pingpong']['tool']}; the RSS row's reference is the 64 KiB goal.",
              f"with loss: {c.get('fault_dropped_loss', 0)} datagrams dropped, "
              f"{c.get('retransmitted_pkts', 0)} retransmitted, {c.get('timeouts', 0)} timeouts.",
              "", "every round (MB/s; latency p50 in us):", "",
              "| round | sockperf | Python blast | WRITE 1 QP | WRITE 1 % loss | WRITE many QPs "
              "| Python ping-pong | WRITE 8 B |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(res["rounds"]):
        lines.append(f"| {i + 1} | {r['sockperf']['bytes_per_sec'] / 1e6:.1f} | "
                     f"{r['python_blast']['bytes_per_sec'] / 1e6:.1f} | "
                     f"{r['write_bw']['bytes_per_sec'] / 1e6:.1f} | "
                     f"{r['write_bw_loss']['bytes_per_sec'] / 1e6:.1f} | "
                     f"{r['write_bw_many']['bytes_per_sec'] / 1e6:.1f} | "
                     f"{r['python_pingpong']['t_typical_us']:.1f} | "
                     f"{r['write_lat']['t_typical_us']:.1f} |")
    pr = res.get("paired")
    if pr:
        lines += ["", f"paired (each round's own ratio, median of {len(res['rounds'])}): "
                  f"WRITE / sockperf {pr['write_vs_sockperf']:.2f}, latency / ping-pong "
                  f"{pr['lat_p50_vs_python']:.2f}, 1 % loss / lossless {pr['loss_goodput']:.2f}, "
                  f"many QPs / 1 QP {pr['qps_1024_vs_1']:.2f}."]
    lines += ["", "| bytes | WRITE MB/s (1 QP) | WRITE latency p50 us | p99 us |",
              "|---:|---:|---:|---:|"]
    lat = {r["bytes"]: r for r in res["sweep_lat"]}
    for r in res["sweep_bw"]:
        lt = lat.get(r["bytes"], {})
        lines.append(f"| {r['bytes']} | {r['bytes_per_sec'] / 1e6:.2f} | "
                     f"{lt.get('t_typical_us', float('nan')):.1f} | "
                     f"{lt.get('t_99_us', float('nan')):.1f} |")
    return "\n".join(lines) + "\n"


DOC_BEGIN = "<!-- perf_harness: begin -->"
DOC_END = "<!-- perf_harness: end -->"


def write_doc(path: Path, md: str) -> None:
    """Replace what stands between the markers of ``path`` with this run's table
    (the markers are added at the end if the file has none)."""
    text = path.read_text() if path.exists() else ""
    block = f"{DOC_BEGIN}\n{md}{DOC_END}"
    if DOC_BEGIN in text and DOC_END in text:
        head, rest = text.split(DOC_BEGIN, 1)
        text = head + block + rest.split(DOC_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def _load(t) -> str:
    return ", ".join(f"{x:.2f}" for x in t)


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [r["bytes"] for r in res["sweep_bw"]]
    a.plot(xs, [r["bytes_per_sec"] / 1e6 for r in res["sweep_bw"]], "o-",
           label="softnic RDMA WRITE (1 QP)")
    a.axhline(res["sockperf"]["bytes_per_sec"] / 1e6, color="tab:red", ls="--",
              label=f"{res['sockperf']['tool']}")
    a.axhline(res["python_blast"]["bytes_per_sec"] / 1e6, color="tab:green", ls=":",
              label=res["python_blast"]["tool"])
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("message size (bytes)")
    a.set_ylabel("MB/s")
    a.set_title("bandwidth, MTU 4096, loopback")
    a.legend(fontsize=8)
    lx = [r["bytes"] for r in res["sweep_lat"]]
    b.plot(lx, [r["t_typical_us"] for r in res["sweep_lat"]], "o-", label="softnic WRITE p50")
    b.plot(lx, [r["t_99_us"] for r in res["sweep_lat"]], "x:", label="softnic WRITE p99")
    b.axhline(res["python_pingpong"]["t_typical_us"], color="tab:green", ls=":",
              label="Python UDP ping-pong p50 (8 B)")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("message size (bytes)")
    b.set_ylabel("one-way latency (us)")
    b.set_title("latency (write_lat, half round trip)")
    b.legend(fontsize=8)
    fig.suptitle(f"softnic perf, Python {res['python']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes and counts (a smoke run)")
    p.add_argument("--out", default="perf-results", help="directory for perf.md/json/png")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds of each UDP reference")
    p.add_argument("--iters", type=int, default=3000, help="64 KiB WRITEs per bandwidth figure")
    p.add_argument("--pings", type=int, default=2000, help="round trips per latency figure")
    p.add_argument("--sweep-bytes", type=int, default=32 << 20,
                   help="bytes per size in the sweep (iterations are capped by it)")
    p.add_argument("--repeat", type=int, default=2,
                   help="rounds of the comparisons; each figure's best round counts")
    p.add_argument("--loss-timeout", type=int, default=11,
                   help="QP timeout attribute of the lossy run (4.096 us * 2**t)")
    p.add_argument("--loss-recovery", choices=("gbn", "sr"), default="sr",
                   help="loss recovery of the lossy run")
    p.add_argument("--only", choices=("qps",), default=None,
                   help="run one figure alone: qps, WRITE 64 KiB on 1024 QPs against 1 QP "
                        "(--iters, --repeat), with each side's counts per WRITE")
    p.add_argument("--against", default=None, metavar="TREE",
                   help="with --only: the same figures on the checkout TREE (run by its "
                        ".venv's Python) in every round, alternating with this one")
    p.add_argument("--doc", default=None, metavar="MD",
                   help="also put the table in this markdown file, between its "
                        f"'{DOC_BEGIN}' and '{DOC_END}' lines (e.g. docs/performance.md)")
    args = p.parse_args(argv)
    if args.against and not args.only:
        p.error("--against needs --only")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only:
        res = run_qps(args)
        (out / f"{args.only}.json").write_text(json.dumps(res, indent=1))
        print(res["markdown"])
        print(f"wrote {out / (args.only + '.json')}")
        return 0
    res = run(args)
    md = markdown(res)
    (out / "perf.md").write_text(md)
    (out / "perf.json").write_text(json.dumps(res, indent=1))
    plot(res, out / "perf.png")
    if args.doc:
        write_doc(Path(args.doc), md)
    print(md)
    print(f"wrote {out / 'perf.md'}, {out / 'perf.json'}, {out / 'perf.png'}")
    gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
