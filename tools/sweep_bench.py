#!/usr/bin/env python3
"""What running a sweep on Dask costs and gains: one grid run serially, on a
LocalCluster of N workers, and on a scheduler and N workers started as separate
processes on loopback (a real deployment), alternating, with each run's wall
time and CPU time (the sweep's own process and every process it or this tool
started: workers, scheduler) and a check that every run wrote the same bytes.

    python tools/sweep_bench.py                     # the grid below, 2 workers, 1 round
    python tools/sweep_bench.py grid.toml --workers 2 --rounds 3

Prints one line per run and a table of medians with the speed-up over serial.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: eight points of a few CPU seconds each: long enough that where they run matters
DEFAULT_GRID = """\
experiment = "incast"
seeds = [1, 2]
[params]
cc = ["dcqcn", "hpcc", "swift", "timely"]
duration = ["100ms"]
"""
HOST = "127.38.250.1"  # loopback address of the scheduler and workers
SWEEP = [sys.executable, "-m", "softnic.cli", "experiment", "sweep"]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def outputs(out: Path) -> dict[str, bytes]:
    got = {f"points/{p.name}": p.read_bytes() for p in sorted((out / "points").iterdir())}
    for name in ("sweep.json", "sweep.csv"):
        got[name] = (out / name).read_bytes()
    return got


def start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"), start_new_session=True)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()


def run(mode: str, grid: Path, out: Path, workers: int, tmp: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one sweep; the scheduler and workers' start-up is
    counted in neither (a deployment is started once), their CPU is."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*SWEEP, str(grid), "--out", str(out), "--no-progress"]
    procs: list[subprocess.Popen] = []
    cpu0 = children_cpu()
    try:
        if mode == "serial":
            cmd.append("--serial")
        elif mode == "local":
            cmd += ["--workers", str(workers)]
        else:
            sched = tmp / "scheduler.json"
            sched.unlink(missing_ok=True)
            procs.append(start(["distributed.cli.dask_scheduler", "--host", HOST, "--port", "0",
                                "--no-dashboard", "--scheduler-file", str(sched)],
                               tmp / "scheduler.log"))
            deadline = time.monotonic() + 60
            while not sched.exists():
                if procs[0].poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((tmp / "scheduler.log").read_text())
                time.sleep(0.1)
            address = json.loads(sched.read_text())["address"]
            for i in range(workers):
                procs.append(start(["distributed.cli.dask_worker", address, "--nthreads", "1",
                                    "--host", HOST, "--no-dashboard", "--no-nanny",
                                    "--name", f"w{i}"], tmp / f"worker{i}.log"))
            from distributed import Client
            with Client(address, timeout=60) as c:
                c.wait_for_workers(workers, timeout=60)
            cmd += ["--scheduler", address]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
    finally:
        stop(procs)
    return wall, children_cpu() - cpu0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", nargs="?", help="a sweep grid file (default: 8 incast points)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sweep_bench-"))
    grid = Path(a.grid) if a.grid else tmp / "grid.toml"
    if not a.grid:
        grid.write_text(DEFAULT_GRID)
    modes = ["serial", "local", "scheduler"]
    res: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    ref = None
    try:
        for r in range(a.rounds):
            for m in (modes if r % 2 == 0 else modes[::-1]):
                out = tmp / f"out-{m}"
                wall, cpu = run(m, grid.resolve(), out, a.workers, tmp)
                got = outputs(out)
                ref = ref or got
                same = got == ref
                print(f"round {r + 1} {m:9s} wall {wall:7.2f} s  CPU {cpu:7.2f} s  "
                      f"{'same bytes' if same else 'DIFFERENT bytes'}", flush=True)
                if not same:
                    raise SystemExit(f"{m} wrote different results from the first run")
                res[m].append((wall, cpu))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    serial_wall = statistics.median(w for w, _ in res["serial"])
    print(f"\n{len(ref) - 2} points, {a.workers} workers, {a.rounds} round(s), "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print("| run | wall s (median) | CPU s (median) | speed-up over serial |")
    print("|---|---|---|---|")
    for m in modes:
        wall = statistics.median(w for w, _ in res[m])
        cpu = statistics.median(c for _, c in res[m])
        print(f"| {m} | {wall:.2f} | {cpu:.2f} | {serial_wall / wall:.2f} |")


if __name__ == "__main__":
    main()
