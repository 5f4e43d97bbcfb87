"""Engine-only bulk WRITE: the interpreter work per 64 KiB message, each side apart.

Two engine devices back to back in one thread, no sockets: the sender posts
WRITEs (MTU 4096, ``-t`` in flight), its datagram runs go to the receiver as
a socket with UDP GRO would hand them over (``Device.receive_run``), the ACKs
come back.  Prints microseconds per message and per packet spent in the
sender (post, build, ACK handling, completion) and in the receiver (check,
place, ACK), best of ``--rounds``, with the compiled kernel and without:

    .venv/bin/python tools/engine_bulk.py [-s 65536] [-n 2000] [--profile]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from softnic import accel  # noqa: E402
from softnic.core.device import Device, DeviceConfig  # noqa: E402
from softnic.core.enums import SendFlags, WROpcode as W  # noqa: E402
from softnic.core.qp import SendWR  # noqa: E402
from softnic.core.requester import Run  # noqa: E402
from softnic.experiments.rig import connect  # noqa: E402

GRO_MAX = 64      # segments the kernel's UDP GRO hands over at most


def run(size: int, n: int, depth: int, kernel) -> tuple[float, float, int]:
    """(sender seconds, receiver seconds, packets) for ``n`` WRITEs of ``size``."""
    a, b = Device("a", "10.0.0.1"), Device("b", "10.0.0.2")
    a.kernel = b.kernel = kernel
    ea, eb = connect(a, b, mtu=4096, endpoint_args={"buf_size": max(1 << 20, 2 * size)})
    wr = SendWR(1, W.RDMA_WRITE, [ea.sge(0, size)], SendFlags.SIGNALED,
                remote_addr=eb.buf.addr, rkey=eb.mr.rkey)
    clock = time.perf_counter
    ts = tr = 0.0
    posted = done = 0
    pkts = 0
    while done < n:
        t0 = clock()
        while posted < n and posted - done < depth:
            a.post_send(ea.qp, wr)
            posted += 1
        runs = a.datagram_runs(0.0)
        done += len(a.poll_cq(ea.send_cq, depth))
        t1 = clock()
        for item in runs:
            if type(item) is not Run:
                b.receive_run(bytes(item[0]), 0, a.address, 0.0)
                pkts += 1
            else:
                buf, _, seg, _ = item
                step = GRO_MAX * seg
                for o in range(0, len(buf), step):
                    chunk = bytes(buf[o:o + step])
                    b.receive_run(chunk, seg, a.address, 0.0)
                    pkts += -(-len(chunk) // seg)
        acks = b.datagram_runs(0.0)
        t2 = clock()
        for data, _ in acks:
            a.receive_datagram(bytes(data), b.address, 0.0)
        done += len(a.poll_cq(ea.send_cq, depth))
        t3 = clock()
        ts += (t1 - t0) + (t3 - t2)
        tr += t2 - t1
    assert a.counters["rcvd_icrc_err"] == b.counters["rcvd_icrc_err"] == 0
    return ts, tr, pkts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-s", "--size", type=int, default=65536)
    ap.add_argument("-n", type=int, default=2000, help="messages per round")
    ap.add_argument("-t", "--depth", type=int, default=16, help="WRITEs in flight")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile one round, with the kernel")
    args = ap.parse_args(argv)
    kern = accel.load()
    if args.profile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        run(args.size, args.n, args.depth, kern)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)
        return 0
    modes = [("python", None)] + ([("kernel", kern)] if kern is not None else [])
    if kern is None:
        print(f"(no kernel: {accel.error})")
    best = {m: (float("inf"), float("inf"), 0) for m, _ in modes}
    for _ in range(args.rounds):          # alternate, so both see the same machine
        for m, k in modes:
            ts, tr, pkts = run(args.size, args.n, args.depth, k)
            s0, r0, _ = best[m]
            best[m] = (min(s0, ts), min(r0, tr), pkts)
    print(f"{args.size} B WRITEs, {args.n} per round, {args.depth} in flight, best of "
          f"{args.rounds}")
    print(f"{'loops':8} {'sender us/msg':>14} {'receiver us/msg':>16} {'sender us/pkt':>14} "
          f"{'receiver us/pkt':>16}")
    for m, _ in modes:
        ts, tr, pkts = best[m]
        print(f"{m:8} {ts / args.n * 1e6:14.1f} {tr / args.n * 1e6:16.1f} "
              f"{ts / pkts * 1e6:14.2f} {tr / pkts * 1e6:16.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
