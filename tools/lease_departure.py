#!/usr/bin/env python3
"""What a program that stops calling softnic while it keeps running costs a peer.

Program A polls its device for ``--spin`` seconds (it holds the lease: its
progress thread, raised, waits it out, in idle parks unless
``SOFTNIC_IDLE_PARK=0``), then computes for ``--compute`` seconds without calling
softnic (running, without the interpreter lock).  Meanwhile ``--hogs`` processes
spin, so every CPU is busy.  ``--after`` seconds into A's computing, program B
posts an 8-byte signaled WRITE to A and sleeps until its completion, which
needs A's progress thread: the lease lapses, the thread takes the WRITE and
sends its ACK.  Prints the WRITE's post-to-completion times (median, worst) over
``--rounds``:

    .venv/bin/python tools/lease_departure.py
    SOFTNIC_IDLE_PARK=0 .venv/bin/python tools/lease_departure.py

Both NICs live in this one process (two threads), each with its own socket and
progress thread, on loopback.  Run the two settings alternately: the figure is
the scheduler's, and moves with the machine's load.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from softnic.core.enums import SendFlags, WROpcode as W  # noqa: E402
from softnic.core.qp import SendWR  # noqa: E402
from softnic.driver import nic as nicmod  # noqa: E402
from softnic.driver.config import DeviceSpec, RuntimeConfig  # noqa: E402
from softnic.experiments.rig import bring_up, endpoint  # noqa: E402

_WORK = bytes(256 << 10)     # hashed without the interpreter lock: ~0.15 ms a call


def _hog() -> None:
    while True:
        pass


def _compute(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hashlib.sha256(_WORK).digest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--spin", type=float, default=0.1)
    ap.add_argument("--compute", type=float, default=0.1)
    ap.add_argument("--after", type=float, default=0.005)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() - 1)
    args = ap.parse_args()
    hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()                             # (forked before any device's thread exists)
    cfg = RuntimeConfig(min_timer=2e-3)
    a, b = (nicmod.NIC(DeviceSpec(f"d{i}", None, 0), cfg) for i in range(2))
    try:
        with a.lock, b.lock:
            ea, eb = endpoint(a.dev, buf_size=1 << 16), endpoint(b.dev, buf_size=1 << 16)
            bring_up(ea, eb, mtu=1024, timeout=14, retry_cnt=7)
            bring_up(eb, ea, mtu=1024, timeout=14, retry_cnt=7)
        took = []
        for i in range(args.rounds):
            done = []

            def peer():
                time.sleep(args.spin + args.after)
                t0 = time.monotonic()
                b.call(b.dev.post_send, eb.qp, SendWR(i, W.RDMA_WRITE, [eb.sge(0, 8)],
                                                      SendFlags.SIGNALED,
                                                      remote_addr=ea.buf.addr, rkey=ea.mr.rkey))
                ok = b.wait_until(lambda: done.extend(b.dev.poll_cq(eb.send_cq, 1)) or done,
                                  timeout=10)
                took.append(time.monotonic() - t0 if ok else float("inf"))
            t = threading.Thread(target=peer)
            t.start()
            end = time.monotonic() + args.spin
            while time.monotonic() < end:
                a.poll()                      # A drives its device: it holds the lease
            _compute(args.compute)            # ... then computes, never calling softnic
            t.join()
            time.sleep(0.02)
        parks = a.counters["progress_idle_parks"]
    finally:
        a.close()
        b.close()
        for h in hogs:
            h.kill()
    ms = sorted(x * 1e3 for x in took)
    print(f"idle park {'on' if nicmod.IDLE_PARK else 'off'} ({parks} lowered), "
          f"{args.hogs} hog(s): WRITE post to completion while A computes: "
          f"median {statistics.median(ms):.2f} ms, worst {ms[-1]:.2f} ms "
          f"({args.rounds} rounds; Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
