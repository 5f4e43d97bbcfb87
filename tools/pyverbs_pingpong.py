#!/usr/bin/env python3
"""The Python face's twin of ``ibv_rc_pingpong``: SEND/RECV ping-pong on an RC QP.

As ibv_rc_pingpong does, each side posts receives, the client sends first, and
an iteration ends when both its SEND and the peer's message have completed;
``-e`` sleeps on the completion channel (``req_notify`` / ``get_cq_event``)
instead of polling.  Prints ``N iters in S seconds = U usec/iter``, as the C
program does.  Run by tools/perf_harness.py next to the C program.

    python tools/pyverbs_pingpong.py [-e] [-n N] [-s SIZE] -p PORT          # server
    python tools/pyverbs_pingpong.py [-e] [-n N] [-s SIZE] -p PORT HOST     # client
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from softnic.cli.perf import Channel, Endpoint  # noqa: E402

RECV_WRID, SEND_WRID = 1, 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("server", nargs="?")
    ap.add_argument("-p", "--port", type=int, default=18515)
    ap.add_argument("-n", "--iters", type=int, default=1000)
    ap.add_argument("-s", "--size", type=int, default=4096)
    ap.add_argument("-e", "--events", action="store_true", help="sleep on CQ events")
    ap.add_argument("-d", "--ib-dev", default="softnic0")
    a = ap.parse_args(argv)
    import verbs_api.enums as e
    from verbs_api.cq import CQ, CompChannel
    from verbs_api.wr import SGE, RecvWR, SendWR
    p = {"kind": "lat", "tx_depth": 4, "qps": 1, "sizes": [a.size], "mtu": 1024,
         "timeout": 14}
    if a.server is None:
        ls = socket.create_server(("127.0.0.1", a.port))
        conn, _ = ls.accept()
        ls.close()
    else:
        conn = socket.create_connection((a.server, a.port), timeout=30)
    ch = Channel(conn)
    ep = Endpoint(a.ib_dev, p)
    if a.events:
        # a CQ of its own on a completion channel, for both queues of the QP
        from verbs_api.qp import QP, QPAttr, QPCap, QPInitAttr
        comp = CompChannel(ep.ctx)
        cq = CQ(ep.ctx, 64, None, comp, 0)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
        ep.qps = [QP(ep.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap,
                                       sq_sig_all=0), attr)]
        cq.req_notify()
    else:
        comp, cq = None, ep.cq
    ch.send(ep.info())
    ep.connect(ch.recv(), p)
    qp = ep.qps[0]
    recv_wr = RecvWR(RECV_WRID, 1, [SGE(ep.mr.buf + ep.half, a.size, ep.mr.lkey)])
    send_wr = SendWR(SEND_WRID, e.IBV_WR_SEND, 1, sg=[SGE(ep.mr.buf, a.size, ep.mr.lkey)],
                     send_flags=e.IBV_SEND_SIGNALED)
    for _ in range(4):
        qp.post_recv(recv_wr)
    ch.send({"ready": 1})
    ch.recv()
    client = a.server is not None
    pending = RECV_WRID
    if client:
        qp.post_send(send_wr)
        pending |= SEND_WRID
    rcnt = scnt = 0
    t0 = time.perf_counter()
    deadline = time.monotonic() + 120
    while rcnt < a.iters or scnt < a.iters:
        if comp is not None:
            comp.get_cq_event(cq)
            cq.ack_events(1)
            cq.req_notify()
        while True:
            n, wcs = cq.poll(2)
            if n or comp is not None:
                break
            if time.monotonic() > deadline:
                print("no completion in time", file=sys.stderr)
                return 1
        for w in wcs:
            if w.status != e.IBV_WC_SUCCESS:
                print(f"completion failed: status {w.status}", file=sys.stderr)
                return 1
            if w.wr_id == SEND_WRID:
                scnt += 1
            else:
                rcnt += 1
                qp.post_recv(recv_wr)
            pending &= ~w.wr_id
            if scnt < a.iters and not pending:
                qp.post_send(send_wr)
                pending = RECV_WRID | SEND_WRID
    dt = time.perf_counter() - t0
    print(f"{a.size * a.iters * 2} bytes in {dt:.2f} seconds = "
          f"{a.size * a.iters * 2 * 8 / dt / 1e6:.2f} Mbit/sec")
    print(f"{a.iters} iters in {dt:.2f} seconds = {dt * 1e6 / a.iters:.2f} usec/iter")
    ch.send({"done": 1})
    try:
        ch.recv()
    except Exception:
        pass
    ep.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
