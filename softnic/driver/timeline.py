"""Where a program's time in softnic goes: a timeline of its calls into softnic and
of its devices' work, for a live run of an unmodified program.

``SOFTNIC_TIMELINE=DIR`` makes every live device of the process record, with
``time.monotonic_ns`` (one clock for all processes of the host) and the thread
that did it:

- ``call NAME``: each call of a C face into Python (``ibv_poll_cq``'s
  ``sn_poll_cq``, ``ibv_post_send``'s ``sn_post_send_list``, ...), whole;
- ``post HELD``: ``NIC.post`` within it (HELD 1: its output left for the
  program's next call; 0: sent in it, its ``build`` and ``send`` within);
- ``step INLINE RCVD SENT HELD``: a progress step (``NIC._step``): a polling
  caller's (INLINE 1) or the progress thread's, the packets it received and
  sent, and whether it left output held for the caller's next call;
- ``build N`` and ``send N``: a flush making its N items (``datagram_runs``:
  the requester's and responder's packets, ICRCs and all) and handing them to
  the socket;
- ``sleep WHY``: the progress thread's wait for work (``NIC._sleep``) and why it
  ended: 1 a datagram (4: found while it spun), 2 the bell, 3 output a caller
  held too long, 0 a deadline.

Each device appends to ``DIR/<pid>-<device>.timeline`` every ``KEEP`` events and
when it closes (the calls go to ``DIR/<pid>-calls.timeline``), one event a line:
``KIND START_NS END_NS TID FIELDS...``.  ``softnic timeline DIR`` sums
them per process and prints a window of the merged timeline.  A sampling
profiler can mislead here: one that reads a program embedding the interpreter
(a C face) without stopping it missed most of the interpreter's time, and one
that stops the process changes what the progress thread does (its lease holds
only while its holder runs) (docs/performance.md, "Where a live run's time
goes").  This records what happened, at a microsecond or two an event (about
10 % on ``ucx_perftest -t tag_lat``'s latency).  With the variable unset
nothing is recorded and nothing is wrapped.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

#: where devices write their timelines (None: not recorded)
DIR = os.environ.get("SOFTNIC_TIMELINE") or None
#: events kept in memory before they are appended to the file (writing 100 000 took
#: 0.2 s on a 2-CPU machine in a slow phase, inside the call that made the last of
#: them: a long event in the timeline)
KEEP = 100_000


class Event(NamedTuple):
    kind: str
    start: int              # time.monotonic_ns()
    end: int
    tid: int
    fields: tuple


class Recorder:
    """One device's events, in memory until ``write``."""

    def __init__(self, path: Path):
        self.path = path
        self.events: list[tuple] = []

    def add(self, kind: str, start: int, *fields) -> None:
        events = self.events
        events.append((kind, start, time.monotonic_ns(), threading.get_native_id()) + fields)
        if len(events) >= KEEP:
            self.write()

    def write(self) -> None:
        """Append what was recorded to the device's file (a device closed twice, or
        reopened under the same name, adds to it)."""
        if not self.events:
            return
        events, self.events = self.events, []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.writelines(" ".join(map(str, e)) + "\n" for e in events)


_calls: Recorder | None = None      # the process's calls into Python (one file per process)


def attach(nic) -> Recorder | None:
    """Record ``nic``'s steps, posts, flushes and sleeps: its methods (and its engine's
    and socket's) wrapped on the instances, the classes untouched.  None when
    not recording."""
    if DIR is None:
        return None
    rec = Recorder(Path(DIR) / f"{os.getpid()}-{nic.name}.timeline")
    clock = time.monotonic_ns
    counters = nic.dev.counters
    step, post = nic._step, nic.post

    def traced_step(now, inline=False, ready=False, runs=1, reads=False):
        t0, r0, s0 = clock(), counters["rcvd_pkts"], counters["sent_pkts"]
        try:
            return step(now, inline, ready, runs, reads)
        finally:
            rec.add("step", t0, int(inline), counters["rcvd_pkts"] - r0,
                    counters["sent_pkts"] - s0, int(nic._owed))

    def traced_post(*args):
        t0, held = clock(), nic._posts_held
        try:
            return post(*args)
        finally:
            rec.add("post", t0, nic._posts_held - held)

    inside = [0]        # a send within a send (send_runs sends a lone datagram by send)

    def wrap(obj, name, kind, count):
        fn = getattr(obj, name, None)
        if fn is None:
            return

        def traced(*args):
            if inside[0]:
                return fn(*args)
            t0 = clock()
            inside[0] = 1
            try:
                out = fn(*args)
            finally:
                inside[0] = 0
            rec.add(kind, t0, count(args, out))
            return out
        setattr(obj, name, traced)

    sleep = nic._sleep

    def traced_sleep(timeout, spin=0.0):
        t0 = clock()
        r = sleep(timeout, spin)
        rec.add("sleep", t0, r)
        return r

    nic._step, nic.post, nic._sleep = traced_step, traced_post, traced_sleep
    wrap(nic.dev, "datagram_runs", "build", lambda args, out: len(out))
    wrap(nic.sock, "send", "send", lambda args, out: 1)
    wrap(nic.sock, "send_runs", "send", lambda args, out: len(args[0]))
    return rec


