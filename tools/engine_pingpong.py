"""Engine-only 8-byte WRITE ping-pong: the interpreter work of the small-message path.

Two engine devices wired back to back in one thread, no sockets, no clock:
each round trip is a WRITE each way, each placed and acknowledged, both
completions polled.  Prints the best batch's time per one-way, so builds can
be compared on a shared machine (alternate them; compare in one minute):

    .venv/bin/python tools/engine_pingpong.py [--no-fast-path] [--profile]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from softnic.core.device import Device, DeviceConfig  # noqa: E402
from softnic.core.enums import SendFlags, WROpcode as W  # noqa: E402
from softnic.core.qp import SendWR  # noqa: E402
from softnic.experiments.rig import connect  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=14000, help="round trips (default 14000)")
    ap.add_argument("--no-fast-path", action="store_true", help="DeviceConfig(fast_path=False)")
    ap.add_argument("--profile", action="store_true", help="cProfile, by own time")
    args = ap.parse_args(argv)
    cfg = DeviceConfig(fast_path=not args.no_fast_path)
    a, b = Device("a", "10.0.0.1", config=cfg), Device("b", "10.0.0.2", config=cfg)
    ea, eb = connect(a, b, mtu=4096)

    def wr(src, dst):
        return SendWR(1, W.RDMA_WRITE, [src.sge(0, 8)], SendFlags.SIGNALED,
                      remote_addr=dst.buf.addr + 64, rkey=dst.mr.rkey)
    wa, wb = wr(ea, eb), wr(eb, ea)

    def deliver(x, y):
        for d, _ in x.datagrams_to_send(0.0):
            y.receive_datagram(d, x.address, 0.0)

    def round_trip():
        a.post_send(ea.qp, wa)
        deliver(a, b)            # the WRITE
        deliver(b, a)            # its ACK
        b.post_send(eb.qp, wb)
        deliver(b, a)
        deliver(a, b)
        a.poll_cq(ea.send_cq, 8)
        b.poll_cq(eb.send_cq, 8)

    for _ in range(500):
        round_trip()
    if args.profile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.n):
            round_trip()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)
        return 0
    best = float("inf")
    batch = max(1, args.n // 7)
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(batch):
            round_trip()
        best = min(best, (time.perf_counter() - t) / batch)
    print(f"engine 8 B WRITE ping-pong ({'general path' if args.no_fast_path else 'fast paths'},"
          f" {sys.implementation.name} {sys.version.split()[0]}): "
          f"{best / 2 * 1e6:.1f} us per one-way (WRITE, ACK, completion)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
