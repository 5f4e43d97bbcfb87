"""softnic.collectives ranks in virtual time, one per host of a simulated fabric.

``VirtualCluster`` runs one program per rank as cooperative tasks: one at a
time, in an order fixed by the simulation, so a run depends only on its seed.  Every rank opens its own engine ``Device``
through the pyverbs API (``verbs_api``, as under ``softnic exec`` with
``SOFTNIC_BACKEND=sim``), attached to a ``softnic.transport.sim.Fabric`` (a
leaf-spine, say).  The collectives are the real ones: ``Communicator``, the
algorithms, the ``Transport`` and its chunking, credits and QPs per peer; what
differs is how a rank *waits*, and when it connects.  ``VirtualTransport``
replaces the three waiting methods of ``Transport``: where a rank in real time
would poll and nap, a rank here blocks until a completion reaches its CQ, and
the scheduler moves virtual time forward only while every rank is blocked.  It
also connects a pair only when a call first uses it (``connect_on_use``), both
ends at once, not every pair at start: a ring's rank holds QPs to its two
neighbours.  A rank's own work (posting, polling, reducing) takes no virtual time: it models a host
with a core to spare for its NIC, which reacts to each completion at once.

The store (``VirtualStore``) blocks the same way until a key is set.

Each rank is a greenlet (``greenlet``, a switch costs about a microsecond), or
where that package is missing a thread handed the turn through a lock (each
switch then waits for the OS to schedule the thread: several times slower on a
loaded machine).  A rank's program is any function ``program(rank, cluster)``;
the scheduler:

1. runs every runnable rank until it blocks (on its CQ, a store key, a
   deadline) or returns;
2. flushes the output of the devices those ranks touched;
3. runs the fabric until a blocked rank's CQ gets a completion, a deadline
   or the next sample time comes, or nothing is left to happen (then the
   ranks are deadlocked: an error names what each waits for).

Payload memory: ``buffer(rank, nbytes)`` gives a rank its own zeroed memory, or
with ``shared_payload=True`` the start of one mapping that every buffer of every
rank shares (registrations then overlap, each checked as usual; the pages are
mapped, and counted in the process's resident memory, once: a mapping of the
same pages per buffer counted them once per buffer).  Shared pages make a 64-rank
collective of hundreds of MB fit in memory; their values are then meaningless,
and nothing else changes (the collectives never branch on data:
``tests/test_virtual_collectives.py`` checks that the timing is the same).
"""

from __future__ import annotations

import heapq
import mmap
import random
import threading
from collections import defaultdict, deque
from contextlib import nullcontext
from typing import Any, Callable

import numpy as np

try:                           # switching between ranks in about a microsecond
    import greenlet as _greenlet
except ImportError:            # threads handing a lock over: the OS schedules each switch
    _greenlet = None

import softnic.driver.nic as _nic
from softnic.driver import config as _config
from softnic.core.device import Device, DeviceConfig

from . import _verbs as _v
from .transport import CollectiveError, Transport

__all__ = ["VirtualCluster", "VirtualTransport", "VirtualStore", "Deadlock"]


class Deadlock(RuntimeError):
    """Every rank waits and nothing left in the fabric can wake one."""


class _Abort(BaseException):
    """Raised in a rank's thread when the run is abandoned (another rank failed)."""


