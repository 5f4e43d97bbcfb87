"""How an unmodified program's softnic devices are set up: environment or a file.

Variables (each optional; a JSON file named by ``SOFTNIC_CONFIG`` may hold the
same keys in lower case without the prefix, and the variables win over it):

``SOFTNIC_DEVICES``
    ``softnic0=127.0.0.2:4791,softnic1=10.0.0.5,softnic2=[::1]:4792`` names each
    device and its IPv4 or IPv6 address (IPv6 in brackets when a port follows) and
    UDP port, default 4791; or a count, ``3``, for that many
    devices on free loopback addresses.  Default: ``2``.  A device item may end
    in ``/udp`` or ``/tcp`` to choose its transport
    (``softnic0=127.0.0.2:4791/tcp``); otherwise ``SOFTNIC_TRANSPORT`` decides.
``SOFTNIC_TRANSPORT``
    ``udp`` (RoCEv2 over UDP, softnic's own reliability; the default) or
    ``tcp`` (iWARP: MPA/DDP/RDMAP over TCP, listening on the device's port number
    on TCP) for every device that does not name its own.
``SOFTNIC_FAULTS``
    a fault model applied to every datagram a device sends, e.g.
    ``loss=0.05,reorder=0.01/200us`` (see ``softnic.driver.faults.FaultModel.parse``).
``SOFTNIC_SEED``
    the seed of the fault model's random draws (default 0).
``SOFTNIC_CAPTURE``
    a pcap path; each device writes ``<stem>-<device>.pcap`` beside it.
``SOFTNIC_RECOVERY``
    ``gbn`` (go-back-N, the default) or ``sr`` (selective repeat).
``SOFTNIC_MIN_TIMER``
    floor of the retransmission and RNR timers in seconds (default 0.001).
``SOFTNIC_CC``
    congestion control for every QP: ``none`` (the default), ``dcqcn``,
    ``timely``, ``swift``, ``hpcc``, optionally with parameters, e.g.
    ``dcqcn:g=0.0039,t_inc=55us`` (see ``congestion.parse_spec``).  With a
    controller on, devices read the ECN bits of what arrives (``IP_RECVTOS``)
    and DCQCN's packets are sent ECN-capable (ECT(0)).  Per device:
    ``softnic0=dcqcn;softnic1=hpcc:eta=0.9`` (devices not named get none).
``SOFTNIC_LINK_GBPS``
    each device's line rate in Gbit/s (default 100): the rate its congestion
    controllers start from, and what its port reports as active speed and width
    (``softnic.core.device.port_speed``, as Linux maps an Ethernet port's speed:
    100 is 4X EDR, 25 is 1X EDR, 1 or less 1X SDR).  Middleware sizes its
    protocols by it (UCX's rendezvous threshold, for one); it does not limit
    what the device carries.
``SOFTNIC_BACKEND``
    ``udp`` (real sockets, the default) or ``sim``: every device of the process
    joins one deterministic simulated fabric that runs in virtual time, with
    ``SOFTNIC_FAULTS`` on its links and ``SOFTNIC_SEED`` as its seed.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass, field

from .faults import FaultModel
from ..wire.roce import ROCEV2_PORT

ENV_PREFIX = "SOFTNIC_"
TRANSPORTS = ("udp", "tcp")


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    ip: str | None          # None: pick a free loopback address when opened
    port: int = ROCEV2_PORT
    transport: str | None = None    # "udp" / "tcp"; None: RuntimeConfig.transport


@dataclass(frozen=True)
class RuntimeConfig:
    devices: tuple[DeviceSpec, ...] = field(default_factory=lambda: parse_devices("2"))
    faults: FaultModel = FaultModel()
    seed: int = 0
    capture: str | None = None
    selective_repeat: bool = False
    min_timer: float = 1e-3
    backend: str = "udp"
    cc: str = "none"
    transport: str = "udp"
    link_gbps: float = 100.0

    def transport_of(self, name: str) -> str:
        spec = next((d for d in self.devices if d.name == name), None)
        return (spec.transport if spec is not None and spec.transport else self.transport)


def parse_devices(text: str) -> tuple[DeviceSpec, ...]:
    text = text.strip()
    if text.isdigit():
        n = int(text)
        if not 1 <= n <= 64:
            raise ValueError(f"SOFTNIC_DEVICES count {n} outside 1..64")
        return tuple(DeviceSpec(f"softnic{i}", None) for i in range(n))
    specs = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, where = item.partition("=")
        if not sep or not name or not where:
            raise ValueError(f"SOFTNIC_DEVICES item {item!r} is not NAME=IP[:PORT][/udp|/tcp]"
                             f" (an IPv6 address in brackets: NAME=[IPV6][:PORT])")
        where, slash, transport = where.partition("/")
        transport = transport.strip().lower() if slash else None
        if slash and transport not in TRANSPORTS:
            raise ValueError(f"SOFTNIC_DEVICES item {item!r}: transport must be 'udp' or 'tcp'")
        ip, port = split_host_port(where, item)
        p = int(port) if port else ROCEV2_PORT
        if not 0 < p < 65536:
            raise ValueError(f"SOFTNIC_DEVICES item {item!r}: bad port")
        specs.append(DeviceSpec(name.strip(), ip, p, transport))
    if not specs:
        raise ValueError("SOFTNIC_DEVICES names no device")
    if len({s.name for s in specs}) != len(specs):
        raise ValueError("SOFTNIC_DEVICES names a device twice")
    return tuple(specs)


def split_host_port(where: str, item: str = "") -> tuple[str, str]:
    """``a.b.c.d[:port]`` or ``[ipv6][:port]`` (or a bare IPv6 address) -> (the address
    in its canonical text, the port's text or ''); a bad address raises ValueError."""
    where = where.strip()
    if where.startswith("["):
        host, sep, rest = where[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"SOFTNIC_DEVICES item {item!r}: '[' without a matching ']'")
        port = rest[1:]
    elif where.count(":") > 1:
        host, port = where, ""               # a bare IPv6 address: no port
    else:
        host, _, port = where.partition(":")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"SOFTNIC_DEVICES item {item!r}: {host!r} is not an IPv4 or IPv6 "
                         f"address") from None
    if isinstance(ip, ipaddress.IPv6Address) and (ip.ipv4_mapped is not None or ip.scope_id):
        raise ValueError(f"SOFTNIC_DEVICES item {item!r}: give an IPv4-mapped address as IPv4,"
                         f" and no IPv6 scope (link-local addresses are not supported)")
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_link_local:
        raise ValueError(f"SOFTNIC_DEVICES item {item!r}: link-local IPv6 addresses are not "
                         f"supported (their GID needs a scope)")
    if port and not port.isdigit():
        raise ValueError(f"SOFTNIC_DEVICES item {item!r}: bad port")
    return str(ip), port


