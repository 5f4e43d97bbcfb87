#!/usr/bin/env python3
"""RDMA WRITE bandwidth and 8-byte latency, RoCEv2 over UDP next to iWARP over TCP.

Both transports are measured in one run, on loopback, between two live devices
of this process, through the pyverbs API (what a program sees):

* bandwidth: ``--count`` RDMA WRITEs of ``--size`` bytes, ``--depth`` in flight,
  ended by a SEND whose receive completion shows every WRITE has landed (both
  transports deliver in order);
* latency: an 8-byte SEND ping-pong, half the mean round trip.

    python tools/transport_bench.py
    python tools/transport_bench.py --size 262144 --count 400 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import softnic.driver.config as config  # noqa: E402
import softnic.driver.nic as nic  # noqa: E402
import verbs_api.enums as e  # noqa: E402
from verbs_api.wr import SGE, RecvWR, SendWR  # noqa: E402
from verbskit import Side, connect  # noqa: E402


def _poll(cq, n: int) -> list:
    got = []
    deadline = time.monotonic() + 120
    while len(got) < n:
        got += cq.poll(n - len(got))[1]
        if time.monotonic() > deadline:
            raise RuntimeError("completions did not arrive")
    bad = [w for w in got if w.status != e.IBV_WC_SUCCESS]
    if bad:
        raise RuntimeError(f"failed completion: {bad[0]}")
    return got


def measure(transport: str, size: int, count: int, depth: int, pings: int,
            timeout: int = 14) -> dict:
    nic.configure(config.RuntimeConfig(transport=transport))
    a = Side("softnic0", msg_size=size + 4096, max_wr=depth + 8, cq_depth=4 * depth + 64)
    b = Side("softnic1", msg_size=size + 4096, max_wr=depth + 8, cq_depth=4 * depth + 64)
    try:
        connect(a, b, mtu=e.IBV_MTU_4096, timeout=timeout)
        # bandwidth: WRITEs with `depth` in flight, then a SEND that lands after all of them
        b.qp.post_recv(RecvWR(0, 1, [SGE(b.mr.buf + size, 8, b.mr.lkey)]))
        posted = done = 0
        t0 = time.perf_counter()
        while done < count:
            while posted < count and posted - done < depth:
                wr = SendWR(posted, e.IBV_WR_RDMA_WRITE, 1, [SGE(a.mr.buf, size, a.mr.lkey)],
                            send_flags=e.IBV_SEND_SIGNALED)
                wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
                a.qp.post_send(wr)
                posted += 1
            n, wcs = a.cq.poll(depth)
            for w in wcs:
                if w.status != e.IBV_WC_SUCCESS:
                    raise RuntimeError(f"WRITE failed: {w}")
            done += n
        a.qp.post_send(SendWR(count, e.IBV_WR_SEND, 1, [SGE(a.mr.buf, 8, a.mr.lkey)],
                              send_flags=e.IBV_SEND_SIGNALED))
        _poll(b.cq, 1)
        elapsed = time.perf_counter() - t0
        _poll(a.cq, 1)
        counters = a.ctx._nic.counters
        resent = counters.get("retransmitted_pkts", 0)
        timeouts = counters.get("timeouts", 0)
        # latency: 8-byte SEND ping-pong
        rtts = []
        for i in range(pings + 20):
            b.qp.post_recv(RecvWR(i, 1, [SGE(b.mr.buf, 8, b.mr.lkey)]))
            a.qp.post_recv(RecvWR(i, 1, [SGE(a.mr.buf + 8, 8, a.mr.lkey)]))
            t = time.perf_counter()
            a.qp.post_send(SendWR(i, e.IBV_WR_SEND, 1, sg=[SGE(a.mr.buf, 8, a.mr.lkey)],
                                  send_flags=0))
            _poll(b.cq, 1)
            b.qp.post_send(SendWR(i, e.IBV_WR_SEND, 1, sg=[SGE(b.mr.buf + 16, 8, b.mr.lkey)],
                                  send_flags=0))
            _poll(a.cq, 1)
            if i >= 20:                                 # after a warm-up
                rtts.append(time.perf_counter() - t)
        return {"transport": transport, "size": size, "count": count, "depth": depth,
                "write_MBps": size * count / elapsed / 1e6,
                "write_Gbps": size * count * 8 / elapsed / 1e9,
                "lat8_us_median": statistics.median(rtts) / 2 * 1e6,
                "lat8_us_p99": sorted(rtts)[int(len(rtts) * 0.99) - 1] / 2 * 1e6,
                "write_resent_pkts": resent, "write_timeouts": timeouts}
    finally:
        a.close()
        b.close()
        nic.configure(None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=65536, help="WRITE size in bytes")
    p.add_argument("--count", type=int, default=1000, help="number of WRITEs")
    p.add_argument("--depth", type=int, default=16, help="WRITEs in flight")
    p.add_argument("--pings", type=int, default=1000, help="8-byte ping-pongs")
    p.add_argument("--transports", default="udp,tcp")
    p.add_argument("--timeout", type=int, default=14,
                   help="QP timeout attribute (udp: retransmission after 4.096 us * 2**timeout)")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    rows = [measure(t, args.size, args.count, args.depth, args.pings, args.timeout)
            for t in args.transports.split(",")]
    print(f"RDMA WRITE {args.size} B x {args.count} (depth {args.depth}), "
          f"8-byte SEND ping-pong x {args.pings}, loopback, one process")
    print(f"{'transport':<22}{'WRITE MB/s':>12}{'Gbit/s':>9}{'lat8 median us':>16}"
          f"{'lat8 p99 us':>13}{'resent':>8}")
    names = {"udp": "udp (RoCEv2)", "tcp": "tcp (iWARP)"}
    for r in rows:
        print(f"{names.get(r['transport'], r['transport']):<22}{r['write_MBps']:>12.1f}"
              f"{r['write_Gbps']:>9.2f}{r['lat8_us_median']:>16.1f}{r['lat8_us_p99']:>13.1f}"
              f"{r['write_resent_pkts']:>8}")
    print("resent: packets softnic retransmitted during the WRITEs (TCP's own are not counted)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