def _baton() -> threading.Lock:
    """A lock held from the start: ``release`` hands the turn over, ``acquire`` waits
    for it (a plain lock is the cheapest such handover between two threads)."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class _Task:
    __slots__ = ("rank", "sem", "thread", "glet", "state", "cq", "key", "deadline", "result",
                 "error", "wait")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.sem = None
        self.thread: threading.Thread | None = None
        self.glet = None
        self.state = "new"        # new, run, cq, key, tick, done
        self.cq = None            # the engine CQ it waits on
        self.key = None           # the store key it waits for
        self.deadline = None      # virtual time it wakes at, whatever happens
        self.wait = 0             # counts its waits (a deadline entry names the one it is of)
        self.result = None
        self.error: BaseException | None = None


class VNIC(_nic.SharedDevice):
    """A device of the virtual cluster with the interface ``verbs_api`` expects of
    ``softnic.driver.nic.SimNIC``.  Verbs calls run at once and mark the device for the
    scheduler's flush; polling does not move time (the scheduler does)."""

    poll_others = False          # an empty poll need not move the other devices along

    def __init__(self, cluster: "VirtualCluster", spec: _config.DeviceSpec, dev: Device):
        self.world = cluster
        self.name = spec.name
        self.ip, self.port = dev.address
        self.dev = dev
        self.gid = dev.gid
        self.refs = 0
        self.lock = nullcontext()
        self._closed = False

    def call(self, fn, *args, **kw):
        self.world.dirty[self.dev.address] = None
        return fn(*args, **kw)

    def poll(self, runs: int = 1, reads: bool = False) -> None:
        pass

    def wait_until(self, pred, timeout: float | None = None) -> bool:
        """Block (in virtual time) until ``pred()``, re-checked after every step of
        the fabric; ``timeout`` in virtual seconds."""
        w = self.world
        end = None if timeout is None else w.now + timeout
        while not pred():
            if end is not None and w.now >= end:
                return False
            w._block("tick", end)
        return True

    @property
    def counters(self) -> dict[str, int]:
        return dict(self.dev.counters)

    def publish_counters(self, final: bool = False) -> None:
        pass

    def close(self) -> None:
        self._closed = True


class VirtualStore:
    """A key-value store for the ranks of one virtual cluster: ``get`` blocks the
    calling rank (in virtual time: not at all) until some rank ``set``s the key."""

    def __init__(self, cluster: "VirtualCluster") -> None:
        self.cluster = cluster
        self.data: dict[str, bytes] = {}
        self.waiters: dict[str, list[_Task]] = defaultdict(list)

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(value)
        for t in self.waiters.pop(key, ()):
            if t.state == "key":
                self.cluster._wake(t)

    def get(self, key: str) -> bytes:
        while key not in self.data:
            self.waiters[key].append(self.cluster.current)
            self.cluster._block("key", None, key=key)
        return self.data[key]

    def add(self, key: str, n: int) -> int:
        v = int(self.data.get(key, b"0")) + n
        self.set(key, str(v).encode())
        return v


