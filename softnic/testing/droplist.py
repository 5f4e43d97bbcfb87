"""``DropList``: a link injector that drops exactly the datagrams you name.

Kept apart from the Hypothesis strategies so that code without Hypothesis
installed (a pytest plugin, a plain unit test) can use it.
"""

from __future__ import annotations

from collections.abc import Iterable

from softnic.driver.faults import COUNTER_NAMES

__all__ = ["DropList", "describe_datagram"]


class DropList:
    """Drops the datagrams of one link direction whose send index is listed.

    Datagrams are numbered 0, 1, 2, ... in the order they are handed to the
    link, whatever they carry: first transmissions, retransmissions, ACKs and
    NAKs all count.  Every other datagram is delivered at once, unaltered (the
    link's propagation delay still applies).  Install it with
    ``fabric.set_injector(src, dst, drop_list)`` or ``drop_list.install(...)``.

    ``dropped`` records ``(index, time, datagram)`` for every drop, so a test
    can say which packet it was (``describe()``).
    """

    __slots__ = ("drops", "counters", "dropped")

    def __init__(self, drops: Iterable[int] = ()) -> None:
        drops = frozenset(drops)
        for i in drops:
            if isinstance(i, bool) or not isinstance(i, int) or i < 0:
                raise ValueError(f"DropList indices are send indices (ints >= 0), got {i!r}")
        self.drops = drops
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.dropped: list[tuple[int, float, bytes]] = []

    def apply(self, data: bytes, now: float) -> list[tuple[float, bytes]]:
        """The ``FaultInjector.apply`` contract: ``[]`` drops, else ``[(now, data)]``."""
        counters = self.counters
        index = counters["sent"]
        counters["sent"] = index + 1
        if index in self.drops:
            counters["dropped_loss"] += 1
            self.dropped.append((index, now, data))
            return []
        counters["delivered"] += 1
        return [(now, data)]

    def install(self, fabric, src, dst) -> DropList:
        """``fabric.set_injector(src, dst, self)``; returns self."""
        fabric.set_injector(src, dst, self)
        return self

    @property
    def unused(self) -> frozenset[int]:
        """Listed indices not reached yet (the link carried fewer datagrams)."""
        return frozenset(i for i in self.drops if i >= self.counters["sent"])

    def describe(self) -> list[str]:
        """One line per drop so far: index, time and what the datagram was."""
        return [f"#{i} at {t * 1e6:.3f} us: {describe_datagram(d)}" for i, t, d in self.dropped]

    def __repr__(self) -> str:
        return f"DropList({sorted(self.drops)!r})"


def describe_datagram(data: bytes) -> str:
    """A RoCEv2 datagram (BTH .. ICRC) in a few words, e.g. ``RC_ACKNOWLEDGE psn 5 NAK
    PSN_SEQUENCE_ERROR``; anything that does not decode is shown by its length."""
    from softnic.wire.roce import AethCode, NakCode, WireError, decode

    try:
        pkt = decode(data[:-4])
    except WireError:
        return f"{len(data)} bytes, not a RoCE packet"
    text = f"{pkt.info.name} qp {pkt.bth.dest_qp:#x} psn {pkt.bth.psn}"
    if pkt.aeth is not None:
        code = pkt.aeth.code
        if code == AethCode.NAK:
            try:
                text += f" NAK {NakCode(pkt.aeth.value).name}"
            except ValueError:
                text += f" NAK {pkt.aeth.value}"
        elif code == AethCode.RNR_NAK:
            text += " RNR NAK"
    if pkt.immdt is not None:
        text += f" imm {pkt.immdt.imm}"
    if pkt.payload:
        text += f" {len(pkt.payload)} B"
    return text
