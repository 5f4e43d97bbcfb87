"""UCX and Open MPI on softnic next to what a user without RDMA would pick instead.

    python tools/middleware_bench.py [--rounds 3] [--quick]

* ucx_perftest (two processes on 127.0.0.1): tag_lat 8 B, tag_bw 64 KiB and
  ucp_put_bw 64 KiB over softnic's rc_verbs (UCX_TLS=rc_v,self) and over UCX's tcp
  transport on loopback (UCX_TLS=tcp,self, UCX_NET_DEVICES=lo), the two alternating
  round by round; medians and the softnic/tcp ratio of each round's pair.  Each
  bandwidth run moves 512 MiB (64 MiB with --quick).
* ucx_perftest tag_bw (UCX's tag protocol: eager SENDs, rendezvous by RDMA READ)
  against ucp_put_bw (RDMA WRITE), both over softnic's rc_verbs, at 64 KiB and
  1 MiB, alternating round by round (goal: tag_bw >= 0.8 of ucp_put_bw).
* MPI_Allreduce time per size (tests/c/mpi_check.c --time-allreduce, 2 ranks) with
  Open MPI's pml ucx over softnic's rc_verbs next to Open MPI's ob1 with btl tcp,
  each size timed for a quarter of a second at least (goal: from 64 KiB up,
  softnic's time <= 8x tcp's).

Prints tables (markdown) with the date, the load and the Python the library runs in.
Needs ucx-utils, openmpi-bin, libopenmpi-dev and what softnic's libibverbs needs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOFTNIC = [sys.executable, "-m", "softnic.cli", "exec", "--"]
#: figure -> (goal, comparison): the issue's targets
GOALS = {"tag_bw_vs_put_bw": (0.8, ">="), "allreduce_vs_tcp": (8.0, "<=")}
#: MPI_Allreduce sizes from which the allreduce goal applies (bytes)
ALLREDUCE_GOAL_FROM = 65536
#: the least time each MPI_Allreduce size is timed for (seconds), on either side
ALLREDUCE_SECONDS = 0.25
MPI_ARGS = ["--allow-run-as-root", "--oversubscribe", "-np", "2"]
SOFTNIC_MPI = ["--mca", "pml", "ucx", "--mca", "pml_ucx_devices", "any", "--mca", "btl", "self",
               "--mca", "osc", "ucx", "--mca", "mtl", "^ofi", "-x", "UCX_TLS=rc_v,self",
               "-x", "UCX_NET_DEVICES=softnic0:1"]
TCP_MPI = ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "mtl", "^ofi",
           "--mca", "btl_tcp_if_include", "lo"]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perftest(softnic: bool, test: str, size: int, iters: int) -> tuple[float, float]:
    """(average latency us, average bandwidth MB/s) of one ucx_perftest run."""
    env = _env()
    if softnic:
        env.update(UCX_TLS="rc_v,self", UCX_NET_DEVICES="softnic0:1")
        pre = SOFTNIC
    else:
        env.update(UCX_TLS="tcp,self", UCX_NET_DEVICES="lo")
        pre = []
    port = str(_free_port())
    server = subprocess.Popen(pre + ["ucx_perftest", "-p", port], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)
        r = subprocess.run(pre + ["ucx_perftest", "127.0.0.1", "-p", port, "-t", test, "-s",
                                  str(size), "-n", str(iters)], env=env, capture_output=True,
                           text=True, timeout=300)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    final = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("Final:")]
    if r.returncode or not final:
        raise RuntimeError(f"ucx_perftest {test} failed:\n{r.stdout}\n{r.stderr}")
    f = final[0]          # Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall
    return float(f[3]), float(f[5])


def allreduce_times(exe: str, softnic: bool, top: int, iters: int,
                    seconds: float) -> dict[int, float]:
    cmd = (SOFTNIC if softnic else []) + ["mpirun", *MPI_ARGS,
                                          *(SOFTNIC_MPI if softnic else TCP_MPI),
                                          exe, "--time-allreduce", str(top), str(iters),
                                          str(seconds)]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise RuntimeError(f"mpirun failed:\n{r.stdout}\n{r.stderr}")
    out = {}
    for ln in r.stdout.splitlines():
        p = ln.split()
        if len(p) == 3 and p[0] == "allreduce":
            out[int(p[1])] = float(p[2])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer iterations and sizes")
    ap.add_argument("--ucx-only", action="store_true", help="the ucx_perftest tables only")
    args = ap.parse_args(argv)
    iters = 200 if args.quick else 1000
    # Each bandwidth run moves this much: a run of 100 messages of 64 KiB (what
    # iters // 10 gave) or 20 of 1 MiB timed UCX's start more than its rate
    # (ucp_put_bw 64 KiB 400 to 870 MB/s from run to run; 820 to 1150 at 20 000)
    volume = (64 if args.quick else 512) << 20

    def bw_iters(size: int) -> int:
        return max(50, volume // size)
    print(f"date {datetime.date.today()}  load {os.getloadavg()[0]:.2f} (1 min)  "
          f"Python {platform.python_version()} ({sys.executable})  host {platform.node()}")
    # (UCX sizes its protocols by the port's reported speed, this line rate)
    print(f"softnic line rate {os.environ.get('SOFTNIC_LINK_GBPS', '100')} Gbit/s "
          f"(SOFTNIC_LINK_GBPS)")

    cases = [("tag_lat", 8, "latency us"), ("tag_bw", 65536, "MB/s"),
             ("ucp_put_bw", 65536, "MB/s")]
    rows = []
    for test, size, unit in cases:
        sn, tcp, ratios = [], [], []
        n = iters if test == "tag_lat" else bw_iters(size)
        for _ in range(args.rounds):             # alternate: both sides see the same load
            a = perftest(True, test, size, n)
            b = perftest(False, test, size, n)
            pick = 0 if unit.startswith("latency") else 1
            sn.append(a[pick])
            tcp.append(b[pick])
            ratios.append(a[pick] / b[pick])
        rows.append((test, size, unit, statistics.median(sn), statistics.median(tcp),
                     statistics.median(ratios)))
    print("\n| ucx_perftest | size | unit | softnic rc_verbs | UCX tcp (lo) | softnic/tcp |")
    print("|---|---|---|---|---|---|")
    for test, size, unit, a, b, ratio in rows:
        print(f"| {test} | {size} | {unit} | {a:.1f} | {b:.1f} | {ratio:.3g} |")

    goal, cmp = GOALS["tag_bw_vs_put_bw"]
    print(f"\n| ucx_perftest over softnic rc_verbs | size | tag_bw MB/s | ucp_put_bw MB/s "
          f"| tag/put | rounds' tag/put, lowest-highest | goal | met |")
    print("|---|---|---|---|---|---|---|---|")
    for size in (65536, 1 << 20):
        tag, put, ratios = [], [], []
        n = bw_iters(size)
        for k in range(args.rounds):             # alternate which goes first
            if k % 2:
                b = perftest(True, "ucp_put_bw", size, n)[1]
                a = perftest(True, "tag_bw", size, n)[1]
            else:
                a = perftest(True, "tag_bw", size, n)[1]
                b = perftest(True, "ucp_put_bw", size, n)[1]
            tag.append(a)
            put.append(b)
            ratios.append(a / b)
        ratio = statistics.median(ratios)
        met = "yes" if (ratio >= goal if cmp == ">=" else ratio <= goal) else "no"
        print(f"| tag_bw / ucp_put_bw | {size} | {statistics.median(tag):.1f} "
              f"| {statistics.median(put):.1f} | {ratio:.3g} "
              f"| {min(ratios):.3g}-{max(ratios):.3g} | {cmp} {goal:g} | {met} |")
    if args.ucx_only:
        print(f"\nload after: {os.getloadavg()[0]:.2f} (1 min)")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        exe = str(Path(tmp) / "mpi_check")
        subprocess.run(["mpicc", "-O2", "-o", exe, str(ROOT / "tests" / "c" / "mpi_check.c")],
                       check=True, timeout=120)
        top = (1 << 18) if args.quick else (1 << 22)
        # each size timed for ALLREDUCE_SECONDS at least (a 64 KiB allreduce in
        # five calls lasts 2 ms: whatever else the machine did then decided it)
        secs = 0.02 if args.quick else ALLREDUCE_SECONDS
        per_round = []
        for _ in range(args.rounds):
            per_round.append((allreduce_times(exe, True, top, 3 if args.quick else 5, secs),
                              allreduce_times(exe, False, top, 20, secs)))
    sizes = sorted(per_round[0][0])
    goal, cmp = GOALS["allreduce_vs_tcp"]
    print("\n| MPI_Allreduce bytes | softnic rc_verbs (ms) | Open MPI tcp (ms) | softnic/tcp "
          "| rounds' softnic/tcp, lowest-highest | goal | met |")
    print("|---|---|---|---|---|---|---|")
    for s in sizes:
        a = statistics.median(r[0][s] for r in per_round) * 1e3
        b = statistics.median(r[1][s] for r in per_round) * 1e3
        ratios = [r[0][s] / r[1][s] for r in per_round]
        ratio = statistics.median(ratios)
        spread = f"{min(ratios):.3g}-{max(ratios):.3g}"
        if s >= ALLREDUCE_GOAL_FROM:
            met = "yes" if (ratio >= goal if cmp == ">=" else ratio <= goal) else "no"
            print(f"| {s} | {a:.3f} | {b:.3f} | {ratio:.3g} | {spread} | {cmp} {goal:g} | {met} |")
        else:
            print(f"| {s} | {a:.3f} | {b:.3f} | {ratio:.3g} | {spread} | | |")
    print(f"\nload after: {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