class VirtualTransport(Transport):
    """The collectives' ``Transport`` with its waits in virtual time.  Also records,
    for the figures, when each message starts (its first chunk posted) and ends (its
    last chunk taken by the receiver): ``cluster.flows``."""

    #: the engine's window: on the simulated fabric an ACK's round trip is the
    #: fabric's, as the experiments' results assume
    window = None
    #: chunks of a quarter of a message, at least 64 KiB: in virtual time a chunk costs
    #: no CPU time of its own, and the experiments' pipelining is the fabric's concern
    min_chunk_default = 64 * 1024
    #: every receive through the ring: what a copy out of it costs is CPU time, which
    #: virtual time does not count, and the experiments' messages stay as they were
    direct_default = 0
    #: credits back whenever a rank idles: in virtual time a return costs no CPU time,
    #: and the experiments' results were made with it
    idle_credits = True
    #: QPs to the peers a collective uses, made when it first does: the 256 ranks of a
    #: ring make 512 QPs, not 65 280 (a full mesh's set-up and memory grow with
    #: the square of the ranks); a pair is connected, both ends, in no virtual time
    connect_on_use = True

    def __init__(self, cluster: "VirtualCluster", rank: int, world: int, **kw):
        self.vc = cluster
        self._psns = random.Random(f"{cluster.seed}/psn/{rank}")
        self._keep_regions: list = []
        kw.setdefault("timeout", 10.0)          # virtual seconds without progress
        super().__init__(rank, world, cluster.store, device=cluster.device_name(rank), **kw)
        self._ecq = self.cq.engine_cq
        cluster._own_cq(self._ecq, rank)

    def _connect(self, peers: list[int]) -> None:
        # from here on (its state made) a peer may connect to this rank (``_connect_now``)
        self._sq_psns: dict[int, list[int]] = {}    # peers connected to RTR, not yet RTS
        self.vc.transports[(self.prefix, self.rank)] = self
        super()._connect(peers)

    def _connect_now(self, peers: list[int]) -> None:
        # A pair is taken to RTR at both ends by whichever rank uses it first; each end
        # goes on to RTS when its own rank first does, before its posts, and in peer
        # order: a device serves its QPs in the order they became ready to send, which
        # is then the order of an eager mesh's connections (peer order), not of the
        # other ranks' calls.
        me = self.rank
        for p in peers:
            if p in self.qps:
                continue
            other = self.vc.transports.get((self.prefix, p))
            if other is None:
                raise CollectiveError(f"rank {me}: rank {p} has no transport "
                                      f"{self.prefix!r} to connect to")
            self._add_peer(p)
            other._add_peer(me)
            mine = [self._initial_psn() for _ in self.qps[p]]
            theirs = [other._initial_psn() for _ in other.qps[me]]
            self._to_rtr(p, [qp.qp_num for qp in other.qps[me]], theirs)
            other._to_rtr(me, [qp.qp_num for qp in self.qps[p]], mine)
            self._sq_psns[p] = mine
            other._sq_psns[me] = theirs
        for p in peers:
            psns = self._sq_psns.pop(p, None)
            if psns is not None:
                self._to_rts(p, psns)

    def close(self) -> None:
        self.vc.transports.pop((self.prefix, self.rank), None)
        super().close()

    def _region(self, nbytes: int, access: int):
        # the virtual cluster's memory: pages are touched only where chunks land
        # (allocated and zeroed in full, a 64-rank ring of slots would be 32 GB)
        mem = self.vc.buffer(self.rank, nbytes)
        mr = _v.MR(self.pd, nbytes, access, address=mem.ctypes.data)
        self._keep_regions.append(mem)
        return mr

    def _initial_psn(self) -> int:
        return self._psns.getrandbits(24)

    def _started(self) -> None:
        self._last = self.vc.now

    def _progressed(self) -> None:
        self._last = self.vc.now

    def _poll(self) -> bool:
        # While a rank runs nothing but its own calls adds to its CQ (the fabric moves
        # only while every rank waits), so the engine CQ's entries say what a poll
        # would find: a poll is made only while there are some, never the empty one
        # that ends ``Transport._poll``'s loop (about half of a rank's polls).
        ecq = self._ecq
        if not ecq.entries:
            return False
        poll, completed = self.cq.poll, self._completed
        while ecq.entries:
            completed(poll(32)[1])
        return True

    def _idle(self, streams) -> None:
        if not self.vc.wait_cq(self._ecq, self._last + self.timeout):
            self._stalled(streams, f"{self.timeout:g} s of virtual time")

    def drain(self, timeout: float = 10.0) -> None:
        end = self.vc.now + timeout
        while any(self.sq_out):
            if not self._poll() and not self.vc.wait_cq(self._ecq, end):
                return

    def _post_chunk(self, st, qi: int) -> None:
        if st.k == 0:
            self.vc.flows[(self.rank, st.peer)][0].append(self.vc.now)
        super()._post_chunk(st, qi)

    def _consume(self, st) -> None:
        i = st.i
        super()._consume(st)
        if st.i != i:
            self.vc.flows[(st.peer, self.rank)][1].append(self.vc.now)


class _Sim:
    """What ``softnic.driver.nic`` asks of a simulated world: devices open in it."""

    def __init__(self, cluster: "VirtualCluster") -> None:
        self.cluster = cluster

    def open(self, spec):
        return self.cluster._open(spec)


