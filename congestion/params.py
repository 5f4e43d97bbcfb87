"""Controller parameters: declared once per controller, validated, parsed with units.

Each controller class lists its parameters in ``PARAMS`` (name -> ``Param``).
From that one table come keyword validation in the constructor, the unit
parsing of one-line specs (``dcqcn:t_inc=55us,rai=40Mbps``) and the tables in
docs/congestion.md.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from dataclasses import dataclass
from typing import Any

#: slack when comparing times: ``55 * 1e-6`` and ``55e-6`` are different floats,
#: and a timer set for one must fire at the other
TIME_EPS = 1e-12

#: what a parameter holds, and so which unit suffixes its text may carry
KINDS = ("float", "int", "time", "rate", "size")

# scales as exact decimals, so "55us" is the same float as the literal 55e-6
_TIME_UNITS = {"ns": Decimal("1e-9"), "us": Decimal("1e-6"), "ms": Decimal("1e-3"),
               "s": Decimal(1)}
_RATE_UNITS = {"bps": Decimal(1), "kbps": Decimal(10**3), "mbps": Decimal(10**6),
               "gbps": Decimal(10**9), "tbps": Decimal(10**12)}
_SIZE_UNITS = {"b": Decimal(1), "kb": Decimal(1000), "kib": Decimal(1024),
               "mb": Decimal(1000**2), "mib": Decimal(1024**2),
               "gb": Decimal(1000**3), "gib": Decimal(1024**3)}
_UNITS = {"time": _TIME_UNITS, "rate": _RATE_UNITS, "size": _SIZE_UNITS}
_UNIT_HINT = {"time": "ns/us/ms/s", "rate": "bps/Kbps/Mbps/Gbps",
              "size": "B/KB/KiB/MB/MiB"}
_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]*)\s*$")


@dataclass(frozen=True)
class Param:
    """One keyword parameter of a controller.

    ``lo``/``hi`` bound the value (``lo_open``/``hi_open``: strictly);
    ``none_ok``: None is allowed and means "derive from the flow" (see doc).
    """
    default: Any
    kind: str
    doc: str
    source: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    none_ok: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown parameter kind {self.kind!r}")

    def describe_range(self) -> str:
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {self.lo:g}")
        if self.hi is not None:
            parts.append(f"{'<' if self.hi_open else '<='} {self.hi:g}")
        return " and ".join(parts) or "any number"


def parse_value(kind: str, text: str) -> float | int:
    """Turn ``55us``/``40Mbps``/``10MB``/``0.5`` into seconds/bits/s/bytes/number.

    A bare number is already in the base unit (s, bits/s, bytes).
    """
    m = _NUMBER.match(text)
    if not m:
        raise ValueError(f"not a number: {text!r}")
    number, unit = m.groups()
    if kind in ("float", "int"):
        if unit:
            raise ValueError(f"{text!r}: a plain number takes no unit")
        if kind == "int":
            try:
                return int(number)
            except ValueError:
                raise ValueError(f"{text!r}: not an integer") from None
        return float(number)
    scale = Decimal(1)
    if unit:
        units = _UNITS[kind]
        if unit.lower() not in units:
            raise ValueError(f"{text!r}: unit {unit!r} is not a {kind} unit "
                             f"({_UNIT_HINT[kind]})")
        scale = units[unit.lower()]
    try:
        exact = Decimal(number) * scale
    except ArithmeticError:
        raise ValueError(f"{text!r}: out of range") from None
    if kind == "size":
        if exact != exact.to_integral_value():
            raise ValueError(f"{text!r}: not a whole number of bytes")
        return int(exact)
    return float(exact)


def check_value(owner: str, name: str, param: Param, value: Any) -> Any:
    """Validate (and for text, parse) one value; return it in its base unit."""
    where = f"{owner}: parameter {name}"
    if value is None:
        if param.none_ok:
            return None
        raise ValueError(f"{where} may not be None")
    if isinstance(value, str):
        try:
            value = parse_value(param.kind, value)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{where} must be finite, not {value!r}")
    if param.kind in ("int", "size") and value != int(value):
        raise ValueError(f"{where} must be a whole number, not {value!r}")
    if param.kind in ("int", "size"):
        value = int(value)
    else:
        value = float(value)
    bad_lo = param.lo is not None and (value <= param.lo if param.lo_open else value < param.lo)
    bad_hi = param.hi is not None and (value >= param.hi if param.hi_open else value > param.hi)
    if bad_lo or bad_hi:
        raise ValueError(f"{where} must be {param.describe_range()}, not {value!r}")
    return value


def resolve(owner: str, table: dict[str, Param], given: dict[str, Any]) -> dict[str, Any]:
    """Defaults overridden by ``given``; unknown names and bad values raise ValueError."""
    unknown = sorted(set(given) - set(table))
    if unknown:
        known = f"known: {', '.join(sorted(table))}" if table else "it takes none"
        raise ValueError(f"{owner}: unknown parameter(s) {', '.join(unknown)} ({known})")
    out = dict(_defaults(owner, table))
    for name, value in given.items():
        out[name] = check_value(owner, name, table[name], value)
    return out


#: (owner, table) -> (table, its defaults checked): a controller is made per QP,
#: mostly with its defaults, which are the same each time
_DEFAULTS: dict[tuple[str, int], tuple[dict, dict]] = {}


def _defaults(owner: str, table: dict[str, Param]) -> dict[str, Any]:
    """``table``'s defaults, each checked as a given value is (once per table)."""
    key = (owner, id(table))
    hit = _DEFAULTS.get(key)
    if hit is None or hit[0] is not table:
        hit = _DEFAULTS[key] = (table, {name: check_value(owner, name, p, p.default)
                                        for name, p in table.items()})
    return hit[1]


