"""Engine-only bulk WRITE under loss: the receiver's and the sender's work per
64 KiB message with a share of the request datagrams dropped, against none.

Two engine devices with selective repeat back to back in one thread, no
sockets (as tools/engine_bulk.py): the sender's datagram runs lose each
datagram with probability ``--loss`` (a seeded draw), the survivors go to the
receiver as UDP GRO would hand them over (up to 64 equal datagrams that
followed each other), the responses come back; a virtual clock moves 100 us a
round, so the requester's probes and timers run.  Best of ``--rounds``; also
the counts per lost datagram (packets taken beyond a hole, NAKs, resends)::

    .venv/bin/python tools/engine_loss.py [-n 2000] [--loss 0.01] [--profile]
"""

from __future__ import annotations

import argparse
import random
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


def run(size: int, n: int, depth: int, loss: float, seed: int, kernel, prof=None) -> dict:
    """Seconds of each side and the counts for ``n`` WRITEs of ``size``
    (``prof``, a cProfile.Profile, profiles the receiver only)."""
    cfg = DeviceConfig(selective_repeat=True)
    a, b = Device("a", "10.0.0.1", config=cfg), Device("b", "10.0.0.2", config=cfg)
    a.kernel = b.kernel = kernel
    ea, eb = connect(a, b, mtu=4096, endpoint_args={"buf_size": max(1 << 20, 2 * size)})
    wr = SendWR(1, W.RDMA_WRITE, [ea.sge(0, size)], SendFlags.SIGNALED,
                remote_addr=eb.buf.addr, rkey=eb.mr.rkey)
    rng = random.Random(seed)
    clock = time.perf_counter
    ts = tr = now = 0.0
    posted = done = drops = responses = 0
    while done < n:
        now += 1e-4
        t0 = clock()
        while posted < n and posted - done < depth:
            a.post_send(ea.qp, wr)
            posted += 1
        t = a.get_timer()
        if t is not None and t <= now:
            a.handle_timer(now)
        runs = a.datagram_runs(now)
        done += len(a.poll_cq(ea.send_cq, depth))
        t1 = clock()
        if prof is not None:
            prof.enable()
        for item in runs:
            seg = item.seg if type(item) is Run else len(item[0])
            buf = item[0]
            keep = []
            for o in range(0, len(buf), seg):
                if loss and rng.random() < loss:
                    drops += 1
                else:
                    keep.append(bytes(buf[o:o + seg]))
            for i in range(0, len(keep), GRO_MAX):
                part = keep[i:i + GRO_MAX]
                if len(part) == 1:
                    b.receive_run(part[0], 0, a.address, now)
                else:
                    b.receive_run(b"".join(part), seg, a.address, now)
        t = b.get_timer()
        if t is not None and t <= now:
            b.handle_timer(now)
        acks = b.datagram_runs(now)
        if prof is not None:
            prof.disable()
        t2 = clock()
        for item in acks:
            responses += 1
            a.receive_datagram(bytes(item[0]), b.address, now)
        done += len(a.poll_cq(ea.send_cq, depth))
        t3 = clock()
        ts += (t1 - t0) + (t3 - t2)
        tr += t2 - t1
    assert a.counters["rcvd_icrc_err"] == b.counters["rcvd_icrc_err"] == 0
    return {"sender": ts, "receiver": tr, "drops": drops, "responses": responses,
            "beyond": b.counters["out_of_seq_request"],
            "resent": a.counters["retransmitted_pkts"], "naks": a.counters["rcvd_seq_err"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-s", "--size", type=int, default=65536)
    ap.add_argument("-n", type=int, default=2000, help="messages per round")
    ap.add_argument("-t", "--depth", type=int, default=16, help="WRITEs in flight")
    ap.add_argument("--loss", type=float, default=0.01, help="share of request datagrams lost")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the receiver of one lossy round")
    args = ap.parse_args(argv)
    kern = accel.load()
    if args.profile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        run(args.size, args.n, args.depth, args.loss, args.seed, kern, pr)
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
        return 0
    best: dict = {}
    for _ in range(args.rounds):          # alternate, so both see the same machine
        for loss in (0.0, args.loss):
            r = run(args.size, args.n, args.depth, loss, args.seed, kern)
            if loss not in best or r["receiver"] < best[loss]["receiver"]:
                best[loss] = r
    print(f"{args.size} B WRITEs, {args.n} per round, {args.depth} in flight, selective "
          f"repeat, best of {args.rounds}")
    for loss, r in best.items():
        line = (f"loss {loss:<5} sender {r['sender'] / args.n * 1e6:6.1f} us/msg  "
                f"receiver {r['receiver'] / args.n * 1e6:6.1f} us/msg")
        if r["drops"]:
            d = r["drops"]
            line += (f"  per lost datagram: {r['beyond'] / d:.1f} packets beyond a hole, "
                     f"{r['naks'] / d:.2f} NAKs, {r['resent'] / d:.2f} resends")
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
