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

``--quick`` runs incast16 only.

The machine may be shared: the figures per CPU second (``time.process_time``)
depend less on what else runs than those per wall second.

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
ratio of the medians: one load for both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(name: str) -> dict:
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
        if "driver" in getattr(cluster.ClusterConfig, "__dataclass_fields__", {}):
            kw["driver"] = driver
        elif driver == "schedule" and hasattr(cluster, "run_collectives"):
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
                    delivered=getattr(made[-1], "_received", None) if made else None)
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
                virtual_s=cfg.duration, delivered=getattr(fabric, "_received", None))


def _child(tree: str, name: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, __file__, "--child", name], env=env, cwd=tree,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{tree}: {name} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="incast16,incast64,allreduce64c")
    p.add_argument("--quick", action="store_true", help="incast16 only")
    p.add_argument("--compare", metavar="DIR", help="another source tree to run alternately")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        sys.path.insert(0, os.environ.get("PYTHONPATH", str(ROOT)))
        print(json.dumps(_run(args.child)))
        return 0
    names = ["incast16"] if args.quick else args.workloads.split(",")
    trees = [str(ROOT)] + ([args.compare] if args.compare else [])
    print(f"python {sys.version.split()[0]} ({sys.executable}); load: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name in names:
        runs: dict[str, list] = {t: [] for t in trees}
        for _ in range(args.repeat):
            for t in trees:
                try:
                    runs[t].append(_child(t, name))
                except SystemExit as e:
                    print(f"  {name} on {t}: {e}")
        rates = {}
        for t in trees:
            if not runs[t]:
                continue
            r = runs[t][len(runs[t]) // 2]
            ev = statistics.median(x["events"] / x["wall_s"] for x in runs[t])
            hev = statistics.median(x["host_events"] / x["wall_s"] for x in runs[t])
            cev = statistics.median(x["events"] / x["cpu_s"] for x in runs[t])
            rates[t] = (ev, hev)
            print(f"{name:12s} {t}: {r['events']} events ({r['host_events']} host) in "
                  f"{r['wall_s']:.2f} s wall ({r['cpu_s']:.2f} s CPU) for "
                  f"{r['virtual_s'] * 1e3:.2f} ms virtual: {ev / 1e3:.1f} k events/s, "
                  f"{hev / 1e3:.1f} k host events/s; {cev / 1e3:.1f} k events per CPU s")
            if r.get("delivered") is not None:
                # a datagram's events only (delivered to a host, or reaching a queue in
                # the fabric), without the hosts' timers (pacing, retransmission,
                # a congestion controller's own); the host events not delivered are
                # those timers and any datagram dropped at a detached host (none in
                # these workloads)
                timers = r["host_events"] - r["delivered"]
                pev = statistics.median((x["events"] - x["host_events"] + x["delivered"])
                                        / x["wall_s"] for x in runs[t])
                print(f"{name:12s} {t}: of which {timers} host timers; without them "
                      f"{pev / 1e3:.1f} k datagram events/s")
        if len(rates) == 2:
            a, b = rates[trees[0]], rates[trees[1]]
            print(f"{name:12s} ratio this/compare: events/s x{a[0] / b[0]:.2f}, "
                  f"host events/s x{a[1] / b[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
