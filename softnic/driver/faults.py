"""Seeded fault models for one direction of a link.

A ``FaultModel`` is plain data: what can go wrong on a link and how often.
A ``FaultInjector`` applies one model to a stream of datagrams, drawing every
random choice from the ``random.Random`` it was given, so a run replays
exactly from its seed.  The injector knows nothing about where its output
goes: the simulated fabric schedules the copies it returns in virtual time,
and a real socket's send path can schedule them on a real clock.

Order of effects for each datagram handed to ``FaultInjector.apply``:

1. rate limit: the datagram joins a FIFO of at most ``queue_bytes`` and
   leaves it when serialized at ``rate_bps`` (tail drop when full);
2. loss: i.i.d. with ``loss``, or Gilbert-Elliott when ``p_enter_bad`` > 0;
3. duplication: with ``duplicate`` a second copy is made;
4. per copy: corruption (1..``corrupt_bits`` distinct bits flipped),
   ``delay`` plus uniform ``jitter``, and with ``reorder`` an extra
   ``reorder_delay`` that lets later datagrams overtake it.

Jitter can reorder datagrams too, as netem's does.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, fields

__all__ = ["FaultModel", "FaultInjector", "COUNTER_NAMES", "DEFAULT_QUEUE_BYTES"]

DEFAULT_QUEUE_BYTES = 1 << 20

COUNTER_NAMES = (
    "sent",           # datagrams handed to apply()
    "delivered",      # copies returned (duplicates count twice)
    "dropped_loss",   # lost by i.i.d. loss, or in the good state of a burst model
    "dropped_burst",  # lost in the bad state of a Gilbert-Elliott model
    "dropped_queue",  # tail-dropped by a full rate-limit queue
    "duplicated",
    "corrupted",      # copies with bits flipped
    "reordered",      # copies held back by reorder_delay
)

_PROBABILITIES = ("loss", "p_enter_bad", "p_leave_bad", "loss_bad",
                  "reorder", "duplicate", "corrupt")
_DURATIONS = ("reorder_delay", "delay", "jitter")


@dataclass(frozen=True)
class FaultModel:
    """What goes wrong on one direction of a link.  All times in seconds."""

    loss: float = 0.0
    # Gilbert-Elliott: a two-state chain stepped once per datagram.  In the
    # good state datagrams are lost with ``loss``, in the bad one with
    # ``loss_bad``.  Off while ``p_enter_bad`` is 0.
    p_enter_bad: float = 0.0
    p_leave_bad: float = 1.0
    loss_bad: float = 1.0
    reorder: float = 0.0
    reorder_delay: float = 0.0
    duplicate: float = 0.0
    corrupt: float = 0.0
    corrupt_bits: int = 1
    delay: float = 0.0
    jitter: float = 0.0
    rate_bps: float | None = None
    queue_bytes: int = DEFAULT_QUEUE_BYTES

    def __post_init__(self) -> None:
        for name in _PROBABILITIES:
            value = _number(name, getattr(self, name))
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"FaultModel.{name} is a probability and must be in [0, 1], got {value!r}")
            object.__setattr__(self, name, value)
        for name in _DURATIONS:
            value = _number(name, getattr(self, name))
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"FaultModel.{name} is a time in seconds and must be finite and >= 0, got {value!r}")
            object.__setattr__(self, name, value)
        if self.reorder > 0.0 and self.reorder_delay <= 0.0:
            raise ValueError(
                f"FaultModel.reorder={self.reorder!r} needs reorder_delay > 0 "
                "(how long a held-back datagram waits), e.g. 'reorder=0.01/1e-4'")
        bits = self.corrupt_bits
        if isinstance(bits, bool) or not isinstance(bits, int) or bits < 1:
            raise ValueError(f"FaultModel.corrupt_bits is the most bits flipped per corruption and must be an int >= 1, got {bits!r}")
        if self.rate_bps is not None:
            rate = _number("rate_bps", self.rate_bps)
            if not (rate > 0.0 and math.isfinite(rate)):
                raise ValueError(f"FaultModel.rate_bps must be None (no limit) or a finite rate > 0 in bits/s, got {rate!r}")
            object.__setattr__(self, "rate_bps", rate)
        queue = self.queue_bytes
        if isinstance(queue, bool) or not isinstance(queue, int) or queue < 0:
            raise ValueError(f"FaultModel.queue_bytes must be an int >= 0, got {queue!r}")

    def __repr__(self) -> str:
        """Only the fields that differ from a perfect link, still valid Python:
        a falsifying example stays short and replayable."""
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                   if getattr(self, f.name) != f.default]
        return f"FaultModel({', '.join(changed)})"

    @classmethod
    def none(cls) -> FaultModel:
        """A perfect link: nothing lost, delayed or altered.  (FaultModel's own is
        made once: a model is frozen, and a fabric asks for one per link.)"""
        if cls is FaultModel:
            return _PERFECT
        return cls()

    def is_none(self) -> bool:
        """True when applying this model never changes, drops or delays anything."""
        return (self.loss == 0.0 and self.p_enter_bad == 0.0 and self.reorder == 0.0
                and self.duplicate == 0.0 and self.corrupt == 0.0 and self.delay == 0.0
                and self.jitter == 0.0 and self.rate_bps is None)

    # -- text form, for the command line and environment variables ---------

    @classmethod
    def parse(cls, text: str) -> FaultModel:
        """Parse ``"loss=0.02,dup=0.01,burst=0.01/0.3/0.8,rate=1e9"``.

        Keys: ``loss``; ``burst=ENTER/LEAVE[/LOSS_BAD]``; ``reorder=P[/DELAY]``;
        ``dup``; ``corrupt=P[/BITS]``; ``delay``; ``jitter``; ``rate``;
        ``queue``; and every field name itself.  Probabilities may end in
        ``%``, times in ``s``/``ms``/``us``/``ns``, rates in ``k``/``M``/``G``/``T``
        (optionally followed by ``bps``).  ``""`` and ``"none"`` give a perfect link.
        """
        text = text.strip()
        if text in ("", "none"):
            return cls()
        values: dict[str, object] = {}
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, raw = item.partition("=")
            key, raw = key.strip(), raw.strip()
            if not sep or not raw:
                raise ValueError(f"fault spec item {item!r} is not KEY=VALUE")
            try:
                parser = _PARSERS[key]
            except KeyError:
                raise ValueError(f"unknown fault spec key {key!r}; known: {', '.join(sorted(_PARSERS))}") from None
            try:
                parsed = parser(raw)
            except ValueError as exc:
                raise ValueError(f"fault spec {item!r}: {exc}") from None
            for name, value in parsed.items():
                if name in values:
                    raise ValueError(f"fault spec sets {name} twice (in {item!r})")
                values[name] = value
        return cls(**values)  # type: ignore[arg-type]

    def __str__(self) -> str:
        d = _DEFAULT
        parts = []
        if self.loss != d.loss:
            parts.append(f"loss={self.loss!r}")
        if (self.p_enter_bad, self.p_leave_bad, self.loss_bad) != (d.p_enter_bad, d.p_leave_bad, d.loss_bad):
            parts.append(f"burst={self.p_enter_bad!r}/{self.p_leave_bad!r}/{self.loss_bad!r}")
        if self.reorder != d.reorder or self.reorder_delay != d.reorder_delay:
            parts.append(f"reorder={self.reorder!r}/{_format_time(self.reorder_delay)}")
        if self.duplicate != d.duplicate:
            parts.append(f"dup={self.duplicate!r}")
        if self.corrupt != d.corrupt or self.corrupt_bits != d.corrupt_bits:
            parts.append(f"corrupt={self.corrupt!r}/{self.corrupt_bits}")
        if self.delay != d.delay:
            parts.append(f"delay={_format_time(self.delay)}")
        if self.jitter != d.jitter:
            parts.append(f"jitter={_format_time(self.jitter)}")
        if self.rate_bps is not None:
            parts.append(f"rate={self.rate_bps!r}")
        if self.queue_bytes != d.queue_bytes:
            parts.append(f"queue={self.queue_bytes}")
        return ",".join(parts) if parts else "none"


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"FaultModel.{name} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"FaultModel.{name} must not be NaN")
    return value


def _parse_probability(raw: str) -> float:
    if raw.endswith("%"):
        return float(raw[:-1]) / 100.0
    return float(raw)


_TIME_UNITS = (("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0))
_RATE_UNITS = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _parse_time(raw: str) -> float:
    for suffix, scale in _TIME_UNITS:
        if raw.endswith(suffix):
            return float(raw[:-len(suffix)]) * scale
    return float(raw)


def _format_time(seconds: float) -> str:
    """``seconds`` as a fault spec writes it: below a second, in the largest unit
    that holds at least 1 of it and whose short form ``_parse_time`` reads back as
    exactly the same float (``20us``, not ``1.9999999999999998e-05``); else the
    plain number of seconds."""
    for suffix, scale in reversed(_TIME_UNITS[:-1]):       # ms, us, ns
        if scale <= seconds < 1.0:
            text = f"{seconds / scale:.12g}{suffix}"
            if _parse_time(text) == seconds:
                return text
    return repr(seconds)


def _parse_rate(raw: str) -> float | None:
    if raw == "none":
        return None
    if raw.endswith("bps"):
        raw = raw[:-3]
    if raw and raw[-1] in _RATE_UNITS:
        return float(raw[:-1]) * _RATE_UNITS[raw[-1]]
    return float(raw)


def _parse_int(raw: str) -> int:
    value = float(raw)
    if not value.is_integer():
        raise ValueError(f"{raw!r} is not a whole number")
    return int(value)


def _fields(raw: str, names: tuple[str, ...], parsers: tuple, least: int) -> dict[str, object]:
    pieces = raw.split("/")
    if not least <= len(pieces) <= len(names):
        raise ValueError(f"expected {'/'.join(n.upper() for n in names)} ({least} to {len(names)} values)")
    return {name: parse(piece.strip()) for name, parse, piece in zip(names, parsers, pieces)}


def _single(name: str, parse):
    return lambda raw: {name: parse(raw)}


_PARSERS = {
    "loss": _single("loss", _parse_probability),
    "burst": lambda raw: _fields(raw, ("p_enter_bad", "p_leave_bad", "loss_bad"),
                                 (_parse_probability,) * 3, 2),
    "reorder": lambda raw: _fields(raw, ("reorder", "reorder_delay"),
                                   (_parse_probability, _parse_time), 1),
    "dup": _single("duplicate", _parse_probability),
    "corrupt": lambda raw: _fields(raw, ("corrupt", "corrupt_bits"),
                                   (_parse_probability, _parse_int), 1),
    "rate": _single("rate_bps", _parse_rate),
    "queue": _single("queue_bytes", _parse_int),
}
for _f in fields(FaultModel):
    if _f.name in _PARSERS:
        continue
    if _f.name in _PROBABILITIES:
        _PARSERS[_f.name] = _single(_f.name, _parse_probability)
    elif _f.name in _DURATIONS:
        _PARSERS[_f.name] = _single(_f.name, _parse_time)
    elif _f.name == "rate_bps":
        _PARSERS[_f.name] = _single(_f.name, _parse_rate)
    else:
        _PARSERS[_f.name] = _single(_f.name, _parse_int)
del _f

_DEFAULT = FaultModel()


class FaultInjector:
    """Applies one ``FaultModel`` to the datagrams of one link direction.

    State (the Gilbert-Elliott chain, the rate-limit queue) belongs to that
    direction; every random choice comes from ``rng``.
    """

    __slots__ = ("model", "rng", "counters", "in_bad_state", "_queue", "_queued_bytes",
                 "_busy_until", "_passthrough", "_params", "drops_only")

    def __init__(self, model: FaultModel, rng: random.Random) -> None:
        self.model = model
        self.rng = rng
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.in_bad_state = False
        self._queue: deque[tuple[float, int]] = deque()  # (departure time, size) still in the queue
        self._queued_bytes = 0
        self._busy_until = 0.0
        self._passthrough = model.is_none()
        m = model
        self._params = (m.rate_bps, m.queue_bytes, m.loss, m.p_enter_bad, m.p_leave_bad, m.loss_bad,
                        m.duplicate, m.corrupt, m.delay, m.jitter, m.reorder, m.reorder_delay)
        #: the model at most drops each datagram on its own, at once (``apply_run``)
        self.drops_only = self._passthrough or not (
            m.rate_bps is not None or m.p_enter_bad or m.delay or m.duplicate or m.corrupt
            or m.jitter or m.reorder)

    @property
    def busy_until(self) -> float:
        """When the rate limiter finishes serializing what it holds now."""
        return self._busy_until

    def queued_bytes(self, now: float) -> int:
        """Bytes in the rate-limit queue (waiting or being serialized) at ``now``."""
        self._expire(now)
        return self._queued_bytes

    def _expire(self, now: float) -> None:
        if self._busy_until <= now:
            self._queue.clear()
            self._queued_bytes = 0
            return
        queue = self._queue
        while queue[0][0] <= now:
            self._queued_bytes -= queue.popleft()[1]

    def apply_run(self, n: int, now: float) -> list[int] | None:
        """``apply`` for ``n`` datagrams sent together at ``now``, where the model
        at most drops each on its own (no pacing, bursts, delay, duplicates,
        corruption, jitter or reordering): the indexes of those delivered now,
        after the same draws and counts as ``n`` calls of ``apply``.  None where
        the model does more (then ``apply`` each)."""
        if not self.drops_only:
            return None
        loss = self._params[2]
        counters = self.counters
        counters["sent"] += n
        if self._passthrough or not loss:
            counters["delivered"] += n
            return list(range(n))
        rnd = self.rng.random
        keep = [i for i in range(n) if not rnd() < loss]
        counters["dropped_loss"] += n - len(keep)
        counters["delivered"] += len(keep)
        return keep

    def apply(self, data: bytes, now: float) -> list[tuple[float, bytes]]:
        """Return the ``(delivery time, bytes)`` copies of ``data`` sent at ``now``.

        An empty list means the datagram was dropped.  Copies are in the order
        they were made, not sorted by time.
        """
        counters = self.counters
        counters["sent"] += 1
        if self._passthrough:
            counters["delivered"] += 1
            return [(now, data)]
        (rate, queue_bytes, loss, p_enter_bad, p_leave_bad, loss_bad, duplicate,
         corrupt, delay, jitter, reorder, reorder_delay) = self._params
        rng = self.rng

        t = now
        if rate is not None:
            t = self._pace(len(data), now, rate, queue_bytes)
            if t is None:
                counters["dropped_queue"] += 1
                return []

        if p_enter_bad:
            if self.in_bad_state:
                if rng.random() < p_leave_bad:
                    self.in_bad_state = False
            elif rng.random() < p_enter_bad:
                self.in_bad_state = True
            if self.in_bad_state:
                if loss_bad and rng.random() < loss_bad:
                    counters["dropped_burst"] += 1
                    return []
            elif loss and rng.random() < loss:
                counters["dropped_loss"] += 1
                return []
        elif loss and rng.random() < loss:
            counters["dropped_loss"] += 1
            return []

        t += delay
        if not (duplicate or corrupt or jitter or reorder):
            counters["delivered"] += 1
            return [(t, data)]

        copies = 1
        if duplicate and rng.random() < duplicate:
            copies = 2
            counters["duplicated"] += 1
        out = []
        for _ in range(copies):
            copy = data
            if corrupt and data and rng.random() < corrupt:
                copy = self._flip_bits(data)
                counters["corrupted"] += 1
            at = t
            if jitter:
                at += rng.random() * jitter
            if reorder and rng.random() < reorder:
                at += reorder_delay
                counters["reordered"] += 1
            out.append((at, copy))
        counters["delivered"] += copies
        return out

    def _pace(self, size: int, now: float, rate: float, queue_bytes: int) -> float | None:
        """When a datagram of ``size`` bytes sent at ``now`` has left the rate-limited
        link, or None if the queue in front of it has no room."""
        busy_until = self._busy_until
        if busy_until > now:
            queue = self._queue
            queued = self._queued_bytes
            while queue[0][0] <= now:
                queued -= queue.popleft()[1]
            # A datagram reaching an empty queue is always taken, so
            # queue_bytes=0 means "no buffer": drop whatever arrives while
            # the link is busy.
            if queued + size > queue_bytes:
                self._queued_bytes = queued
                return None
            t = busy_until + size * 8 / rate
        else:
            queue = self._queue
            queue.clear()
            queued = 0
            t = now + size * 8 / rate
        self._busy_until = t
        queue.append((t, size))
        self._queued_bytes = queued + size
        return t

    def _flip_bits(self, data: bytes) -> bytes:
        nbits = len(data) * 8
        count = self.rng.randint(1, min(self.model.corrupt_bits, nbits))
        buf = bytearray(data)
        for bit in self.rng.sample(range(nbits), count):
            buf[bit >> 3] ^= 0x80 >> (bit & 7)
        return bytes(buf)


#: ``FaultModel.none()``
_PERFECT = FaultModel()
