"""Congestion controllers behind one small interface, picked by name.

The registry is the explicit dict ``CONTROLLERS``; a new controller is added
by importing its class here and adding one entry (see docs/congestion.md).

    >>> flow = FlowInfo(line_rate_bps=100e9, mtu=4096, base_rtt=8e-6)
    >>> name, params = parse_spec("dcqcn:g=0.00390625,t_inc=55us,rai=40Mbps")
    >>> cc = create(name, flow, **params)
"""

from __future__ import annotations

from typing import Any

from .base import Controller, FlowInfo, Hop
from .dcqcn import DCQCN
from .hpcc import HPCC
from .params import Param, check_value
from .swift import Swift
from .timely import Timely

CONTROLLERS: dict[str, type[Controller]] = {
    "none": Controller,
    "dcqcn": DCQCN,
    "timely": Timely,
    "swift": Swift,
    "hpcc": HPCC,
}

__all__ = ["CONTROLLERS", "Controller", "FlowInfo", "Hop", "Param", "create",
           "parse_spec", "from_spec", "params_of"]


def _lookup(name: str) -> type[Controller]:
    try:
        return CONTROLLERS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(CONTROLLERS))
        raise ValueError(f"unknown congestion controller {name!r} (known: {known})") from None


def params_of(name: str) -> dict[str, Param]:
    """The parameter table of controller ``name`` (empty for "none")."""
    return dict(getattr(_lookup(name), "PARAMS", {}))


def create(name: str, flow: FlowInfo, **params: Any) -> Controller:
    """A new controller ``name`` for one flow; values may be numbers or unit text."""
    return _lookup(name)(flow, **params)


def parse_spec(text: str) -> tuple[str, dict[str, Any]]:
    """``"dcqcn:g=0.00390625,t_inc=55us,rai=40Mbps"`` -> ``("dcqcn", {...})``.

    Values come back in base units (s, bits/s, bytes); units accepted are
    ns/us/ms/s, bps/Kbps/Mbps/Gbps and B/KB/KiB/MB/MiB.  Each value is checked
    against its parameter's range here; checks that need the flow (a rate
    against line rate) happen in ``create``.
    """
    if not isinstance(text, str):
        raise ValueError(f"congestion spec must be text, not {text!r}")
    name, sep, rest = text.strip().partition(":")
    name = name.strip().lower()
    if not name:
        raise ValueError(f"congestion spec {text!r}: no controller name")
    table = params_of(name)
    params: dict[str, Any] = {}
    if sep and not rest.strip():
        raise ValueError(f"congestion spec {text!r}: nothing after ':'")
    for item in rest.split(",") if sep else ():
        key, eq, value = (s.strip() for s in item.partition("="))
        if not key or not eq or not value:
            raise ValueError(f"congestion spec {text!r}: expected key=value, got {item.strip()!r}")
        if key not in table:
            known = f"known: {', '.join(sorted(table))}" if table else "it takes none"
            raise ValueError(f"congestion spec {text!r}: {name} has no parameter {key!r} "
                             f"({known})")
        if key in params:
            raise ValueError(f"congestion spec {text!r}: parameter {key!r} given twice")
        params[key] = check_value(name, key, table[key], value)
    return name, params


def from_spec(text: str, flow: FlowInfo) -> Controller:
    """``create(*parse_spec(text))`` for one flow."""
    name, params = parse_spec(text)
    return create(name, flow, **params)
