"""``softnic experiment``: congestion and loss experiments in virtual time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _size(text: str) -> int:
    """``64KB``, ``2MiB``, ``4096`` -> bytes."""
    return int(_unit("size", text))


def _time(text: str) -> float:
    """``20ms``, ``55us``, ``0.01`` -> seconds."""
    return float(_unit("time", text))


def _unit(kind: str, text: str):
    from congestion.params import parse_value
    try:
        return parse_value(kind, text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="experiment", required=True)
    i = sub.add_parser("incast", help="N senders to one receiver through one switch",
                       description="N:1 incast through an output-queued switch with a finite "
                       "buffer, RED/ECN marking and INT; every sender runs --cc.  Writes "
                       "OUT/incast-CC.json and OUT/incast-CC.png and prints the figures.")
    i.add_argument("--cc", default="dcqcn",
                   help="controller spec: none, dcqcn, timely, swift, hpcc, with optional "
                   "parameters, e.g. 'dcqcn:g=0.0039' (several: comma-free list with '+', "
                   "e.g. dcqcn+hpcc+swift)")
    i.add_argument("--senders", type=int, default=16)
    i.add_argument("--rate-gbps", type=float, default=25.0, help="every link's rate")
    i.add_argument("--duration", type=_time, default=0.02, help="virtual time, e.g. 20ms")
    i.add_argument("--late-join", type=_time, default=None,
                   help="one more sender starts at this time, e.g. 10ms")
    i.add_argument("--msg", type=_size, default=256 << 10, help="bytes per WRITE")
    i.add_argument("--mtu", type=int, default=4096, choices=(256, 512, 1024, 2048, 4096))
    i.add_argument("--buffer", type=_size, default=2 << 20, help="switch buffer per port")
    i.add_argument("--kmin", type=_size, default=5_000)
    i.add_argument("--kmax", type=_size, default=200_000)
    i.add_argument("--pmax", type=float, default=0.01)
    i.add_argument("--delay", type=_time, default=1e-6, help="propagation per link")
    i.add_argument("--window", type=int, default=128, help="transport window (packets)")
    i.add_argument("--selective-repeat", action="store_true")
    i.add_argument("--pfc", action="store_true",
                   help="lossless: the switch pauses senders (PFC) instead of dropping")
    i.add_argument("--xoff", type=_size, default=96_000, help="PFC XOFF per ingress (bytes)")
    i.add_argument("--xon", type=_size, default=64_000, help="PFC XON per ingress (bytes)")
    i.add_argument("--seed", type=int, default=1)
    i.add_argument("--out", default="results", help="directory for JSON and PNG")
    i.add_argument("--no-progress", action="store_true")
    lo = sub.add_parser("loss", help="go-back-N against selective repeat under random loss",
                        description="One RC flow of RDMA WRITEs over a lossy link, each "
                        "recovery mode at each loss rate.  Writes OUT/loss.json and "
                        "OUT/loss.png and prints a table.")
    lo.add_argument("--losses", default="0,0.001,0.005,0.01,0.02,0.05",
                    help="comma-separated loss probabilities (each direction)")
    lo.add_argument("--rate-gbps", type=float, default=10.0)
    lo.add_argument("--delay", type=_time, default=150e-6, help="one-way propagation delay")
    lo.add_argument("--total", type=_size, default=8 << 20, help="bytes per run")
    lo.add_argument("--msg", type=_size, default=1 << 20)
    lo.add_argument("--window", type=int, default=128)
    lo.add_argument("--mtu", type=int, default=4096, choices=(256, 512, 1024, 2048, 4096))
    lo.add_argument("--seed", type=int, default=1)
    lo.add_argument("--out", default="results")
    lo.add_argument("--no-progress", action="store_true")
    _add_cluster(sub)
    _add_sweep(sub)


def _add_sweep(sub) -> None:
    """The ``sweep`` experiment's arguments."""
    s = sub.add_parser(
        "sweep", help="a grid of an experiment's parameters, times seeds, on Dask",
        description="Runs every point of a grid of one experiment's parameters (incast, loss "
        "or cluster) for each seed, on a Dask LocalCluster of this machine's cores, on an "
        "existing Dask cluster (--scheduler) or here (--serial).  Each finished point is "
        "kept in OUT/points/ (its cost in OUT/costs/), so a stopped sweep resumes.  Prints "
        "each figure's mean and 95 % interval across seeds and writes OUT/sweep.json, "
        "sweep.csv and sweep.png.")
    s.add_argument("grid", nargs="?", default=None,
                   help="a TOML grid file: experiment = \"incast\", seeds = [1, 2, 3], and a "
                   "[params] table whose lists are the grid's axes (the first is the plot's "
                   "x); optionally figures = [...], out = \"DIR\" (relative to the file) "
                   "and title = \"...\"")
    s.add_argument("--experiment", "-e", dest="sweep_of", default=None,
                   choices=("incast", "loss", "cluster"),
                   help="the experiment (or the grid file's 'experiment')")
    s.add_argument("-p", "--param", action="append", default=[], metavar="NAME=V1,V2",
                   help="a parameter's value, or its values (an axis); a controller spec "
                   "(cc) lists its values with '+', e.g. -p cc=dcqcn+hpcc.  Repeatable; "
                   "over the grid file's")
    s.add_argument("--seeds", default=None, help="e.g. 1,2,3 or 1-5 (default the file's, or 1)")
    s.add_argument("--serial", action="store_true", help="run every point here, in turn")
    s.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="an existing Dask cluster's scheduler")
    s.add_argument("--workers", type=int, default=None,
                   help="LocalCluster worker processes (default: this machine's cores)")
    s.add_argument("--figures", default=None,
                   help="comma-separated figures for the printed table and the plot "
                   "(default: the grid file's, else the experiment's headline figures)")
    s.add_argument("--out", default=None, help="directory (default: the grid file's out, else "
                   "results/sweep-EXPERIMENT)")
    s.add_argument("--no-progress", action="store_true")


