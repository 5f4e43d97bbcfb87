"""``softnic launch -n N prog.py [args]``: N ranks of a program on this machine.

Each rank gets what torchrun gives it (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus its own softnic device on
a loopback address of its own (``SOFTNIC_DEVICES``), and ``import pyverbs``
resolves to softnic as under ``softnic exec``.  If a rank fails, the others
are stopped and the launch exits with that rank's status.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SHIM = Path(__file__).resolve().parent.parent / "faces" / "pyverbs_shim"
GRACE = 10.0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks")
    ap.add_argument("-m", "--module", action="store_true",
                    help="the program is a module: run 'python -m MODULE [args]' (as torchrun -m)")
    ap.add_argument("--master-port", type=int, default=0,
                    help="rendezvous TCP port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--faults", help="fault model on every rank's device, e.g. 'loss=0.02'")
    ap.add_argument("--seed", type=int, help="seed of the fault model (rank r uses seed + r)")
    ap.add_argument("--timeout", type=float,
                    help="seconds a rank waits for another before failing (SOFTNIC_COLL_TIMEOUT)")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="prog.py [args] (run with this Python) or any command")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_address(port: int, rank: int) -> str:
    """A loopback address for ``rank`` that depends on the job's port, so that
    concurrent jobs on one machine do not collide."""
    return f"127.{100 + (port >> 8) % 150}.{port & 0xFF}.{rank + 1}"


def rank_env(base: dict, rank: int, world: int, port: int, faults=None, seed=None,
             timeout=None) -> dict:
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SHIM)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               SOFTNIC_DEVICES=f"softnic0={rank_address(port, rank)}")
    if faults is not None:
        env["SOFTNIC_FAULTS"] = faults
    if seed is not None or faults is not None:
        env["SOFTNIC_SEED"] = str((seed or 0) + rank)
    if timeout is not None:
        env["SOFTNIC_COLL_TIMEOUT"] = str(timeout)
    return env


def launch(command: list[str], nproc: int, port: int = 0, faults=None, seed=None,
           timeout=None, module: bool = False) -> int:
    if nproc < 1 or nproc > 250:
        print(f"softnic launch: -n {nproc} outside 1..250", file=sys.stderr)
        return 2
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("softnic launch: give a program, e.g. softnic launch -n 4 train.py",
              file=sys.stderr)
        return 2
    if faults is not None:
        from ..driver.faults import FaultModel
        FaultModel.parse(faults)              # a bad model is an error here, not in N ranks
    if module:
        command = [sys.executable, "-u", "-m"] + command
    elif command[0].endswith(".py"):
        command = [sys.executable, "-u"] + command
    port = port or free_port()
    procs = []
    for rank in range(nproc):
        env = rank_env(os.environ, rank, nproc, port, faults, seed, timeout)
        try:
            procs.append(subprocess.Popen(command, env=env))
        except FileNotFoundError:
            print(f"softnic launch: {command[0]}: command not found", file=sys.stderr)
            _stop(procs)
            return 127
    status = 0
    try:
        live = dict(enumerate(procs))
        while live:
            for rank, p in list(live.items()):
                rc = p.poll()
                if rc is None:
                    continue
                del live[rank]
                if rc != 0 and status == 0:
                    status = rc if rc > 0 else 128 - rc
                    print(f"softnic launch: rank {rank} exited with status {rc}; stopping "
                          f"the other ranks", file=sys.stderr)
                    _stop(list(live.values()), patience=GRACE)
            time.sleep(0.02)
    except KeyboardInterrupt:
        _stop(procs)
        return 130
    return status


def _stop(procs, patience: float = 0.0) -> None:
    """Give ``procs`` ``patience`` seconds to end on their own (the survivors of a
    failed rank report it themselves), then SIGTERM, then SIGKILL."""
    deadline = time.monotonic() + patience
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(args) -> int:
    return launch(args.command, args.nproc, args.master_port, args.faults, args.seed,
                  args.timeout, args.module)