def guard_call(fn):
    """A C face's call ``fn`` (``Externs``), recorded as ``call NAME`` when
    recording; ``fn`` itself otherwise."""
    if DIR is None:
        return fn
    global _calls
    if _calls is None:
        _calls = Recorder(Path(DIR) / f"{os.getpid()}-calls.timeline")
        import atexit
        atexit.register(_calls.write)
    rec, name, clock = _calls, fn.__name__, time.monotonic_ns

    def call(*args):
        t0 = clock()
        try:
            return fn(*args)
        finally:
            rec.add("call", t0, name)
    call.__name__ = name
    return call


def flush_calls() -> None:
    """Write the calls recorded so far (a device closing: a C program may end with
    ``_exit``, past the interpreter's exit handlers)."""
    if _calls is not None:
        _calls.write()


def read(paths) -> dict[int, list[Event]]:
    """The events of the timeline files ``paths`` (directories: every
    ``*.timeline`` in them), by process, each list in time order."""
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(p.glob("*.timeline")) if p.is_dir() else [p])
    out: dict[int, list[Event]] = defaultdict(list)
    for f in files:
        pid = int(f.name.split("-", 1)[0])
        with open(f) as fh:
            for line in fh:
                kind, start, end, tid, *fields = line.split()
                out[pid].append(Event(kind, int(start), int(end), int(tid), tuple(fields)))
    for evs in out.values():
        evs.sort(key=lambda e: e.start)
    return dict(out)


class Row(NamedTuple):
    """One line of ``summary``: the events of a kind (a call: its name; a step:
    whose) in one process."""
    what: str
    count: int
    mean_us: float
    total_ms: float
    share: float            # of the process's span, first event to last


def _label(e: Event) -> str:
    if e.kind == "call":
        return f"call {e.fields[0]}"
    if e.kind == "step":
        return "step, inline" if e.fields[0] == "1" else "step, progress thread"
    if e.kind == "post":
        return "post, held" if e.fields[0] == "1" else "post, sent"
    if e.kind == "sleep":
        return f"sleep, woken by {_WOKEN.get(e.fields[0], e.fields[0])}"
    return e.kind


#: why the progress thread's sleep ended (``NIC._sleep``'s answers)
_WOKEN = {"0": "a deadline", "1": "a datagram", "2": "the bell", "3": "held output",
          "4": "a datagram while spinning"}


def summary(events: list[Event]) -> list[Row]:
    """Per kind of event, most time first."""
    if not events:
        return []
    span = max(e.end for e in events) - min(e.start for e in events) or 1
    n: dict[str, int] = defaultdict(int)
    t: dict[str, int] = defaultdict(int)
    for e in events:
        k = _label(e)
        n[k] += 1
        t[k] += e.end - e.start
    return [Row(k, n[k], t[k] / n[k] / 1e3, t[k] / 1e6, t[k] / span)
            for k in sorted(n, key=lambda k: -t[k])]


def window(by_pid: dict[int, list[Event]], at: float = 0.5, count: int = 40) -> list[str]:
    """``count`` events of all processes merged in time order, from the fraction
    ``at`` of the run on, one line each: microseconds from the first of them,
    duration, process, thread, kind and fields."""
    merged = sorted((e for evs in by_pid.values() for e in evs), key=lambda e: e.start)
    pid_of = {id(e): pid for pid, evs in by_pid.items() for e in evs}
    if not merged:
        return []
    i = min(int(len(merged) * at), len(merged) - 1)
    t0 = merged[i].start
    return [f"{(e.start - t0) / 1e3:10.1f} {(e.end - e.start) / 1e3:8.1f}  "
            f"{pid_of[id(e)]:>7} {e.tid:>7}  {e.kind} {' '.join(e.fields)}"
            for e in merged[i:i + count]]
