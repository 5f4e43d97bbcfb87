"""Shared set-up for the engine tests: two devices in the simulated fabric.

``pair()`` builds two engine devices on a seeded ``Fabric`` and connects a
QP on each (``softnic.experiments.rig.connect``).  ``Pair.run_until`` drives virtual
time until a condition holds; ``packets`` decodes the fabric trace so a test
can assert what went on the wire and in which order.  ``Filter`` sits
between a device and the fabric and drops chosen datagrams, for losses that
must hit one exact packet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from softnic.core.cq import WC
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import QPType, SendFlags, WROpcode as W
from softnic.core.qp import SendWR
from softnic.driver.faults import FaultModel
from softnic.experiments.rig import Endpoint, connect
from softnic.transport.sim import Fabric
from softnic.wire.roce import Kind, Packet, decode

A_IP = "10.0.0.1"
B_IP = "10.0.0.2"


class Filter:
    """A device as the fabric sees it, with some outgoing datagrams dropped.

    ``drop(packet, raw)`` is asked about every datagram the device sends; a
    true answer loses it before it reaches the link.  Dropped packets are
    kept in ``dropped``.
    """

    def __init__(self, dev: Device, drop: Callable[[Packet, bytes], bool] | None = None):
        self.dev = dev
        self.drop = drop
        self.dropped: list[Packet] = []

    @property
    def address(self):
        return self.dev.address

    def receive_datagram(self, data, src, now):
        self.dev.receive_datagram(data, src, now)

    def datagrams_to_send(self, now):
        out = []
        for data, dst in self.dev.datagrams_to_send(now):
            pkt = decode(data[:-4])
            if self.drop is not None and self.drop(pkt, data):
                self.dropped.append(pkt)
                continue
            out.append((data, dst))
        return out

    def get_timer(self):
        return self.dev.get_timer()

    def handle_timer(self, now):
        self.dev.handle_timer(now)


@dataclass
class Pair:
    fabric: Fabric
    a: Device
    b: Device
    ea: Endpoint
    eb: Endpoint
    filter_a: Filter
    filter_b: Filter
    wcs: dict = field(default_factory=dict)   # cq -> completions polled so far

    def run_until(self, cond: Callable[[], bool], limit: float = 10.0) -> None:
        """Run the fabric until ``cond()`` holds; fail if virtual time reaches ``limit``."""
        self.fabric.run(until=self.fabric.now + limit, stop=cond)
        assert cond(), f"condition not reached by virtual time {self.fabric.now:.6f}"

    def run(self, max_events: int = 500_000) -> float:
        """Run until the fabric is idle (no packet in flight, no timer armed)."""
        t = self.fabric.run(max_events=max_events)
        assert not self.fabric.pending(), f"fabric still busy after {max_events} events"
        return t

    def polled(self, dev: Device, cq) -> list[WC]:
        """Every completion taken from ``cq`` so far (polls whatever is new)."""
        got = self.wcs.setdefault(id(cq), [])
        got.extend(dev.poll_cq(cq, 1 << 20))
        return got

    def send_wcs(self, side: str = "a") -> list[WC]:
        ep = self.ea if side == "a" else self.eb
        return self.polled(ep.dev, ep.send_cq)

    def recv_wcs(self, side: str = "b") -> list[WC]:
        ep = self.ea if side == "a" else self.eb
        return self.polled(ep.dev, ep.recv_cq)

    def packets(self, kind: str = "send", src: Device | None = None,
                dst: Device | None = None) -> list[tuple[float, Packet]]:
        """Decoded trace records of ``kind`` (from ``src`` / to ``dst`` if given), in order."""
        assert self.fabric.tracing, "pair(trace=True) is needed"
        out = []
        for rec in self.fabric.trace:
            if rec.kind != kind:
                continue
            if src is not None and rec.src != src.address:
                continue
            if dst is not None and rec.dst != dst.address:
                continue
            out.append((rec.time, decode(rec.data[:-4])))
        return out


def pair(seed: int = 1, *, qp_type: QPType = QPType.RC, faults: FaultModel | None = None,
         trace: bool = True, config: DeviceConfig | None = None, delay: float = 2e-6,
         drop_a=None, drop_b=None, endpoint_args: dict | None = None, **connect_args) -> Pair:
    """Two devices in a seeded fabric with one connected QP each.

    Defaults keep tests quick: a 64 KiB buffer per side, a 1 ms timer floor,
    and a retransmission timeout of ``4.096 us * 2**10`` (about 4 ms).
    """
    cfg = config or DeviceConfig(min_timer=1e-3)
    a = Device("a", A_IP, config=cfg)
    b = Device("b", B_IP, config=cfg)
    fabric = Fabric(seed, default_faults=faults or FaultModel.none(), default_delay=delay,
                    trace=trace)
    fa, fb = Filter(a, drop_a), Filter(b, drop_b)
    fabric.attach(fa)
    fabric.attach(fb)
    eargs = dict(buf_size=1 << 16)
    eargs.update(endpoint_args or {})
    connect_args.setdefault("timeout", 10)
    ea, eb = connect(a, b, qp_type=qp_type, endpoint_args=eargs, **connect_args)
    return Pair(fabric, a, b, ea, eb, fa, fb)


def fill(ep: Endpoint, offset: int, data: bytes) -> None:
    ep.buf.view[offset:offset + len(data)] = data


def read(ep: Endpoint, offset: int, n: int) -> bytes:
    return bytes(ep.buf.view[offset:offset + n])


def pattern(n: int, salt: int = 0) -> bytes:
    """``n`` bytes that differ from any other salt's and shift with the position."""
    return bytes((i * 7 + salt * 31 + (i >> 8)) & 0xFF for i in range(n))


def write_wr(wr_id: int, ep: Endpoint, peer: Endpoint, off: int, n: int, roff: int, *,
             flags: int = SendFlags.SIGNALED, rkey: int | None = None,
             opcode: W = W.RDMA_WRITE, **kw) -> SendWR:
    return SendWR(wr_id, opcode, [ep.sge(off, n)] if n else [], flags,
                  remote_addr=peer.buf.addr + roff,
                  rkey=peer.mr.rkey if rkey is None else rkey, **kw)


def read_wr(wr_id: int, ep: Endpoint, peer: Endpoint, off: int, n: int, roff: int, *,
            flags: int = SendFlags.SIGNALED, rkey: int | None = None) -> SendWR:
    return SendWR(wr_id, W.RDMA_READ, [ep.sge(off, n)], flags, remote_addr=peer.buf.addr + roff,
                  rkey=peer.mr.rkey if rkey is None else rkey)


def send_wr(wr_id: int, ep: Endpoint, off: int, n: int, *, flags: int = SendFlags.SIGNALED,
            opcode: W = W.SEND, **kw) -> SendWR:
    return SendWR(wr_id, opcode, [ep.sge(off, n)] if n else [], flags, **kw)


def is_request(pkt: Packet) -> bool:
    return pkt.info.is_request


def kinds(pkts, kind: Kind) -> list:
    return [(t, p) for t, p in pkts if p.info.kind == kind]
