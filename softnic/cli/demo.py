"""The demo: two NICs in the simulated fabric, a lossy link, every RC operation.

It moves data with RDMA WRITE, READ, SEND (with immediate) and both atomics
between two devices joined by a link that loses 2 % of packets (plus a little
reordering, duplication and corruption), checks every byte against what was
sent, and prints the completions and the NICs' counters.
"""

from __future__ import annotations

import random
import sys

from ..core.device import Device, DeviceConfig
from ..core.enums import SendFlags, WCStatus, WROpcode as W
from ..core.qp import RecvWR, SendWR
from ..driver.faults import FaultModel
from ..experiments.rig import connect
from ..transport.sim import Fabric

DEFAULT_FAULTS = "loss=0.02,reorder=0.005/20us,dup=0.005,corrupt=0.005,rate=10G,queue=16777216"


def run(seed: int = 1, faults: str = DEFAULT_FAULTS, mtu: int = 1024,
        selective_repeat: bool = False, out=sys.stdout) -> bool:
    model = FaultModel.parse(faults)
    cfg = DeviceConfig(selective_repeat=selective_repeat, min_timer=200e-6)
    a = Device("softnic0", "10.0.0.1", config=cfg)
    b = Device("softnic1", "10.0.0.2", config=cfg)
    fabric = Fabric(seed, default_faults=model, default_delay=5e-6)
    fabric.attach(a)
    fabric.attach(b)
    ea, eb = connect(a, b, mtu=mtu, psn_a=0xFFFF00, psn_b=0x000100, timeout=8, retry_cnt=7,
                     endpoint_args=dict(buf_size=4 << 20))
    rng = random.Random(seed)
    size = 1 << 20
    src = rng.randbytes(size)
    ea.buf.view[:size] = src                    # A: [0, 1M) source
    eb.buf.view[2 << 20:(2 << 20) + size] = rng.randbytes(size)   # B: [2M, 3M) to be READ
    eb.buf.view[3 << 20:(3 << 20) + 8] = (1000).to_bytes(8, sys.byteorder)
    p = lambda s: print(s, file=out)   # noqa: E731
    p(f"softnic demo: {a.name} {a.gid} <-> {b.name} {b.gid}, simulated 10 Gbit/s link, 5 us each way")
    p(f"  faults each way: {model}   seed {seed}   path MTU {mtu}   "
      f"recovery {'selective repeat' if selective_repeat else 'go-back-N'}")
    for i in range(4):
        b.post_recv(eb.qp, RecvWR(100 + i, [eb.sge((1 << 20) + i * 65536, 65536)]))
    wrs = _work_requests(ea, eb, size)
    for wr in wrs:
        a.post_send(ea.qp, wr)
    got_a, got_b = [], []

    def done() -> bool:
        got_a.extend(a.poll_cq(ea.send_cq, 16))
        got_b.extend(b.poll_cq(eb.recv_cq, 16))
        return len(got_a) == len(wrs) and len(got_b) == 2

    fabric.run(until=10.0, stop=done)
    p(f"\n  finished at virtual time {fabric.now * 1e3:.3f} ms after {fabric.events_processed} "
      f"events")
    names = {1: "RDMA_WRITE 1 MiB", 2: "RDMA_READ 1 MiB", 3: "SEND_WITH_IMM 50000 B",
             4: "RDMA_WRITE_WITH_IMM 10000 B", 5: "ATOMIC_FETCH_AND_ADD +234",
             6: "ATOMIC_CMP_AND_SWP 1234->42"}
    p("\n  requester completions (softnic0):")
    for wc in got_a:
        p(f"    wr_id {wc.wr_id}  {names[wc.wr_id]:<28} {wc.status.name}")
    p("  responder completions (softnic1):")
    for wc in got_b:
        p(f"    wr_id {wc.wr_id}  {wc.opcode.name:<20} byte_len {wc.byte_len:<6} "
          f"imm {wc.imm_data:#x}  {wc.status.name}")
    checks = _checks(ea, eb, src, size, got_a, got_b)
    p("\n  checks:")
    for k, v in checks.items():
        p(f"    [{'ok' if v else 'FAILED'}] {k}")
    _counters(p, fabric, (a, b))
    return all(checks.values())


