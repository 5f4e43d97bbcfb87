#!/usr/bin/env python3
"""Events per wall second of the simulated fabric (softnic.transport.sim).

Workloads, each run in virtual time through the real engine:

* ``incast16``: ``softnic experiment incast`` 16:1, 25 Gbit/s, DCQCN, 20 ms
  (MTU 4096), the configuration the experiment runs by default;
* ``incast64``: 64:1 at 100 Gbit/s, DCQCN, 2 ms;
* ``allreduce64c``: a ring allreduce of 8 MiB per rank over 64 hosts of a
  leaf-spine (8 leaves of 8 hosts, 8 spines, 100 Gbit/s, ECMP, PFC, one QP per
  peer) run by ``softnic.collectives`` itself, a rank per host in virtual time
  (the cluster experiment): the figures include the collectives' own work per
  chunk and the set-up of the 4032 QPs;
* ``allreduce64``: the same allreduce's transfers as plain RDMA WRITEs (the
  fabric and the engine only), by the cluster experiment's schedule driver:
  only in a tree from before that driver was removed (2026-12-01), for
  ``--compare`` with older figures; not a default workload.

* ``fabric16``: the fabric alone, the 16:1 incast's shape (one switch, 25
  Gbit/s, RED on, 20 ms) with stand-in devices that do next to nothing: each
  sender sends a 4 KiB datagram from a timer every 16 packet times, the
  receiver answers every fourth with a 60-byte one.  Its events per CPU second
  are what the fabric's own loop (heap, links, queues, marking, timer
  entries) would allow if the engine cost nothing.

``--quick`` runs incast16 only.

The machine may be shared: the figures per CPU second (``time.process_time``)
depend less on what else runs than those per wall second, and are the ones
printed first; the wall time follows.

An *event* is what the fabric's heap processes: a delivery to a host, a host
timer firing, and a datagram reaching a queue inside the fabric (a NIC's egress,
a switch port).  ``host events`` counts the first two only (the figure
``Fabric.events_processed`` gave before the fabric counted its own hops).  A
second line splits the host events: the hosts' timers (a paced QP's next packet,
the retransmission timer, a congestion controller's own timers) and, without
them, the *datagram events* per wall second (deliveries and the fabric's hops).

    python tools/sim_bench.py                  # this tree
    python tools/sim_bench.py --compare /tmp/base   # also a second tree, alternating

``--compare DIR`` runs the same workloads with ``DIR`` first on the path in a
subprocess, alternately with this tree, ``--repeat`` times, and prints the
median of the paired ratios (each round's run of this tree against the other
tree's run beside it: one load for both sides), per CPU second and per wall
second.  Each run's result (the experiment's JSON less its wall times, and
the event counts) is hashed; the two trees' digests are printed, and must be
equal when a change is to leave the simulation as it was.

``--instructions`` counts what a run costs in instructions instead, which do
not depend on the machine's load: each workload (and ``--compare``'s tree) in
a child under ``valgrind --tool=cachegrind --cache-sim=no``, once running it
once and once running it twice; the difference is one run in a warm process
(the interpreter's start, the imports and first calls cancel out).  The run is
what the CPU figures time (the experiment, its set-up and its result), without
the hash of its result, with ``PYTHONHASHSEED=0``.  Printed: instructions per
run, per event and per host event, and the ratio this/compare.  Needs valgrind (Debian's ``valgrind``); a run costs about
50 times its CPU time under it.

``--opcodes`` counts, for this tree, the bytecodes each function executes per
host event (``sys.settrace`` with opcode events; far slower, but exact and the
same on any machine): the interpreter's loop is most of an event's
instructions, so these say where they go without cProfile's cost per call,
which overstates small functions.  Printed: the share of each file and of the
largest functions, their bytecodes and calls per host event.

``--breakdown`` runs each workload once more with the devices' four entry
points timed (``receive_datagram``, ``handle_timer``, ``datagrams_to_send``,
``get_timer``) and splits the time into the engine's (inside those calls),
the fabric's own (its loop, switch ports, links and queues: the rest of
``Fabric.run``) and the driver's (the experiment around ``run``: posting,
polling, sampling), per event.  The calls are timed by ``perf_counter`` (a
CPU-time clock costs a system call per reading); each share is a fraction of
the timed run applied to its CPU time, and the timing's own cost (measured on
an empty call) is taken off.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _digest(res: dict, *counts) -> str:
    """A hash of an experiment's result less its wall times, with ``counts``."""
    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if "wall" not in k}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o
    blob = json.dumps([strip(res), *counts], sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class _Breakdown:
    """Times the devices' entry points and ``Fabric.run`` (``--breakdown``)."""

    ENTRY = ("receive_datagram", "handle_timer", "datagrams_to_send", "get_timer")

    def __init__(self) -> None:
        from softnic.core.device import Device
        from softnic.transport import sim
        self.acc = dict.fromkeys(self.ENTRY + ("run",), 0.0)
        self.calls = dict.fromkeys(self.ENTRY, 0)
        clock = time.perf_counter
        for name in self.ENTRY:
            setattr(Device, name, self._timed(getattr(Device, name), name, clock))
        sim.Fabric.run = self._timed(sim.Fabric.run, "run", clock)
        # what the timing itself costs per call: the same wrapper around a method
        # that does nothing, called as the fabric calls the device's, best of five
        class Idle:
            def entry(self, now):
                return None
        probe, idle = self._timed(Idle.entry, "probe", clock), Idle()
        self.acc["probe"], self.calls["probe"] = 0.0, 0
        best = float("inf")
        for _ in range(5):
            c0 = clock()
            for _ in range(20000):
                probe(idle, 0.0)
            t_timed = clock() - c0
            c0 = clock()
            for _ in range(20000):
                idle.entry(0.0)
            best = min(best, (t_timed - (clock() - c0)) / 20000)
        self.per_call = best
        del self.acc["probe"], self.calls["probe"]

    def _timed(self, f, name, clock):
        acc, calls = self.acc, self.calls

        def timed(*a, **kw):
            t = clock()
            try:
                return f(*a, **kw)
            finally:
                acc[name] += clock() - t
                if name != "run":
                    calls[name] = calls.get(name, 0) + 1
        return timed

    def split(self, wall: float, cpu: float) -> dict:
        """The shares of ``wall`` (the run, timed), as CPU seconds of ``cpu``."""
        ncalls = sum(self.calls[n] for n in self.ENTRY)
        overhead = ncalls * self.per_call
        total = wall - overhead
        k = cpu / wall                       # CPU seconds per timed second
        engine = sum(self.acc[n] for n in self.ENTRY) - overhead
        return dict(total=total * k, engine=engine * k,
                    fabric=(self.acc["run"] - engine - overhead) * k,
                    driver=(wall - self.acc["run"]) * k, calls=ncalls,
                    by_entry={n: (self.calls[n],
                                  (self.acc[n] - self.calls[n] * self.per_call) * k)
                              for n in self.ENTRY})


class _Stand:
    """A device that does next to nothing (``fabric16``): a sender sends ``size``
    bytes to ``peer`` every ``every`` seconds from its timer; a receiver (no
    ``peer``) answers every fourth datagram with 60 bytes."""

    ect = True

    def __init__(self, address, peer=None, every: float = 0.0, size: int = 4096) -> None:
        self.address = address
        self.peer, self.every, self.data = peer, every, bytes(size)
        self.at = 0.0 if peer is not None else None
        self.out: list = []
        self.n = 0

    def receive_datagram(self, data, src, now, ecn=0, telemetry=None) -> None:
        self.n += 1
        if self.peer is None and self.n % 4 == 0:
            self.out.append((bytes(60), src))

    def datagrams_to_send(self, now: float) -> list:
        out, self.out = self.out, []
        return out

    def get_timer(self):
        return self.at

    def handle_timer(self, now: float) -> None:
        self.out.append((self.data, self.peer))
        self.at = now + self.every


def _fabric16(digest: bool = True) -> dict:
    from softnic.transport import sim
    rate = 25e9
    fabric = sim.Fabric(1)
    sw = fabric.add_switch("sw", buffer_bytes=2 << 20, red=sim.RED())
    recv = _Stand(("10.0.0.1", 4791))
    every = 16 * (4096 + 28) * 8 / rate
    hosts = [recv] + [_Stand((f"10.0.1.{i + 1}", 4791), recv.address, every * (1 + i / 1000))
                      for i in range(16)]
    for d in hosts:
        fabric.attach(d)
        fabric.connect(d.address, sw, rate_bps=rate, delay=1e-6)
    t0, c0 = time.perf_counter(), time.process_time()
    for b in range(1000):                    # as the incast: 1000 bins of 20 us
        fabric.run(until=(b + 1) * 20e-6)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    host, hops = fabric.events_processed, fabric.hops_processed
    res = {"port": sw.port(recv.address).counters, "received": [d.n for d in hosts]}
    return dict(workload="fabric16", wall_s=wall, cpu_s=cpu, host_events=host,
                events=host + hops, virtual_s=0.02, delivered=fabric._received,
                digest=_digest(res, host, hops) if digest else None, breakdown=None,
                loop=_loop(sim, [fabric]))


def _run(name: str, breakdown: bool = False, digest: bool = True) -> dict:
    """One run of workload ``name``: its figures and (``digest``) its result's hash."""
    if name == "fabric16":
        return _fabric16(digest)
    brk = _Breakdown() if breakdown else None
    from softnic.transport import sim
    made = []                   # the fabric the workload builds (its datagrams delivered)
    init = sim.Fabric.__init__

    def spy(self, *a, **kw):
        init(self, *a, **kw)
        made.append(self)
    sim.Fabric.__init__ = spy
    try:
        from softnic.experiments import bottleneck as ex
    except ImportError:          # older trees (--compare): under cli/, or before the layers
        try:
            from softnic.cli import experiments as ex
        except ImportError:
            from softnic import experiments as ex
    if name == "incast16":
        cfg = ex.IncastConfig(cc="dcqcn", senders=16, rate_gbps=25.0, duration=0.02)
    elif name == "incast64":
        cfg = ex.IncastConfig(cc="dcqcn", senders=64, rate_gbps=100.0, duration=0.002)
    elif name in ("allreduce64", "allreduce64c"):
        try:
            from softnic.experiments import cluster
        except ImportError:      # older trees: under cli/, or before the layers
            try:
                from softnic.cli import cluster
            except ImportError:
                from softnic import cluster
        kw = dict(hosts=64, hosts_per_leaf=8, spines=8, rate_gbps=100.0,
                  collective="allreduce", algorithm="ring", size=8 << 20, qps=1,
                  mode="lossless", cc="none")
        driver = "schedule" if name == "allreduce64" else "collectives"
        # three generations of trees: a ``driver`` field choosing between the two;
        # before it, the schedule driver alone; after it, the collectives alone
        # (``run_collectives``, which ``run`` calls)
        if "driver" in getattr(cluster.ClusterConfig, "__dataclass_fields__", {}):
            kw["driver"] = driver
        elif hasattr(cluster, "run_collectives"):
            if driver == "schedule":
                raise SystemExit("allreduce64 needs the schedule driver, which this tree no "
                                 "longer has; allreduce64c is the same allreduce")
        elif driver != "schedule":
            raise SystemExit("this tree's cluster experiment has no collectives driver")
        t0, c0 = time.perf_counter(), time.process_time()
        res = cluster.run(cluster.ClusterConfig(**kw))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        s = res["summary"]
        return dict(workload=name, wall_s=wall, cpu_s=cpu, host_events=s["host_events"],
                    events=s["events"], virtual_s=s["completion_s"],
                    delivered=getattr(made[-1], "_received", None) if made else None,
                    digest=_digest(res, s["events"], s["host_events"]) if digest else None,
                    breakdown=brk.split(wall, cpu) if brk else None, loop=_loop(sim, made))
    else:
        raise SystemExit(f"unknown workload {name}")
    t0, c0 = time.perf_counter(), time.process_time()
    res = ex.incast(cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    host = res["summary"]["events"]
    fabric = made[-1]
    if hasattr(fabric, "hops_processed"):
        hops = fabric.hops_processed
    else:   # a tree from before the fabric counted them: its switch ports' arrivals
        sw = {id(s): s for s in fabric._switch_of.values()}
        hops = sum(q.counters["enqueued"] + q.counters["dropped"]
                   for s in sw.values() for q in s.ports.values())
    return dict(workload=name, wall_s=wall, cpu_s=cpu, host_events=host, events=host + hops,
                virtual_s=cfg.duration, delivered=getattr(fabric, "_received", None),
                digest=_digest(res, host, hops) if digest else None,
                breakdown=brk.split(wall, cpu) if brk else None, loop=_loop(sim, made))


def _loop(sim, made) -> str:
    """Which of ``Fabric.run``'s loops ran: the compiled one (``softnic.accel``'s
    fabric.c) or Python's (a tree from before the compiled one has only that)."""
    compiled = getattr(sim, "compiled_loop", None)
    if compiled is None or compiled() is None or not made or not made[-1].compiled:
        return "python"
    return "compiled"


def _child(tree: str, name: str, breakdown: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    extra = ["--breakdown"] if breakdown else []
    out = subprocess.run([sys.executable, __file__, "--child", name, *extra], env=env, cwd=tree,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{tree}: {name} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _instructions(tree: str, name: str) -> dict:
    """One run of ``name`` on ``tree`` in instructions (cachegrind): a child running
    it twice less one running it once.  Returns the run's figures with ``ir``."""
    env = dict(os.environ, PYTHONPATH=tree, PYTHONHASHSEED="0")   # (str hashes: the same work)
    ir, res = {}, None
    for runs in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "cachegrind.out"
            cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                   f"--cachegrind-out-file={out}", sys.executable, __file__, "--child", name,
                   "--runs", str(runs)]
            try:
                got = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True,
                                     timeout=7200)
            except FileNotFoundError:
                raise SystemExit("--instructions needs valgrind (Debian: apt install valgrind)")
            if got.returncode:
                raise SystemExit(f"{tree}: {name} under valgrind failed:\n{got.stderr[-2000:]}")
            summary = [ln for ln in out.read_text().splitlines() if ln.startswith("summary:")]
            ir[runs] = int(summary[0].split()[1])
        res = json.loads(got.stdout.strip().splitlines()[-1])
    res["ir"] = ir[2] - ir[1]
    return res


def _print_opcodes(name: str, top: int = 30) -> None:
    """``--opcodes``: one run of ``name`` with every bytecode counted by function."""
    import collections
    ops: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def tracer(frame, event, arg):
        code = frame.f_code
        key = (Path(code.co_filename).name, code.co_name)
        if event == "call":
            calls[key] += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            ops[key] += 1
        return tracer
    sys.settrace(tracer)
    try:
        r = _run(name, digest=False)
    finally:
        sys.settrace(None)
    ev = r["host_events"]
    total = sum(ops.values())
    print(f"{name}: {total / ev:.0f} bytecodes per host event ({ev} host events)")
    files: collections.Counter = collections.Counter()
    for (f, _), n in ops.items():
        files[f] += n
    for f, n in files.most_common(12):
        print(f"  {f:28s} {n / total * 100:5.1f} %  {n / ev:7.1f} per host event")
    for (f, fn), n in ops.most_common(top):
        print(f"  {f:16s} {fn:26s} {n / total * 100:5.2f} %  {n / ev:6.1f} per host event, "
              f"{calls[f, fn] / ev:5.2f} calls, {n / max(1, calls[f, fn]):6.1f} per call")


def _print_breakdown(name: str, tree: str, r: dict) -> None:
    b = r["breakdown"]
    ev = r["events"]
    tot = b["total"]
    parts = ", ".join(f"{k} {b[k] / tot * 100:.0f} % ({b[k] / ev * 1e6:.2f} us)"
                      for k in ("fabric", "engine", "driver"))
    print(f"{name:12s} {tree}: per event {tot / ev * 1e6:.2f} us CPU: {parts}; "
          f"timing {b['calls']} calls taken off")
    for entry, (n, t) in b["by_entry"].items():
        each = (f"{t / max(n, 1) * 1e6:6.2f} us each" if t > 0 else
                "   ~0 us each (within the timing's own cost)")
        print(f"{'':12s}   {entry:18s} {n:7d} calls {max(t, 0.0):7.3f} s {each}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="incast16,incast64,allreduce64c")
    p.add_argument("--quick", action="store_true", help="incast16 only")
    p.add_argument("--compare", metavar="DIR", help="another source tree to run alternately")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--breakdown", action="store_true",
                   help="also split each workload's CPU time: fabric, engine, driver")
    p.add_argument("--instructions", action="store_true",
                   help="count each run's instructions (cachegrind) instead of timing it")
    p.add_argument("--opcodes", action="store_true",
                   help="bytecodes executed per host event, by file and function (slow)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        sys.path.insert(0, os.environ.get("PYTHONPATH", str(ROOT)))
        if args.runs:          # (under cachegrind: the runs without their results' hashes)
            for _ in range(args.runs):
                res = _run(args.child, digest=False)
            print(json.dumps(res))
            return 0
        print(json.dumps(_run(args.child, args.breakdown)))
        return 0
    names = ["incast16"] if args.quick else args.workloads.split(",")
    trees = [str(ROOT)] + ([args.compare] if args.compare else [])
    sys.path.insert(0, str(ROOT))
    from softnic.cli.doctor import libpython_shared
    build = "libpython shared" if libpython_shared() else "statically linked"
    print(f"python {sys.version.split()[0]} ({sys.executable}, {build}); load: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.opcodes:
        for name in names:
            _print_opcodes(name)
        return 0
    if args.instructions:
        for name in names:
            got = {}
            for t in trees:
                try:
                    got[t] = r = _instructions(t, name)
                except SystemExit as e:
                    print(f"  {name} on {t}: {e}")
                    continue
                print(f"{name:12s} {t}: {r['ir'] / 1e6:,.1f} M instructions per run, "
                      f"{r['ir'] / r['events'] / 1e3:.2f} k per event ({r['events']} events), "
                      f"{r['ir'] / r['host_events'] / 1e3:.2f} k per host event "
                      f"({r['host_events']})")
            if len(got) == 2:
                a, b = (got[t] for t in trees)
                same = (a["events"], a["host_events"]) == (b["events"], b["host_events"])
                print(f"{name:12s} instructions this/compare x{a['ir'] / b['ir']:.4f} "
                      f"(per event x{a['ir'] / a['events'] / (b['ir'] / b['events']):.4f}); "
                      f"event counts {'the same' if same else 'DIFFER'}")
        return 0
    for name in names:
        runs: dict[str, list] = {t: [] for t in trees}
        pairs: list[tuple[float, float]] = []
        for _ in range(args.repeat):
            got = {}
            for t in trees:
                try:
                    got[t] = _child(t, name)
                except SystemExit as e:
                    print(f"  {name} on {t}: {e}")
                    continue
                runs[t].append(got[t])
            if len(got) == 2:
                a, b = got[trees[0]], got[trees[1]]
                pairs.append((a["events"] / a["cpu_s"] / (b["events"] / b["cpu_s"]),
                              a["events"] / a["wall_s"] / (b["events"] / b["wall_s"])))
        for t in trees:
            if not runs[t]:
                continue
            r = runs[t][len(runs[t]) // 2]
            cev = statistics.median(x["events"] / x["cpu_s"] for x in runs[t])
            ev = statistics.median(x["events"] / x["wall_s"] for x in runs[t])
            hev = statistics.median(x["host_events"] / x["cpu_s"] for x in runs[t])
            cpu = statistics.median(x["cpu_s"] for x in runs[t])
            wall = statistics.median(x["wall_s"] for x in runs[t])
            digests = sorted({x["digest"] for x in runs[t]})
            print(f"{name:12s} {t}: {cev / 1e3:.1f} k events per CPU s "
                  f"({hev / 1e3:.1f} k host events); {r['events']} events "
                  f"({r['host_events']} host) for {r['virtual_s'] * 1e3:.2f} ms virtual in "
                  f"{cpu:.2f} s CPU, {wall:.2f} s wall ({ev / 1e3:.1f} k events per wall s); "
                  f"result {','.join(digests)}; loop {r.get('loop', 'python')}")
            if r.get("delivered") is not None:
                # a datagram's events only (delivered to a host, or reaching a queue in
                # the fabric), without the hosts' timers (pacing, retransmission,
                # a congestion controller's own); the host events not delivered are
                # those timers and any datagram dropped at a detached host (none in
                # these workloads)
                timers = r["host_events"] - r["delivered"]
                pev = statistics.median((x["events"] - x["host_events"] + x["delivered"])
                                        / x["cpu_s"] for x in runs[t])
                print(f"{name:12s} {t}: of which {timers} host timers; without them "
                      f"{pev / 1e3:.1f} k datagram events per CPU s")
        if pairs:
            same = {x["digest"] for x in runs[trees[0]]} == {x["digest"] for x in runs[trees[1]]}
            print(f"{name:12s} ratio this/compare (median of {len(pairs)} paired): "
                  f"per CPU s x{statistics.median(c for c, _ in pairs):.3f} "
                  f"(pairs {' '.join(f'{c:.2f}' for c, _ in pairs)}), "
                  f"per wall s x{statistics.median(w for _, w in pairs):.3f}; "
                  f"results {'the same' if same else 'DIFFER'}")
        if args.breakdown and name != "fabric16":      # (its devices are stand-ins)
            for t in trees:
                try:
                    _print_breakdown(name, t, _child(t, name, breakdown=True))
                except SystemExit as e:
                    print(f"  {name} breakdown on {t}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
