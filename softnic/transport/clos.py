"""A two-tier Clos (leaf-spine) inside the simulated fabric, with ECMP and PFC.

``LeafSpineConfig`` describes it: ``leaves`` leaf switches of
``hosts_per_leaf`` hosts each, every leaf joined to every one of ``spines``
spine switches by one link.  Host links run at ``host_rate_bps``, leaf-spine
links at ``spine_rate_bps``; the oversubscription of a leaf is
``hosts_per_leaf * host_rate_bps / (spines * spine_rate_bps)``.

Every port is an output queue (``Port``): a FIFO that sends one datagram at a
time at its link's rate and hands it to the node at the other end after the
link's propagation delay.  Two traffic classes share each port, as RoCE
deployments configure them: *control* (ACK, NAK, CNP: small packets in a
strict-priority class that PFC never pauses) and *data* (every request).

Routing (``routing``):

``ecmp``
    A leaf sends a datagram for another leaf up the spine that a hash of its
    RoCEv2 five-tuple picks (source and destination IP, UDP source port,
    destination port 4791, protocol UDP), salted per switch.  The UDP source
    port is the flow's entropy: real NICs set it per QP, from the flow label
    of its address vector or its two QP numbers (``softnic.core.entropy``, the
    kernel's ``rdma_get_udp_sport``).  softnic's devices all send from one
    socket, so the fabric finds the sending QP (by the BTH's destination QPN
    and the destination) and takes that QP's port.  All packets of one QP take
    one path.
``flowlet``
    As ecmp, but a flow whose packets stop for ``flowlet_gap`` seconds may
    move: the next packet picks a spine at random (seeded).
``spray``
    Every data packet picks a spine at random (seeded); control packets
    follow the ECMP hash.

Lossy ports drop at the tail when ``buffer_bytes`` would be exceeded.  With
``pfc`` set the data class is lossless (IEEE 802.1Qbb): each switch counts the
data bytes it holds per ingress port; when one ingress passes ``xoff`` the
switch sends a PAUSE to the port feeding it, which arrives after the link's
propagation delay (and 64 bytes of serialization) and stops that port's data
class once the datagram on the wire is out; falling to ``xon`` sends a RESUME.
``headroom`` bytes above ``xoff`` absorb what is on the wire; a datagram that
would pass ``xoff + headroom`` is dropped and counted (``headroom_drops``:
zero when headroom covers the round trip, as it should).  Hosts' NIC ports
obey PAUSE too and never drop.

Counters per port: datagrams and bytes sent, drops, ECN marks, PAUSE frames
received and the time spent paused; per switch ingress: PAUSE frames sent.
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from dataclasses import dataclass, field
from heapq import heappush

from softnic.core.entropy import qp_udp_sport, udp_sport
from softnic.wire.datagram import CE, Datagram
from softnic.wire.roce import ROCEV2_PORT, Opcode as O
from congestion.base import Hop

__all__ = ["PFC", "LeafSpineConfig", "LeafSpine", "Port", "SwitchNode"]

#: bytes a link carries per datagram beyond the UDP payload (IPv4 + UDP
#: headers); the same figure as ``sim.WIRE_OVERHEAD``
WIRE_OVERHEAD = 28
#: a PAUSE frame on the wire (minimum Ethernet frame + preamble and gap)
PAUSE_BYTES = 84

# first BTH byte of control packets: RC ACKNOWLEDGE, ATOMIC ACKNOWLEDGE, CNP
_CONTROL = frozenset(int(o) for o in (O.RC_ACKNOWLEDGE, O.RC_ATOMIC_ACKNOWLEDGE, O.CNP))


@dataclass(frozen=True)
class PFC:
    """Per-ingress PFC thresholds of a switch (bytes of data held)."""
    xoff: int = 96_000
    xon: int = 64_000
    #: None: per ingress, what the link can still deliver after XOFF is
    #: decided (``headroom_for``)
    headroom: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.xon <= self.xoff:
            raise ValueError(f"PFC needs 0 < xon <= xoff, got xon={self.xon} xoff={self.xoff}")
        if self.headroom is not None and self.headroom < 0:
            raise ValueError(f"PFC headroom must be >= 0, got {self.headroom}")


def headroom_for(rate_bps: float, delay: float, mtu_bytes: int = 4096 + 72) -> int:
    """Bytes an ingress must still accept after it sends PAUSE: the PAUSE's
    flight and the data already on the wire (two propagation delays at the
    link's rate), the datagram being sent when the PAUSE lands and the one
    that triggered it, and the PAUSE frame's own serialization."""
    return int(2 * delay * rate_bps / 8 + 2 * mtu_bytes + PAUSE_BYTES) + 1


@dataclass
class LeafSpineConfig:
    leaves: int = 4
    hosts_per_leaf: int = 4
    spines: int = 4
    host_rate_bps: float = 100e9
    spine_rate_bps: float | None = None     # None: host_rate_bps
    delay: float = 1e-6                     # propagation per link (s)
    buffer_bytes: int | None = 1 << 20      # per port, lossy class
    red: object = None                      # sim.RED or None
    int_telemetry: bool = False
    routing: str = "ecmp"                   # ecmp, flowlet or spray
    flowlet_gap: float = 50e-6
    pfc: PFC | None = None
    sample_interval: float | None = 10e-6   # queue samples at most this often per port;
    # None: none (``Port.samples`` stays empty)

    def __post_init__(self) -> None:
        for name in ("leaves", "hosts_per_leaf", "spines"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.routing not in ("ecmp", "flowlet", "spray"):
            raise ValueError(f"routing must be ecmp, flowlet or spray, got {self.routing!r}")
        if not self.host_rate_bps > 0:
            raise ValueError("host_rate_bps must be > 0")
        if self.spine_rate_bps is not None and not self.spine_rate_bps > 0:
            raise ValueError("spine_rate_bps must be > 0")
        if not self.delay >= 0:
            raise ValueError("delay must be >= 0")

    @property
    def uplink_rate_bps(self) -> float:
        return self.spine_rate_bps or self.host_rate_bps

    @property
    def oversubscription(self) -> float:
        return self.hosts_per_leaf * self.host_rate_bps / (self.spines * self.uplink_rate_bps)


class _Pkt:
    """A datagram crossing the Clos: where it goes and where it came in."""

    __slots__ = ("data", "src", "dst", "key", "size", "ctrl", "ingress", "ect", "tdst")

    def __init__(self, data, src, dst, key, ctrl, ect, tdst) -> None:
        self.data = data
        self.src = src          # address of the sending device
        self.dst = dst          # address of the receiving device
        self.key = key          # ECMP flow key
        self.size = len(data) + WIRE_OVERHEAD
        self.ctrl = ctrl        # control class (never paused)
        self.ingress = None     # (switch, port feeding it) while a switch holds it
        self.ect = ect
        self.tdst = tdst        # the receiving device's fabric port


_PAUSE, _RESUME, _TXDONE = object(), object(), object()


class Port:
    """One egress port: a control FIFO with strict priority over a data FIFO,
    sending at ``rate_bps`` into a link of ``delay`` toward ``peer`` (a
    ``SwitchNode``, or None: the hosts' own fabric ports, found per packet).

    With PFC, the switch at the far end keeps its per-ingress accounting for
    this link here: ``held`` data bytes, ``xoff_sent`` while it has this port
    paused, and the thresholds ``xoff``, ``xon`` and ``room`` (xoff plus the
    headroom)."""

    __slots__ = ("net", "name", "rate_bps", "delay", "peer", "buffer_bytes", "red",
                 "int_telemetry", "rng", "ctrl", "data", "qbytes", "busy_until", "pending",
                 "paused", "paused_since", "pause_time", "tx_bytes", "sent", "max_qlen",
                 "counters", "tx_by_src", "samples", "_sample", "_next_sample", "_interval",
                 "_bit", "lossless", "held", "xoff_sent", "xoff", "xon", "room", "heap", "seq")

    def __init__(self, net: "LeafSpine", name: str, rate_bps: float, delay: float, peer,
                 *, buffer_bytes: int | None, red=None, int_telemetry: bool = False,
                 sample: bool = True, rng: random.Random | None = None,
                 track_src: bool = False) -> None:
        self.net = net
        self.heap = net.heap          # the fabric's event heap and sequence numbers: read
        self.seq = net.next_seq       # per packet, so one attribute away, not two
        self.name = name
        self.rate_bps = float(rate_bps)
        self._bit = 8 / self.rate_bps
        self.delay = delay
        self.peer = peer
        self.buffer_bytes = buffer_bytes
        self.red = red
        self.int_telemetry = int_telemetry
        self.rng = rng or random.Random(name)
        self.ctrl: deque = deque()
        self.data: deque = deque()
        self.qbytes = 0            # bytes waiting (not the one on the wire)
        # The wire is busy until busy_until; a _TXDONE entry is in the heap
        # (pending) only while something waits for the wire to free.
        self.busy_until = 0.0
        self.pending = False
        self.paused = False
        self.paused_since = 0.0
        self.pause_time = 0.0
        self.tx_bytes = 0
        self.sent = 0
        self.max_qlen = 0
        self.counters = {"dropped": 0, "marked": 0, "pauses_rx": 0, "resumes_rx": 0,
                         "headroom_drops": 0}
        #: bytes sent per source device (host-facing ports only)
        self.tx_by_src: dict | None = {} if track_src else None
        self.samples: list[tuple[float, int]] = []
        self._sample = sample and net.cfg.sample_interval is not None
        self._next_sample = 0.0
        self._interval = net.cfg.sample_interval or 0.0
        self.lossless = net.lossless
        pfc = net.cfg.pfc
        self.held = 0
        self.xoff_sent = False
        if pfc is not None:
            self.xoff, self.xon = pfc.xoff, pfc.xon
            room = pfc.headroom if pfc.headroom is not None else headroom_for(rate_bps, delay)
            self.room = pfc.xoff + room
        else:
            self.xoff = self.xon = self.room = 0

    def paused_for(self, now: float) -> float:
        """Seconds this port's data class has been paused up to ``now``."""
        return self.pause_time + (now - self.paused_since if self.paused else 0.0)

    def stats(self, now: float) -> dict:
        c = dict(self.counters)
        c.update(sent=self.sent, max_qlen=self.max_qlen, tx_bytes=self.tx_bytes,
                 paused_s=self.paused_for(now))
        return c

    # -- events -------------------------------------------------------------

    def event(self, now: float, what, _src=None) -> None:
        if what is _TXDONE:
            self.pending = False
            self._start(now)
        elif what is _PAUSE:
            self.counters["pauses_rx"] += 1
            if not self.paused:
                self.paused = True
                self.paused_since = now
        elif what is _RESUME:
            self.counters["resumes_rx"] += 1
            if self.paused:
                self.paused = False
                self.pause_time += now - self.paused_since
                self._kick(now)

    def _kick(self, now: float) -> None:
        """Send the head now if the wire is free, else wake up when it is."""
        if self.pending:
            return
        if now >= self.busy_until:
            self._start(now)
        else:
            self.pending = True
            heappush(self.heap, (self.busy_until, self.seq(), self, _TXDONE, None))

    def enqueue(self, pkt: _Pkt, now: float) -> bool:
        """Queue ``pkt``; False if it was dropped."""
        # once per packet per hop: attributes read once, into locals
        q = self.qbytes
        if self._sample and now >= self._next_sample:
            self.samples.append((now, q))
            self._next_sample = now + self._interval
        if q > self.max_qlen:
            self.max_qlen = q
        size = pkt.size
        if pkt.ctrl:
            self.ctrl.append(pkt)
        else:
            if (self.buffer_bytes is not None and not self.lossless
                    and q + size > self.buffer_bytes):
                self.counters["dropped"] += 1
                return False
            red = self.red
            if red is not None and pkt.ect and q > red.kmin:
                if q >= red.kmax or self.rng.random() < red.probability(q):
                    self.counters["marked"] += 1
                    d = pkt.data
                    pkt.data = d.with_(ecn=CE) if type(d) is Datagram else Datagram(d, ecn=CE)
            self.data.append(pkt)
        self.qbytes = q + size
        if not self.pending:
            busy = self.busy_until
            if now >= busy:
                self._start(now)
            else:
                self.pending = True
                heappush(self.heap, (busy, self.seq(), self, _TXDONE, None))
        return True

    def _start(self, now: float) -> None:
        ctrl = self.ctrl
        if ctrl:
            pkt = ctrl.popleft()
        else:
            data = self.data
            if data and not self.paused:
                pkt = data.popleft()
            else:
                return
        size = pkt.size
        self.qbytes -= size
        self.busy_until = end = now + size * self._bit
        self.tx_bytes += size
        self.sent += 1
        by_src = self.tx_by_src
        if by_src is not None:
            src = pkt.src
            by_src[src] = by_src.get(src, 0) + size
        up = pkt.ingress
        if up is not None:                # leaves the switch's buffer: PFC accounting
            pkt.ingress = None
            held = up.held = up.held - size
            if up.xoff_sent and held <= up.xon:
                up.xoff_sent = False
                self.net.signal(up, _RESUME, now)
        if self.int_telemetry and not pkt.ctrl:
            d = pkt.data
            if type(d) is not Datagram or d.echo is None:
                hop = Hop(int(self.qbytes), self.tx_bytes, end, self.rate_bps)
                pkt.data = (d.with_(hops=(d.hops or ()) + (hop,)) if type(d) is Datagram
                            else Datagram(d, hops=(hop,)))
        heap, seq = self.heap, self.seq
        if ctrl or (self.data and not self.paused):
            self.pending = True
            heappush(heap, (end, seq(), self, _TXDONE, None))
        peer = self.peer
        if peer is None:            # the last hop: deliver to the device
            heappush(heap, (end + self.delay, seq(), pkt.tdst, pkt.data, pkt.src))
        else:
            heappush(heap, (end + self.delay, seq(), peer, pkt, self))


class SwitchNode:
    """A leaf or spine: routes each arriving datagram to one of its ports and,
    with PFC, accounts data bytes per ingress (on the port feeding it)."""

    def __init__(self, net: "LeafSpine", name: str, index: int, pfc: PFC | None) -> None:
        self.net = net
        self.name = name
        self.index = index
        self.pfc = pfc
        self.salt = zlib.crc32(f"{net.seed}/{name}".encode())
        self.down: dict = {}         # leaf: host address -> Port; spine: leaf index -> Port
        self.up: list[Port] = []     # leaf: one per spine
        self.pauses_tx: dict = {}    # upstream Port name -> PAUSE frames sent
        self.flowlets: dict = {}     # key -> (last seen, uplink index)
        self.rng = random.Random(f"{net.seed}/{name}/route")
        self.mode = net.cfg.routing
        #: a spine (no uplinks), set when the fabric is built
        self.spine = False
        self.by_key: dict = {}       # a leaf's ECMP uplink per flow key

    def event(self, now: float, pkt: _Pkt, up: Port) -> None:
        # the common cases of ``route`` first, inline: a spine, a leaf's own host
        if self.spine:
            out = self.down[self.net.leaf_of[pkt.dst]]
        else:
            out = self.down.get(pkt.dst)
            if out is None:
                if self.mode == "ecmp" or pkt.ctrl:     # ``route``'s hash, memoized
                    out = self.by_key.get(pkt.key)
                    if out is None:
                        out = self.by_key[pkt.key] = self.route(pkt, now)
                else:
                    out = self.route(pkt, now)
        if self.pfc is not None and not pkt.ctrl:
            held = up.held + pkt.size
            if held > up.room:
                out.counters["headroom_drops"] += 1
                return
            up.held = held
            pkt.ingress = up
            if held > up.xoff and not up.xoff_sent:
                up.xoff_sent = True
                self.pauses_tx[up.name] = self.pauses_tx.get(up.name, 0) + 1
                self.net.signal(up, _PAUSE, now)
        out.enqueue(pkt, now)      # lossless: never refused

    def route(self, pkt: _Pkt, now: float) -> Port:
        if self.up:                                    # a leaf
            port = self.down.get(pkt.dst)
            if port is not None:
                return port
            ups = self.up
            mode = self.mode
            if mode == "ecmp" or pkt.ctrl:
                return ups[self._hash(pkt.key, len(ups))]
            if mode == "spray":
                return ups[self.rng.randrange(len(ups))]
            key = pkt.key                              # flowlet
            fl = self.flowlets.get(key)
            if fl is None:
                i = self._hash(key, len(ups))
            elif now - fl[0] > self.net.cfg.flowlet_gap:
                i = self.rng.randrange(len(ups))
            else:
                i = fl[1]
            self.flowlets[key] = (now, i)
            return ups[i]
        return self.down[self.net.leaf_of[pkt.dst]]    # a spine

    def _hash(self, key: int, n: int) -> int:
        # the flow's five-tuple hash, salted per switch (as switches seed
        # their hash functions differently, against polarization)
        return (((key ^ self.salt) * 0x9E3779B1) & 0xFFFFFFFF) * n >> 32


def _udp_sport(device, dst, dqpn: int, index: dict | None = None) -> int:
    """The RoCEv2 UDP source port a NIC would send this datagram from: that of
    the sending QP (``softnic.core.entropy``, the kernel's rule from its flow
    label or its two QP numbers), found on ``device`` by its destination QPN
    and address; for a datagram of no known QP, the rule with only ``dqpn``.

    ``index``, a dict the caller keeps for ``device``, maps (destination,
    destination QPN) to the first QP of the device with them; a lookup it cannot
    answer (a QP connected since) walks the device's QPs once and fills it, so a
    device with many QPs is walked once per batch of new connections, not once
    per new flow (an alltoall's first packets: the square of the hosts)."""
    qp = None if index is None else index.get((dst, dqpn))
    if qp is not None and device.qps.get(qp.qpn) is qp and qp.attr.dest_qp_num == dqpn \
            and tuple(qp.dest or ()) == dst:
        return qp_udp_sport(qp)
    qp = None
    if index is not None:
        index.clear()
    for q in getattr(device, "qps", {}).values():
        attr = getattr(q, "attr", None)
        if attr is None:
            continue
        k = (tuple(q.dest or ()), attr.dest_qp_num)
        if qp is None and k == (dst, dqpn):
            qp = q
            if index is None:
                break
        if index is not None:
            index.setdefault(k, q)
    return qp_udp_sport(qp) if qp is not None else udp_sport(0, 0, dqpn)


class LeafSpine:
    """The switches and ports of one leaf-spine; hosts join with ``connect``."""

    def __init__(self, fabric, cfg: LeafSpineConfig) -> None:
        self.fabric = fabric
        self.cfg = cfg
        self.seed = fabric.seed
        self.heap = fabric._heap
        self.next_seq = fabric._next_seq
        self.hash_cache: dict = {}
        self.qp_index: dict = {}      # device -> its ``_udp_sport`` index
        self.lossless = cfg.pfc is not None
        self.leaf_of: dict = {}
        self.nic: dict = {}           # host address -> its NIC's egress Port
        self.host_index: dict = {}
        rate, up_rate, d = cfg.host_rate_bps, cfg.uplink_rate_bps, cfg.delay
        self.leaves = [SwitchNode(self, f"leaf{i}", i, cfg.pfc) for i in range(cfg.leaves)]
        self.spines = [SwitchNode(self, f"spine{j}", cfg.leaves + j, cfg.pfc)
                       for j in range(cfg.spines)]
        for spine in self.spines:
            spine.spine = True
        kw = dict(buffer_bytes=cfg.buffer_bytes, red=cfg.red, int_telemetry=cfg.int_telemetry)
        for leaf in self.leaves:
            for spine in self.spines:
                leaf.up.append(Port(self, f"{leaf.name}->{spine.name}", up_rate, d, spine,
                                    rng=fabric.derive_rng("port", leaf.name, spine.name), **kw))
                spine.down[leaf.index] = Port(self, f"{spine.name}->{leaf.name}", up_rate, d,
                                              leaf, rng=fabric.derive_rng("port", spine.name,
                                                                          leaf.name), **kw)

    def connect(self, address, leaf: int | None = None) -> None:
        """Join the host at ``address`` (attached to the fabric) to leaf ``leaf``
        (None: the next free place, leaf by leaf)."""
        address = tuple(address)
        if address in self.leaf_of:
            raise ValueError(f"{address} is already connected")
        if leaf is None:
            leaf = len(self.leaf_of) // self.cfg.hosts_per_leaf
        if not 0 <= leaf < len(self.leaves):
            raise ValueError(f"no leaf {leaf} (this fabric has {len(self.leaves)})")
        sw = self.leaves[leaf]
        if len(sw.down) >= self.cfg.hosts_per_leaf:
            raise ValueError(f"leaf {leaf} already has {self.cfg.hosts_per_leaf} hosts")
        cfg = self.cfg
        name = f"{address[0]}:{address[1]}"
        self.host_index[address] = len(self.leaf_of)
        self.leaf_of[address] = leaf
        sw.down[address] = Port(self, f"{sw.name}->{name}", cfg.host_rate_bps, cfg.delay, None,
                                buffer_bytes=cfg.buffer_bytes, red=cfg.red,
                                int_telemetry=cfg.int_telemetry, track_src=True,
                                rng=self.fabric.derive_rng("port", sw.name, name))
        self.nic[address] = Port(self, f"nic {name}", cfg.host_rate_bps, cfg.delay, sw,
                                 buffer_bytes=None, sample=False)
        self.fabric._clos_of[address] = self

    def inject(self, src_port, dst_port, data, now: float) -> None:
        """A device hands ``data`` to its NIC."""
        src, dst = src_port.address, dst_port.address
        fk = (src, dst, data[5:8])
        key = self.hash_cache.get(fk)
        if key is None:
            device = src_port.device
            index = self.qp_index.get(device)
            if index is None:
                index = self.qp_index[device] = {}
            sport = _udp_sport(device, dst, int.from_bytes(fk[2], "big"), index)
            key = self.hash_cache[fk] = zlib.crc32(
                f"{src[0]}|{dst[0]}|{sport}|{ROCEV2_PORT}|17".encode())
        pkt = _Pkt(data, src, dst, key, len(data) > 0 and data[0] in _CONTROL,
                   src_port.ect, dst_port)
        self.nic[src].enqueue(pkt, now)

    def signal(self, up: Port, what, now: float) -> None:
        """A PAUSE or RESUME to port ``up``, after its link's delay."""
        at = now + up.delay + PAUSE_BYTES * 8 / up.rate_bps
        heappush(self.heap, (at, self.next_seq(), up, what, None))

    # -- figures --------------------------------------------------------------

    def ports(self):
        """Every switch port and NIC port: (name, Port)."""
        for sw in self.leaves + self.spines:
            for p in list(sw.up) + list(sw.down.values()):
                yield p.name, p
        for p in self.nic.values():
            yield p.name, p

    def port_stats(self, now: float) -> dict:
        return {name: p.stats(now) for name, p in self.ports()}

    def pause_frames_sent(self) -> int:
        return sum(n for sw in self.leaves + self.spines for n in sw.pauses_tx.values())

    def uplink_bytes(self) -> dict:
        """Bytes each leaf sent up each spine: {leaf name: [per spine]}."""
        return {leaf.name: [p.tx_bytes for p in leaf.up] for leaf in self.leaves}
