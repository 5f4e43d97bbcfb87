"""Numbers and switches from the environment (``SOFTNIC_*`` tunables).

A variable that is unset or empty (``SOFTNIC_COLL_QPS= cmd``) means the default; one
that does not parse is refused with an error that names it, not a bare ``ValueError``
from deep inside an import.
"""

from __future__ import annotations

import os


def number(name: str, default, kind=int):
    """``kind(os.environ[name])``, or ``default`` if the variable is unset or blank."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{name}={raw!r}: expected {what}") from None


def flag(name: str, default: bool = True) -> bool:
    """A switch: False if the variable is ``0``, ``no``, ``off`` or ``false`` (any
    case), True if it is anything else, ``default`` if it is unset or blank."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    return raw not in ("0", "no", "off", "false")