def check_flow(owner: str, flow: Any) -> None:
    """The path facts every controller relies on must be sane."""
    for field in ("line_rate_bps", "mtu", "base_rtt"):
        value = getattr(flow, field, None)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{owner}: flow.{field} must be a positive number, not {value!r}")
    n = getattr(flow, "expected_flows", None)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"{owner}: flow.expected_flows must be a positive integer or None, "
                         f"not {n!r}")


def check_below_line_rate(owner: str, params: dict[str, Any], flow: Any, *keys: str) -> None:
    """Rates among ``params[keys]`` (None: derived) may not exceed the flow's line rate."""
    line = float(flow.line_rate_bps)
    for key in keys:
        if params[key] is not None and params[key] > line:
            raise ValueError(f"{owner}: parameter {key} ({params[key]:g} bit/s) is above "
                             f"the line rate ({line:g} bit/s)")


def format_value(kind: str, value: Any) -> str:
    """A value in the units a person would write it in (and parse_spec reads back)."""
    if value is None:
        return "derived"
    if kind == "time":
        for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
            if value >= scale or unit == "ns":
                return f"{value / scale:g}{unit}"
    if kind == "rate":
        for unit, scale in (("Gbps", 1e9), ("Mbps", 1e6), ("Kbps", 1e3), ("bps", 1.0)):
            if value >= scale or unit == "bps":
                return f"{value / scale:g}{unit}"
    if kind == "size":
        for unit, scale in (("MB", 10**6), ("KB", 10**3), ("B", 1)):
            if value % scale == 0 or unit == "B":
                return f"{value // scale}{unit}"
    return f"{value:g}"


def markdown_table(table: dict[str, Param]) -> str:
    """The parameter table of one controller, as docs/congestion.md shows it."""
    rows = ["| parameter | default | meaning | source |", "|---|---|---|---|"]
    for name, p in table.items():
        rows.append(f"| `{name}` | `{format_value(p.kind, p.default)}` | {p.doc} | {p.source} |")
    return "\n".join(rows)
