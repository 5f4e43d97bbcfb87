"""The engine's work per WRITE does not grow with the number of QPs (the harness's
"WRITE 64 KiB on 1024 QPs vs 1 QP" row): counted in Python lines run, not timed.

Two engine devices back to back in one thread, driven as a driver drives them
(after every input, drain the output and ask for the one timer).  Idle QPs must
cost a moving QP nothing, and with many QPs each moving one WRITE the calls per
WRITE must stay those of a few QPs.
"""

from __future__ import annotations

import sys

from enginekit import connect
from softnic.core.device import Device
from softnic.core.enums import SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import SendWR

SIZE = 1 << 16
MTU = 4096


def _devices(active: int, idle: int):
    a, b = Device("a", "10.0.0.1"), Device("b", "10.0.0.2")
    small = {"buf_size": 4096, "cq_depth": 16, "max_send_wr": 4, "max_recv_wr": 4}
    # the idle pairs first and last, around the moving ones (QPNs on both sides)
    for _ in range(idle // 2):
        connect(a, b, mtu=MTU, endpoint_args=small)
    pairs = [connect(a, b, mtu=MTU, endpoint_args={"buf_size": SIZE, "cq_depth": 64})
             for _ in range(active)]
    for _ in range(idle - idle // 2):
        connect(a, b, mtu=MTU, endpoint_args=small)
    return a, b, pairs


def _pump(a, b, now: float) -> None:
    moved = True
    while moved:
        moved = False
        for x, y in ((a, b), (b, a)):
            out = x.datagrams_to_send(now)
            for data, _ in out:
                y.receive_datagram(data, x.address, now)
            moved = moved or bool(out)
            x.get_timer()


def _round(a, b, pairs, now: float) -> None:
    """One 64 KiB WRITE on every moving QP, all delivered, acknowledged, completed."""
    for ea, eb in pairs:
        a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, SIZE)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    _pump(a, b, now)
    for ea, _ in pairs:
        wcs = a.poll_cq(ea.send_cq, 4)
        assert [w.status for w in wcs] == [WCStatus.SUCCESS], wcs


def _lines_per_write(active: int, idle: int, rounds: int = 4) -> float:
    """Python lines run per WRITE (a loop over QPs runs its lines once per QP)."""
    a, b, pairs = _devices(active, idle)
    _round(a, b, pairs, 0.0)                       # warm: first-use caches filled
    lines = 0

    def line(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
        return line

    sys.settrace(lambda frame, event, arg: line)
    try:
        for i in range(rounds):
            _round(a, b, pairs, 0.001 * (i + 1))
    finally:
        sys.settrace(None)
    return lines / (rounds * active)


def test_idle_qps_cost_a_moving_qp_nothing():
    alone = _lines_per_write(1, 0)
    crowded = _lines_per_write(1, 512)
    assert alone > 100                              # the count sees the engine's work
    assert crowded == alone, (alone, crowded)


def test_work_per_write_does_not_grow_with_moving_qps():
    few = _lines_per_write(4, 0)
    many = _lines_per_write(256, 0)
    assert many <= few * 1.05, (few, many)
