"""Engine-only SENDs as UCX's eager protocol posts them: the sender's CPU per SEND.

Two engine devices back to back in one thread, no sockets: the sender posts SENDs
of ``-s`` bytes (8255 by default, UCX's ``am_bcopy`` fragment of a 64 KiB eager
message), each alone and its output taken at once (``datagram_runs``, as the C
face's ``ibv_post_send`` flushes a post), eight at a time, one in eight signaled;
the receiver takes the packets as a socket with UDP GRO hands them over and its
ACKs come back; both devices have the compiled drain (``accel.give_compiled``), as a
live NIC's do.  Prints the sender's CPU (``time.thread_time``: post, build,
ACKs, completions) per SEND, best of ``--rounds``, with the compiled kernel and
gathered sends (``Device.tx_gather``) as the live driver has them; and, from that
round, the post and the build apart (``post_send``, ``datagram_runs``, by
``time.perf_counter``) and the receiver's CPU per SEND (its ``receive_run``,
ACKs, completions and reposts), in that round and in the receiver's own best
round (the steadier figure for a change to the receive):

    .venv/bin/python tools/engine_send.py [-s 8255] [-n 8000] [--tree OTHER_TREE]

``--tree`` imports softnic from another checkout (an older tree, to compare with).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

BATCH = 8         # SENDs posted in a row (UCX: a 64 KiB message in ~8 KiB fragments)


def run(size: int, n: int) -> tuple[float, float, float, float]:
    """CPU seconds for ``n`` SENDs of ``size`` bytes: the sender's, of it its posts'
    and its builds', and the receiver's."""
    from softnic import accel
    from softnic.core.device import Device
    from softnic.core.enums import SendFlags, WROpcode as W
    from softnic.core.qp import RecvWR, SendWR
    from softnic.core.requester import Gather, Run
    from softnic.experiments.rig import connect
    kern = accel.load()
    if kern is None:
        raise SystemExit(f"no kernel: {accel.error}")
    a, b = Device("a", "10.0.0.1"), Device("b", "10.0.0.2")
    a.kernel = b.kernel = kern
    a.tx_gather = True
    accel.give_compiled(a)          # (the drain and runs compiled, as a NIC gives them)
    accel.give_compiled(b)
    ea, eb = connect(a, b, mtu=4096, endpoint_args={"buf_size": max(1 << 20, 2 * size)})
    for i in range(4 * BATCH):
        b.post_recv(eb.qp, RecvWR(i, [eb.sge(0, size)]))
    clock = time.thread_time
    wall = time.perf_counter        # (the post and the build apart: a cheaper clock, one thread)
    spent = posts = builds = rx = 0.0
    posted = done = 0
    while done < n:
        t0 = clock()
        out = []
        for _ in range(BATCH):
            flags = SendFlags.SIGNALED if posted % BATCH == BATCH - 1 else SendFlags.SOLICITED
            t1 = wall()
            a.post_send(ea.qp, SendWR(posted, W.SEND, [ea.sge(0, size)], flags))
            t2 = wall()
            posted += 1
            out += a.datagram_runs(0.0)
            posts += t2 - t1
            builds += wall() - t2
        spent += clock() - t0
        # what the receiver's socket hands over (outside its time: the copy is the kernel's)
        runs = [(bytes(item[0]), 0) if type(item) is not Run else
                (bytes(item.buf.flatten() if type(item.buf) is Gather else item.buf), item.seg)
                for item in out]
        t0 = clock()
        for data, seg in runs:
            b.receive_run(data, seg, a.address, 0.0)
        acks = b.datagram_runs(0.0)
        for w in b.poll_cq(eb.recv_cq, 4 * BATCH):
            b.post_recv(eb.qp, RecvWR(w.wr_id, [eb.sge(0, size)]))
        rx += clock() - t0
        t0 = clock()
        for data, _ in acks:
            a.receive_datagram(bytes(data), b.address, 0.0)
        a.datagram_runs(0.0)
        done += len(a.poll_cq(ea.send_cq, 4 * BATCH)) * BATCH
        spent += clock() - t0
    assert b.counters["rcvd_icrc_err"] == 0 and posted == done
    return spent, posts, builds, rx


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-s", "--size", type=int, default=8255)
    ap.add_argument("-n", type=int, default=8000, help="SENDs per round (a multiple of 8)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tree", help="import softnic from this checkout")
    args = ap.parse_args(argv)
    root = Path(args.tree).resolve() if args.tree else Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    n = -(-args.n // BATCH) * BATCH
    rounds = [run(args.size, n) for _ in range(args.rounds)]
    best, posts, builds, rx = min(rounds)
    rx_best = min(r[3] for r in rounds)
    import softnic
    where = Path(softnic.__file__).resolve().parents[1]
    print(f"{where}: sender CPU per {args.size}-byte SEND {best / n * 1e6:.1f} us (best of "
          f"{args.rounds} rounds of {n}; load {os.getloadavg()[0]:.1f}; Python "
          f"{platform.python_version()})")
    print(f"  of it post {posts / n * 1e6:.1f} us, build {builds / n * 1e6:.1f} us; the receiver "
          f"{rx / n * 1e6:.1f} us per SEND (that round; its own best round "
          f"{rx_best / n * 1e6:.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