class VirtualCluster:
    """Hosts ``h0 .. h{n-1}`` at ``addresses`` on ``fabric`` (attached and connected
    by ``place(device, rank)``, e.g. to a leaf), with engine devices of
    ``device_config``; ``run(program)`` runs ``program(rank, cluster)`` on each."""

    def __init__(self, fabric, addresses: list[str], device_config: DeviceConfig, *,
                 place: Callable[[Device, int], None] | None = None, seed: int = 1,
                 shared_payload: bool = False, greenlets: bool | None = None) -> None:
        self.fabric = fabric
        self.n = len(addresses)
        self.addresses = list(addresses)
        self.device_config = device_config
        self.place = place
        self.seed = seed
        self.shared_payload = shared_payload
        self.store = VirtualStore(self)
        self.transports: dict = {}      # (prefix, rank) -> its VirtualTransport, once made
        self.devices: list[Device | None] = [None] * self.n
        self.dirty: dict = {}           # devices touched since the last flush (in order)
        self.flows: dict = defaultdict(lambda: ([], []))
        self.current: _Task | None = None
        self.tasks = [_Task(r) for r in range(self.n)]
        if greenlets and _greenlet is None:
            raise RuntimeError("greenlets asked for, but the greenlet package is missing")
        self.greenlets = _greenlet is not None if greenlets is None else greenlets
        self._main = None
        self._main_glet = None
        self._runnable: deque = deque()
        self._ready: list = []             # engine CQs that raised an event
        self._deadlines: list = []         # heap of (deadline, rank, wait)
        self._ticking: list = []           # ranks waiting on a condition (wait_until)
        self._cq_owner: dict = {}
        self._aborting = False
        self._shared = None             # the mapping shared payload lives in
        self._maps: list = []

    # -- devices ------------------------------------------------------------

    def device_name(self, rank: int) -> str:
        return f"h{rank}"

    @property
    def now(self) -> float:
        return self.fabric.now

    def _open(self, spec) -> VNIC:
        rank = int(spec.name[1:])
        dev = Device(spec.name, self.addresses[rank], config=self.device_config)
        self.fabric.attach(dev)
        if self.place is not None:
            self.place(dev, rank)
        self.devices[rank] = dev
        return VNIC(self, spec, dev)

    def _own_cq(self, ecq, rank: int) -> None:
        self._cq_owner[id(ecq)] = self.tasks[rank]
        ecq.on_event = self._ready.append

    def buffer(self, rank: int, nbytes: int, dtype=np.uint8) -> np.ndarray:
        """Zeroed memory for ``rank``: its own, or (``shared_payload``) pages every
        rank's buffers share (see the module's notes)."""
        nbytes = max(nbytes, 1)
        size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        if not self.shared_payload:         # anonymous pages: zero, and real only once used
            m = mmap.mmap(-1, size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self._maps.append(m)
            return np.frombuffer(m, dtype, nbytes // np.dtype(dtype).itemsize)
        m = self._shared
        if m is None or len(m) < size:      # a larger one (views of the last keep it)
            m = self._shared = mmap.mmap(-1, size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self._maps.append(m)
        return np.frombuffer(m, dtype, nbytes // np.dtype(dtype).itemsize)

    # -- waiting (on a rank's thread) ----------------------------------------

    def _block(self, state: str, deadline: float | None, *, cq=None, key=None) -> None:
        t = self.current
        if self._aborting or t is None:
            raise _Abort()
        t.state, t.deadline, t.cq, t.key = state, deadline, cq, key
        t.wait += 1
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, t.rank, t.wait))
        if state == "tick":
            self._ticking.append(t)
        if self._main_glet is not None:
            self._main_glet.switch()
        else:
            self._main.release()
            t.sem.acquire()
        if self._aborting:
            raise _Abort()

    def wait_cq(self, ecq, deadline: float | None = None) -> bool:
        """Block the calling rank until ``ecq`` holds a completion (True) or virtual
        time reaches ``deadline`` (False)."""
        while not ecq.entries:
            if deadline is not None and self.now >= deadline:
                return False
            ecq.armed = True
            ecq.armed_solicited = False
            self._block("cq", deadline, cq=ecq)
        return True

    def _wake(self, t: _Task) -> None:
        t.state = "woken"
        self._runnable.append(t)

    # -- the scheduler ---------------------------------------------------------

    def run(self, program: Callable[[int, "VirtualCluster"], Any], *,
            sample: float | None = None, on_sample: Callable[[float], None] | None = None,
            max_time: float = float("inf")) -> list:
        """Run ``program`` on every rank to its end; return each rank's result.
        ``on_sample(now)`` is called every ``sample`` seconds of virtual time.  A
        rank's exception is raised here (the others are abandoned); so is
        ``Deadlock``, and ``TimeoutError`` past ``max_time``."""
        prev_cfg = _nic.runtime_config()
        specs = tuple(_config.DeviceSpec(self.device_name(r), self.addresses[r])
                      for r in range(self.n))
        _nic.configure(_config.RuntimeConfig(devices=specs, backend="sim",
                                             seed=self.seed))
        _nic.use_sim_world(_Sim(self))
        try:
            return self._run(program, sample, on_sample, max_time)
        finally:
            self._abandon()
            _nic.configure(prev_cfg)
            for m in self._maps:
                try:
                    m.close()
                except BufferError:      # a numpy view still holds it: the GC will
                    pass
            self._shared = None

    def _start(self, program) -> None:
        """A task per rank, each runnable, none started."""
        threads = not self.greenlets

        def body(t: _Task) -> None:
            if threads:
                t.sem.acquire()
            try:
                if not self._aborting:
                    t.result = program(t.rank, self)
            except _Abort:
                pass
            except BaseException as ex:      # reported by the scheduler
                t.error = ex
            finally:
                t.state = "done"
                if threads and not self._aborting:
                    self._main.release()

        if threads:
            self._main = _baton()
        else:
            self._main_glet = _greenlet.getcurrent()
        for t in self.tasks:
            if threads:
                t.sem = _baton()
                t.thread = threading.Thread(target=body, args=(t,), name=f"rank {t.rank}",
                                            daemon=True)
                t.thread.start()
            else:
                t.glet = _greenlet.greenlet(body, parent=self._main_glet)
            self._runnable.append(t)

    def _run(self, program, sample, on_sample, max_time) -> list:
        self._start(program)
        threads = not self.greenlets
        live = self.n
        fabric = self.fabric
        ready = self._ready
        next_sample = 0.0 if sample else float("inf")
        while True:
            runnable = self._runnable
            while runnable:
                t = runnable.popleft()
                self.current = t
                t.state = "run"
                if threads:
                    t.sem.release()
                    self._main.acquire()
                else:
                    t.glet.switch(t)
                self.current = None
                if t.state == "done":
                    live -= 1
                    if t.error is not None:
                        raise t.error
            if not live:
                return [t.result for t in self.tasks]
            if self.dirty:
                fabric.flush(self.dirty)
                self.dirty.clear()
            dl = self._deadlines
            while dl and (self.tasks[dl[0][1]].wait != dl[0][2] or
                          self.tasks[dl[0][1]].state not in ("cq", "key", "tick")):
                heapq.heappop(dl)               # a wait that ended otherwise
            until = min(next_sample, max_time, dl[0][0] if dl else float("inf"))
            if not ready:
                if not dl and not fabric.pending():
                    raise Deadlock(f"every rank waits and the fabric is idle at "
                                   f"{fabric.now * 1e3:.3f} ms: {self._who_waits()}")
                fabric.run(until=None if until == float("inf") else until,
                           stop=ready.__len__, flush=False)
            now = fabric.now
            while now >= next_sample:
                on_sample(now)
                next_sample += sample
            for cq in ready:
                t = self._cq_owner.get(id(cq))
                if t is not None and t.state == "cq" and t.cq is cq:
                    self._wake(t)
            ready.clear()
            while dl and dl[0][0] <= now:
                _, rank, wait = heapq.heappop(dl)
                t = self.tasks[rank]
                if t.wait == wait and t.state in ("cq", "key", "tick"):
                    self._wake(t)
            ticking, self._ticking = self._ticking, []
            for t in ticking:
                if t.state == "tick":
                    self._wake(t)
            if runnable:
                continue
            if now >= max_time:
                raise TimeoutError(f"the ranks did not finish within {max_time:g} s of "
                                   f"virtual time ({self._who_waits()})")

    def _who_waits(self) -> str:
        out = []
        for t in self.tasks:
            if t.state == "cq":
                out.append(f"rank {t.rank} on its CQ")
            elif t.state == "key":
                out.append(f"rank {t.rank} on store key {t.key!r}")
            elif t.state == "tick":
                out.append(f"rank {t.rank} on a condition")
        return "; ".join(out) or "nobody"

    def _abandon(self) -> None:
        """Unwind every rank thread still alive, one at a time."""
        self._aborting = True
        for t in self.tasks:
            if t.thread is not None and t.thread.is_alive():
                t.sem.release()
                t.thread.join(30)
            elif t.glet is not None and t.glet:          # started, not finished
                self.current = t
                t.glet.throw(_Abort())
        self.current = None
        self._main_glet = None
