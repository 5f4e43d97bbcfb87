"""Packet sequence numbers: 24-bit serial arithmetic (IBA 9.7.1, "PSN").

A PSN is 24 bits and wraps.  Two PSNs compare by their distance modulo 2**24:
``a`` is before ``b`` when ``b - a`` lies in the lower half of the range (IBA
9.7.5.1.1's valid/duplicate regions are the two halves around the expected
PSN).  Every PSN mask, wrap and half-range test in softnic goes through this
module; a hot loop may bind these names to locals, never restate them.
"""

from __future__ import annotations

__all__ = ["PSN_BITS", "PSN_MASK", "PSN_MODULUS", "PSN_HALF", "psn_add", "psn_diff",
           "psn_before", "psn_distance"]

PSN_BITS = 24
PSN_MODULUS = 1 << PSN_BITS      # 0x1000000: the number of PSNs
PSN_MASK = PSN_MODULUS - 1       # 0xFFFFFF
PSN_HALF = PSN_MODULUS >> 1      # 0x800000: distances at or above it count backwards


def psn_add(psn: int, n: int) -> int:
    """``psn`` advanced by ``n`` (which may be negative), wrapped to 24 bits."""
    return (psn + n) & PSN_MASK


def psn_distance(a: int, b: int) -> int:
    """How far ``a`` lies after ``b`` going forward: ``(a - b) mod 2**24``, in
    [0, 2**24).  The unsigned form of ``psn_diff``."""
    return (a - b) & PSN_MASK


def psn_diff(a: int, b: int) -> int:
    """Signed distance a - b in 24-bit serial arithmetic, in [-2**23, 2**23)."""
    d = (a - b) & PSN_MASK
    return d - PSN_MODULUS if d & PSN_HALF else d


def psn_before(a: int, b: int) -> bool:
    """``a`` precedes ``b`` (``psn_diff(a, b) < 0``): ``b - a`` in the lower half."""
    return (a - b) & PSN_HALF != 0