def load(environ: dict | None = None) -> RuntimeConfig:
    env = os.environ if environ is None else environ
    raw: dict = {}
    path = env.get(ENV_PREFIX + "CONFIG")
    if path:
        with open(path) as f:
            raw = {str(k).lower(): v for k, v in json.load(f).items()}
    keys = ("devices", "faults", "seed", "capture", "recovery", "min_timer", "backend", "cc",
            "transport", "link_gbps")
    for key in keys:
        v = env.get(ENV_PREFIX + key.upper())
        if v is not None:
            raw[key] = v
    unknown = set(raw) - set(keys)
    if unknown:
        raise ValueError(f"unknown softnic configuration keys: {sorted(unknown)}")
    kw = {}
    if "devices" in raw:
        d = raw["devices"]
        if isinstance(d, dict):
            d = ",".join(f"{k}={v}" for k, v in d.items())
        kw["devices"] = parse_devices(str(d))
    if "faults" in raw:
        kw["faults"] = FaultModel.parse(str(raw["faults"]))
    if "seed" in raw:
        kw["seed"] = int(raw["seed"])
    if raw.get("capture"):
        kw["capture"] = str(raw["capture"])
    if "recovery" in raw:
        r = str(raw["recovery"]).lower()
        if r not in ("gbn", "sr"):
            raise ValueError(f"SOFTNIC_RECOVERY must be 'gbn' or 'sr', not {r!r}")
        kw["selective_repeat"] = r == "sr"
    if "min_timer" in raw:
        kw["min_timer"] = float(raw["min_timer"])
        if not 0 < kw["min_timer"] < 10:
            raise ValueError("SOFTNIC_MIN_TIMER must be in (0, 10) seconds")
    if "backend" in raw:
        b = str(raw["backend"]).lower()
        if b not in ("udp", "sim"):
            raise ValueError(f"SOFTNIC_BACKEND must be 'udp' or 'sim', not {b!r}")
        kw["backend"] = b
    if "cc" in raw:
        import congestion
        kw["cc"] = str(raw["cc"]).strip()
        for _, spec in _cc_items(kw["cc"]):
            try:
                congestion.parse_spec(spec)
            except ValueError as e:
                raise ValueError(f"SOFTNIC_CC: {e}") from None
    if "link_gbps" in raw:
        try:
            g = float(raw["link_gbps"])
        except (TypeError, ValueError):
            g = float("nan")
        if not 0 < g <= 1e4:
            raise ValueError(f"SOFTNIC_LINK_GBPS must be a line rate in Gbit/s in (0, 10000], "
                             f"not {raw['link_gbps']!r}")
        kw["link_gbps"] = g
    if "transport" in raw:
        t = str(raw["transport"]).lower()
        if t not in TRANSPORTS:
            raise ValueError(f"SOFTNIC_TRANSPORT must be 'udp' or 'tcp', not {t!r}")
        kw["transport"] = t
    return RuntimeConfig(**kw)


def _cc_items(text: str) -> list[tuple[str | None, str]]:
    """``dcqcn:g=0.1`` -> [(None, spec)]; ``a=dcqcn;b=hpcc`` -> [("a", ...), ("b", ...)]."""
    items = []
    for item in filter(None, (x.strip() for x in text.split(";"))):
        eq, colon = item.find("="), item.find(":")
        if eq != -1 and (colon == -1 or eq < colon):
            name, spec = item[:eq].strip(), item[eq + 1:].strip()
            if not name or not spec:
                raise ValueError(f"SOFTNIC_CC item {item!r} is not DEVICE=SPEC")
            items.append((name, spec))
        else:
            items.append((None, item))
    if any(n is None for n, _ in items) and len(items) > 1:
        raise ValueError(f"SOFTNIC_CC {text!r}: give one spec for all devices, or "
                         f"DEVICE=SPEC items separated by ';'")
    return items or [(None, "none")]


def cc_for(cfg: RuntimeConfig, device: str) -> str:
    """The congestion-control spec of ``device`` under ``cfg``."""
    for name, spec in _cc_items(cfg.cc):
        if name is None or name == device:
            return spec
    return "none"