def _sweep(args) -> int:
    from . import sweep as sw
    if args.serial and args.scheduler:
        print("softnic experiment sweep: --serial and --scheduler exclude each other",
              file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print("softnic experiment sweep: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        grid = sw.build_grid(experiment=args.sweep_of, file=args.grid, params=args.param,
                             seeds=args.seeds)
    except (ValueError, TypeError) as e:
        print(f"softnic experiment sweep: {e}", file=sys.stderr)
        return 2
    figures = (args.figures.split(",") if args.figures else grid.figures
               or list(sw.EXPERIMENTS[grid.experiment].figures))
    out = Path(args.out or grid.out or f"results/sweep-{grid.experiment}")
    n = len(grid.seeds)
    print(f"sweep {grid.experiment}: {len(grid.points()) // n} grid point(s) x {n} seed(s)"
          + "".join(f"; {k} in {v}" for k, v in grid.axes.items()))
    try:
        rep = sw.execute(grid, out, serial=args.serial, scheduler=args.scheduler,
                         workers=args.workers, progress=not args.no_progress)
    except OSError as e:
        print(f"softnic experiment sweep: {e}", file=sys.stderr)
        return 1
    for params, err in rep.failed:
        where = "".join(f"{k}={params[k]} " for k in grid.axes)
        print(f"point failed: {where}seed={params['seed']}: {err}", file=sys.stderr)
    print(f"{rep.ran} point(s) run, {rep.from_disk} already in {out / 'points'}, "
          f"{len(rep.failed)} failed ({rep.wall_s:.1f} s wall)\n")
    res = sw.aggregate(grid, out)
    known = {k for r in res["points"] for k in r["figures"]}
    unknown = [f for f in figures if f not in known]
    if unknown and known:
        print(f"softnic experiment sweep: no figure {', '.join(unknown)}; the figures: "
              f"{', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    print(sw.table(res, figures))
    print("\nwhat each point cost, on this machine (mean per point):\n" + sw.cost_table(grid, out))
    paths = sw.write_results(res, out, figures, title=grid.title)
    print(f"\nwrote {', '.join(map(str, paths))}")
    return 1 if rep.failed or res["missing_points"] else 0


def _add_cluster(sub) -> None:
    """The ``cluster`` experiment's arguments."""
    c = sub.add_parser(
        "cluster", help="collectives on a simulated leaf-spine (ECMP, PFC, DCQCN, admission)",
        description="softnic.collectives ranks (ring/tree allreduce, alltoall), one per host "
        "of a leaf-spine, in virtual time.  --study runs one comparison: qps "
        "(completion against QPs per peer under ECMP), lossless (lossy against PFC), dcqcn "
        "(DCQCN off and on), admission (receiver-driven clear-to-send against none), victim "
        "(PFC head-of-line blocking of a flow that shares no bottleneck); 'single' runs one "
        "configuration.  Writes OUT/cluster-STUDY.json and .png and prints a table.")
    c.add_argument("--study", default="single",
                   choices=("single", "qps", "lossless", "dcqcn", "admission", "victim"))
    c.add_argument("--hosts", type=int, default=16)
    c.add_argument("--hosts-per-leaf", type=int, default=4)
    c.add_argument("--spines", type=int, default=None, help="default: hosts per leaf (1:1)")
    c.add_argument("--rate-gbps", type=float, default=100.0)
    c.add_argument("--spine-rate-gbps", type=float, default=None)
    c.add_argument("--collective", default=None, choices=("allreduce", "alltoall"))
    c.add_argument("--algorithm", default=None, choices=("ring", "tree", "ptree"))
    c.add_argument("--size", type=_size, default=16 << 20, help="bytes per rank, e.g. 256MB")
    c.add_argument("--qps", type=int, default=1, help="QPs per peer")
    c.add_argument("--mode", default=None, choices=("lossy", "lossless"))
    c.add_argument("--cc", default=None, help="controller spec (default none)")
    c.add_argument("--admission", action="store_true", help="receiver-driven clear-to-send")
    c.add_argument("--grants", type=int, default=2,
                   help="with --admission: senders a receiver admits at once")
    c.add_argument("--chunk", type=_size, default=None,
                   help="the collectives' largest chunk (default theirs, 1 MiB)")
    c.add_argument("--slots", type=int, default=None,
                   help="receive slots per peer (default theirs, 8)")
    c.add_argument("--payload", default="auto", choices=("auto", "private", "shared"),
                   help="private: each rank its own memory, results checked; shared: all "
                   "ranks' payload on the same pages (values meaningless, timing the same); "
                   "auto: private up to 1 GiB in all")
    c.add_argument("--max-time", type=_time, default=1.0, help="virtual time before giving up")
    c.add_argument("--qp-timeout", type=int, default=14,
                   help="the collectives' QP timeout (RTO 4.096 us * 2**N; theirs is 14)")
    c.add_argument("--routing", default="ecmp", choices=("ecmp", "flowlet", "spray"))
    c.add_argument("--placement", default="spread", choices=("spread", "packed"))
    c.add_argument("--buffer", type=_size, default=1 << 20, help="per port (lossy)")
    c.add_argument("--xoff", type=_size, default=96_000)
    c.add_argument("--xon", type=_size, default=64_000)
    c.add_argument("--duration", type=_time, default=5e-3, help="victim study: virtual time")
    c.add_argument("--seeds", default="1", help="comma-separated seeds (studies)")
    c.add_argument("--window", type=_time, default=50e-6,
                   help="sliding window the plots smooth throughput over")
    c.add_argument("--out", default="results")
    c.add_argument("--no-progress", action="store_true")


def _cluster(args, out: Path, progress: bool) -> int:
    from ..experiments import cluster as cl
    if args.study == "victim":
        return _cluster_victim(cl, args, out)
    base = dict(hosts=args.hosts, hosts_per_leaf=args.hosts_per_leaf, spines=args.spines,
                rate_gbps=args.rate_gbps, spine_rate_gbps=args.spine_rate_gbps,
                size=args.size, qps=args.qps, grants=args.grants, routing=args.routing,
                placement=args.placement, buffer=args.buffer, xoff=args.xoff, xon=args.xon,
                admission=args.admission, chunk=args.chunk,
                slots=args.slots, payload=args.payload, max_time=args.max_time,
                qp_timeout=args.qp_timeout)
    for k in ("collective", "algorithm", "mode", "cc"):
        if getattr(args, k) is not None:
            base[k] = getattr(args, k)
    try:
        if args.study == "single":
            res = cl.run(cl.ClusterConfig(**base), progress=progress)
        else:
            seeds = [int(x) for x in args.seeds.split(",")]
            st = cl.study(args.study, base, seeds=seeds, progress=progress)
    except ValueError as e:
        print(f"softnic experiment cluster: {e}", file=sys.stderr)
        return 2
    if args.study == "single":
        return _cluster_single(cl, res, out, args.window)
    return _cluster_study(cl, st, out, args.study)


def _cluster_victim(cl, args, out: Path) -> int:
    """The PFC head-of-line blocking study: a table of three modes, JSON and a plot."""
    runs = {}
    print("PFC head-of-line blocking: 3 leaves x 4 hosts, 1 spine, hosts "
          f"{args.rate_gbps:g} Gbit/s, spine links {args.spine_rate_gbps or 400:g} Gbit/s, "
          f"{args.duration * 1e3:g} ms\n")
    print("| mode | victim Gbit/s (2nd half) | incast total Gbit/s | PAUSE frames | "
          "victim's uplink paused | drops | resent |")
    print("|---|---|---|---|---|---|---|")
    for label, mode, cc in (("lossy", "lossy", "none"), ("lossless", "lossless", "none"),
                            ("lossless+dcqcn", "lossless", "dcqcn")):
        r = cl.victim(cl.VictimConfig(mode=mode, cc=cc, rate_gbps=args.rate_gbps,
                                      spine_rate_gbps=args.spine_rate_gbps or 400.0,
                                      duration=args.duration, buffer=args.buffer,
                                      xoff=args.xoff, xon=args.xon,
                                      seed=int(args.seeds.split(",")[0])))
        runs[label] = r
        s = r["summary"]
        print(f"| {label} | {s['victim_gbps']:.2f} | {s['incast_total_gbps']:.2f} | "
              f"{s['pause_frames']} | {s['paused_s']['leaf0->spine0'] * 1e6:.0f} µs | "
              f"{s['switch_drops']} | {s['retransmitted_pkts']} |")
    j = cl.write_json(runs, out / "cluster-victim.json")
    p = cl.plot_victim(runs, out / "cluster-victim.png", window=args.window)
    print(f"\nwrote {j} and {p}")
    return 0


def _cluster_single(cl, res: dict, out: Path, window) -> int:
    """One run's figures, JSON and plot; 1 if it did not finish cleanly."""
    s = res["summary"]
    c = res["config"]
    print(f"{c['collective']} {c['algorithm']} {c['size'] / 2**20:g} MiB/rank, "
          f"{c['hosts']} hosts "
          f"({c['hosts_per_leaf']}/leaf, oversubscription {s['oversubscription']:g}:1), "
          f"{c['qps']} QP/peer, {c['mode']}, cc={c['cc']}, {c['routing']}"
          f"{', admission' if c['admission'] else ''}")
    if s["finished"]:
        print(f"  completion {s['completion_s'] * 1e3:.3f} ms ({s['slowdown']:.2f}x the "
              f"line-rate {s['ideal_s'] * 1e3:.3f} ms)")
    else:
        print("  did not finish")
    print(f"  transfers p50 {s['fct_p50_s'] * 1e3:.3f} ms  p99 {s['fct_p99_s'] * 1e3:.3f} ms;"
          f"  drops {s['switch_drops']}  resent {s['retransmitted_pkts']}  timeouts "
          f"{s['timeouts']}  PAUSE frames {s['pause_frames']}  time paused (all ports) "
          f"{s['pause_time_all_s'] * 1e6:.0f} µs  busiest uplink / mean "
          f"{s['uplink_max_over_mean']:.2f}")
    print(f"  payload {s['payload']}")
    print(f"  {s['events']} events in {s['wall_s']:.1f} s wall")
    j = cl.write_json(res, out / "cluster-single.json")
    p = cl.plot_run(res, out / "cluster-single.png", window=window)
    print(f"  wrote {j} and {p}")
    return 0 if s["finished"] and not s["wc_errors"] else 1


def _cluster_study(cl, st: dict, out: Path, study: str) -> int:
    """A study's table of variants and seeds, JSON and plot; 1 if a run did not finish."""
    print(st["title"])
    b = st["runs"][next(iter(st["runs"]))]["config"]
    print(f"{b['hosts']} hosts, {b['hosts_per_leaf']}/leaf, {b['spines'] or b['hosts_per_leaf']} "
          f"spines, {b['rate_gbps']:g} Gbit/s, {b['size'] / 2**20:g} MiB/rank, "
          f"seeds {st['seeds']}\n")
    print("| variant | seed | completion ms | x line rate | transfer p50 ms | p99 ms | drops | "
          "resent | PAUSE frames | time paused, all ports µs | busiest uplink/mean |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for r in st["rows"]:
        if not r["finished"]:
            ok = False
            print(f"| {r['variant']} | {r['seed']} | unfinished | | | | | | | | |")
            continue
        print(f"| {r['variant']} | {r['seed']} | {r['completion_s'] * 1e3:.3f} | "
              f"{r['slowdown']:.2f} | {r['fct_p50_s'] * 1e3:.3f} | {r['fct_p99_s'] * 1e3:.3f} | "
              f"{r['switch_drops']} | {r['retransmitted_pkts']} | {r['pause_frames']} | "
              f"{r['pause_time_all_s'] * 1e6:.0f} | {r['uplink_mean_max_over_mean']:.2f} |")
    j = cl.write_json(st, out / f"cluster-{study}.json")
    p = cl.plot_study(st, out / f"cluster-{study}.png")
    print(f"\nwrote {j} and {p}")
    return 0 if ok else 1


def main(args) -> int:
    if args.experiment == "sweep":
        return _sweep(args)
    from ..experiments import bottleneck as ex
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    if args.experiment == "cluster":
        return _cluster(args, out, progress)
    if args.experiment == "loss":
        if args.total < args.msg:
            print(f"softnic experiment loss: --total ({args.total} B) must be at least --msg "
                  f"({args.msg} B)", file=sys.stderr)
            return 2
        losses = [float(x) for x in args.losses.split(",")]
        rows = ex.loss_sweep(losses, progress=progress, total=args.total, msg=args.msg,
                             rate=args.rate_gbps * 1e9, delay=args.delay, window=args.window,
                             mtu=args.mtu, seed=args.seed)
        print(f"one RC flow, {args.rate_gbps:g} Gbit/s, RTT {2 * args.delay * 1e6:g} us, "
              f"window {args.window} packets, MTU {args.mtu}, {args.total >> 20} MiB per run\n")
        print("| recovery | loss | goodput Gbit/s | vs lossless | retransmitted | timeouts |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            vs = f"{r['vs_lossless']:.3f}" if r["vs_lossless"] is not None else "n/a"
            print(f"| {r['mode']} | {r['loss']:.1%} | {r['goodput_gbps']:.3f} | {vs} | "
                  f"{r['retransmitted_pkts']} | {r['timeouts']} |"
                  + ("" if r["ok"] else " INCOMPLETE"))
        j = ex.write_json(rows, out / "loss.json")
        p = ex.plot_loss(rows, out / "loss.png")
        print(f"\nwrote {j} and {p}")
        return 0 if all(r["ok"] for r in rows) else 1
    rc = 0
    for spec in args.cc.split("+"):
        cfg = ex.IncastConfig(cc=spec, senders=args.senders, rate_gbps=args.rate_gbps,
                              duration=args.duration, late_join=args.late_join, mtu=args.mtu,
                              msg=args.msg, buffer=args.buffer, kmin=args.kmin,
                              kmax=args.kmax, pmax=args.pmax, delay=args.delay,
                              window=args.window, selective_repeat=args.selective_repeat,
                              seed=args.seed, pfc=args.pfc, xoff=args.xoff, xon=args.xon)
        try:
            res = ex.incast(cfg, progress=progress)
        except ValueError as e:
            print(f"softnic experiment incast: {e}", file=sys.stderr)
            return 2
        s = res["summary"]
        stem = "incast-" + spec.split(":")[0] + ("-pfc" if args.pfc else "")
        j = ex.write_json(res, out / f"{stem}.json")
        p = ex.plot_incast(res, out / f"{stem}.png")
        late = s["late_flow_converged_after_s"]
        print(f"incast {s['senders']}:1  cc={spec}  {args.rate_gbps:g} Gbit/s  "
              f"{args.duration * 1e3:g} ms virtual ({s['wall_s']:.1f} s wall)")
        print(f"  Jain's fairness (steady state, t > {s['steady_from_s'] * 1e3:g} ms): "
              f"{s['jain_steady']:.3f}")
        print(f"  bottleneck queue: p50 {s['queue_p50_kb']:.1f} KB  p99 {s['queue_p99_kb']:.1f} KB"
              f"  max {s['queue_max_kb']:.1f} KB  (steady p50 {s['queue_steady_p50_kb']:.1f}, "
              f"p99 {s['queue_steady_p99_kb']:.1f})")
        print(f"  goodput {s['goodput_gbps']:.2f} Gbit/s ({s['goodput_fraction']:.1%} of the "
              f"bottleneck; steady state {s['steady_total_goodput_gbps']:.2f})  drops {s['switch_drops']}  retransmitted {s['retransmitted_pkts']}"
              f"  timeouts {s['timeouts']}  ECN marks {s['ecn_marked']}  CNPs {s['cnps_sent']}")
        if args.pfc:
            print(f"  PFC: {s['pause_frames']} PAUSE frames; senders paused "
                  f"{s['senders_paused_s'] * 1e6:.0f} µs in all, "
                  f"{s['senders_paused_steady_s'] * 1e6:.0f} µs at steady state")
        if args.late_join is not None:
            print("  late flow reached its fair share after "
                  + (f"{late * 1e3:.2f} ms" if late is not None else "— never, in this run"))
        print(f"  wrote {j} and {p}")
        if s["wc_errors"]:
            rc = 1
    return rc