def _work_requests(ea, eb, size: int) -> list:
    """One of each: a WRITE and a READ of ``size`` bytes, a SEND and a WRITE with
    immediate, and both atomics on one 8-byte counter."""
    return [
        SendWR(1, W.RDMA_WRITE, [ea.sge(0, size)], SendFlags.SIGNALED,
               remote_addr=eb.buf.addr, rkey=eb.mr.rkey),
        SendWR(2, W.RDMA_READ, [ea.sge(2 << 20, size)], SendFlags.SIGNALED,
               remote_addr=eb.buf.addr + (2 << 20), rkey=eb.mr.rkey),
        SendWR(3, W.SEND_WITH_IMM, [ea.sge(0, 50000)], SendFlags.SIGNALED, imm_data=0xC0FFEE),
        SendWR(4, W.RDMA_WRITE_WITH_IMM, [ea.sge(4096, 10000)], SendFlags.SIGNALED,
               imm_data=7, remote_addr=eb.buf.addr + (3 << 20) + 4096, rkey=eb.mr.rkey),
        SendWR(5, W.ATOMIC_FETCH_AND_ADD, [ea.sge(3 << 20, 8)], SendFlags.SIGNALED,
               remote_addr=eb.buf.addr + (3 << 20), rkey=eb.mr.rkey, compare_add=234),
        SendWR(6, W.ATOMIC_CMP_AND_SWP, [ea.sge((3 << 20) + 8, 8)], SendFlags.SIGNALED,
               remote_addr=eb.buf.addr + (3 << 20), rkey=eb.mr.rkey, compare_add=1234, swap=42),
    ]


def _checks(ea, eb, src: bytes, size: int, got_a: list, got_b: list) -> dict[str, bool]:
    """What the run must have done, each by the bytes in memory or the completions."""
    bv, av = eb.buf.view, ea.buf.view
    fetched = int.from_bytes(av[3 << 20:(3 << 20) + 8], sys.byteorder)
    swapped = int.from_bytes(av[(3 << 20) + 8:(3 << 20) + 16], sys.byteorder)
    final = int.from_bytes(bv[3 << 20:(3 << 20) + 8], sys.byteorder)
    return {
        "WRITE landed byte for byte": bytes(bv[:size]) == src,
        "READ returned the remote bytes": bytes(av[2 << 20:(2 << 20) + size])
        == bytes(bv[2 << 20:(2 << 20) + size]),
        "SEND placed in the receive buffer": bytes(bv[1 << 20:(1 << 20) + 50000]) == src[:50000],
        "WRITE_WITH_IMM landed": bytes(bv[(3 << 20) + 4096:(3 << 20) + 14096])
        == src[4096:14096],
        "atomics executed once each (1000 +234 -> 1234 -> 42)":
            (fetched, swapped, final) == (1000, 1234, 42),
        "every completion succeeded": all(w.status == WCStatus.SUCCESS for w in got_a + got_b)
        and len(got_a) == 6 and len(got_b) == 2,
    }


def _counters(p, fabric, devices) -> None:
    """The link's nonzero counters, then each device's, four to a line."""
    fc = fabric.counters
    p("\n  link: " + ", ".join(f"{k} {v}" for k, v in fc.items() if v))
    for d in devices:
        p(f"\n  {d.name} counters:")
        items = [(k, v) for k, v in d.counters.items() if v or k in ("sent_pkts", "rcvd_pkts")]
        for i in range(0, len(items), 4):
            p("    " + "  ".join(f"{k}={v}" for k, v in items[i:i + 4]))
