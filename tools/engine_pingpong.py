"""Engine-only 8-byte WRITE ping-pong: the interpreter work of the small-message path.

Two engine devices wired back to back in one thread, no sockets, no clock:
each round trip is a WRITE each way, each placed and acknowledged, both
completions polled.  Prints the best batch's time per one-way, so builds can
be compared on a shared machine (alternate them; compare in one minute):

    .venv/bin/python tools/engine_pingpong.py [--no-fast-path] [--profile] [--op OP]

``--op send`` (a receive posted for each, its completion polled), ``read`` or
``atomic`` (a FETCH_ADD) does the same with that opcode each way: a request and
its answer (the ACK, the READ RESPONSE ONLY, the ATOMIC ACKNOWLEDGE).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from softnic.core.device import Device, DeviceConfig  # noqa: E402
from softnic.core.enums import SendFlags, WROpcode as W  # noqa: E402
from softnic.core.qp import RecvWR, SendWR  # noqa: E402
from softnic.experiments.rig import connect  # noqa: E402
from softnic.cli.doctor import libpython_shared  # noqa: E402

OPS = {"write": W.RDMA_WRITE, "send": W.SEND, "read": W.RDMA_READ,
       "atomic": W.ATOMIC_FETCH_AND_ADD}
ANSWERS = {"write": "WRITE, ACK", "send": "SEND, ACK", "read": "READ, READ RESPONSE",
           "atomic": "FETCH_ADD, ATOMIC ACKNOWLEDGE"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=14000, help="round trips (default 14000)")
    ap.add_argument("--no-fast-path", action="store_true", help="DeviceConfig(fast_path=False)")
    ap.add_argument("--profile", action="store_true", help="cProfile, by own time")
    ap.add_argument("--cpu", action="store_true",
                    help="time by the process's CPU time (on a loaded machine the wall "
                         "clock also counts the time other processes run)")
    ap.add_argument("--op", choices=sorted(OPS), default="write",
                    help="the opcode each way (default write)")
    args = ap.parse_args(argv)
    cfg = DeviceConfig(fast_path=not args.no_fast_path)
    a, b = Device("a", "10.0.0.1", config=cfg), Device("b", "10.0.0.2", config=cfg)
    ea, eb = connect(a, b, mtu=4096)
    op = OPS[args.op]
    send = op is W.SEND

    def wr(src, dst):
        return SendWR(1, op, [src.sge(0, 8)], SendFlags.SIGNALED,
                      remote_addr=dst.buf.addr + 64, rkey=dst.mr.rkey, compare_add=1)
    wa, wb = wr(ea, eb), wr(eb, ea)
    ra, rb = RecvWR(2, [ea.sge(128, 8)]), RecvWR(2, [eb.sge(128, 8)])

    def deliver(x, y):
        for d, _ in x.datagrams_to_send(0.0):
            y.receive_datagram(d, x.address, 0.0)

    def round_trip():
        if send:
            b.post_recv(eb.qp, rb)
        a.post_send(ea.qp, wa)
        deliver(a, b)            # the request
        deliver(b, a)            # its answer
        if send:
            a.post_recv(ea.qp, ra)
        b.post_send(eb.qp, wb)
        deliver(b, a)
        deliver(a, b)
        a.poll_cq(ea.send_cq, 8)
        b.poll_cq(eb.send_cq, 8)
        if send:
            a.poll_cq(ea.recv_cq, 8)
            b.poll_cq(eb.recv_cq, 8)

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
    clock = time.process_time if args.cpu else time.perf_counter
    best = float("inf")
    batch = max(1, args.n // 7)
    for _ in range(7):
        t = clock()
        for _ in range(batch):
            round_trip()
        best = min(best, (clock() - t) / batch)
    print(f"engine 8 B {args.op.upper()} ping-pong "
          f"({'general path' if args.no_fast_path else 'fast paths'},"
          f" {sys.implementation.name} {sys.version.split()[0]}"
          f" {'libpython shared' if libpython_shared() else 'statically linked'}"
          f"{', CPU time' if args.cpu else ''}): "
          f"{best / 2 * 1e6:.1f} us per one-way ({ANSWERS[args.op]}, completion)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
