"""Bulk WRITEs over real UDP sockets with 2 % loss and selective repeat: the
runs beyond each hole are placed by the kernel (``responder._middles_beyond``)
and the sender's runs pass the fault model at once (``NIC._surviving``); every
byte still arrives exactly, later WRITEs to the same bytes winning."""

from __future__ import annotations

import os

from softnic.core.enums import SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import SendWR
from softnic.driver.config import RuntimeConfig
from softnic.driver.faults import FaultModel

from test_live_udp import _nics, _pair, _wait


def _write_all(a, ea, wrs) -> None:
    """Post every WR on ``ea``'s QP; each completes, successfully, in order."""
    for wr in wrs:
        a.call(a.dev.post_send, ea.qp, wr)
    got = _wait(a, ea.send_cq, len(wrs), timeout=60)
    assert [(w.wr_id, w.status) for w in got] == [(w.wr_id, WCStatus.SUCCESS) for w in wrs]


def test_bulk_writes_with_loss_and_selective_repeat_arrive_exactly():
    cfg = RuntimeConfig(faults=FaultModel.parse("loss=0.02"), seed=11, min_timer=2e-3,
                        selective_repeat=True)
    a, b = _nics(cfg)
    try:
        ea, eb = _pair(a, b, mtu=4096, size=8 << 20)
        data = os.urandom(4 << 20)
        ea.buf.view[:len(data)] = data
        n, wrs = 65536, []
        for i in range(48):
            # 32 WRITEs to their own 64 KiB, then 16 more over the first 16 of them
            dst = (i % 32) * n
            src = (i if i < 32 else 32 + i) * n % len(data)
            wrs.append(SendWR(i, W.RDMA_WRITE, [ea.sge(src, n)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr + dst, rkey=eb.mr.rkey))
        _write_all(a, ea, wrs)
        for slot in range(32):
            src = (32 + slot + 32) * n % len(data) if slot < 16 else slot * n
            assert bytes(eb.buf.view[slot * n:(slot + 1) * n]) == data[src:src + n], slot
        assert a.counters["fault_dropped_loss"] > 0
        assert b.counters["out_of_seq_request"] > 0
    finally:
        a.close()
        b.close()


def test_long_writes_beyond_a_hole_stream_through_the_kernel_and_arrive_exactly():
    """1 MiB WRITEs with 1 % loss: the receiving progress thread takes the MIDDLEs
    beyond each hole run after run in the kernel (``NIC._rx_stream`` from
    ``responder.stream_target``'s beyond-a-hole target), and memory ends as if
    every packet had landed in order (the last 4 WRITEs overwrite the first 4)."""
    cfg = RuntimeConfig(faults=FaultModel.parse("loss=0.01"), seed=5, min_timer=2e-3,
                        selective_repeat=True)
    a, b = _nics(cfg)
    try:
        n = 1 << 20
        ea, eb = _pair(a, b, mtu=4096, size=12 * n)
        data = os.urandom(12 * n)
        ea.buf.view[:len(data)] = data
        wrs = [SendWR(i, W.RDMA_WRITE, [ea.sge(i * n, n)], SendFlags.SIGNALED,
                      remote_addr=eb.buf.addr + (i % 8) * n, rkey=eb.mr.rkey)
               for i in range(12)]
        _write_all(a, ea, wrs)
        for slot in range(8):
            src = (slot + 8 if slot < 4 else slot) * n
            assert bytes(eb.buf.view[slot * n:(slot + 1) * n]) == data[src:src + n], slot
        assert a.counters["fault_dropped_loss"] > 0
        assert b.counters["rx_stream_beyond_pkts"] > 0
    finally:
        a.close()
        b.close()
