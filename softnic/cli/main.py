"""The ``softnic`` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SHIM = Path(__file__).resolve().parent.parent / "faces" / "pyverbs_shim"


def _exec(args) -> int:
    """Run a program with ``import pyverbs`` resolving to softnic, steered by SOFTNIC_*."""
    if not args.command:
        print("softnic exec: give a command, e.g. softnic exec python3 app.py", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.pyverbs != "system":            # softnic's verbs_api answers "import pyverbs"
        # (the shim alone: the program's other imports stay its own)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(SHIM)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for key, val in (("DEVICES", args.devices), ("FAULTS", args.faults), ("SEED", args.seed),
                     ("CAPTURE", args.capture), ("RECOVERY", args.recovery), ("CC", args.cc),
                     ("TRANSPORT", args.transport)):
        if val is not None:
            env["SOFTNIC_" + key] = str(val)
    if args.faults is not None:
        from ..driver.faults import FaultModel
        FaultModel.parse(args.faults)           # a bad model is an error here, not in the child
    if args.cc is not None:
        import congestion
        try:
            congestion.parse_spec(args.cc)
        except ValueError as e:
            print(f"softnic exec: --cc: {e}", file=sys.stderr)
            return 2
    cmd = args.command[1:] if args.command[0] == "--" else args.command
    if args.libibverbs is None and args.pyverbs == "system":
        args.libibverbs = True          # the machine's pyverbs runs over softnic's libibverbs
    if args.libibverbs is not False and not _c_faces(env, cmd[0], bool(args.libibverbs)):
        return 1
    try:
        os.execvpe(cmd[0], cmd, env)
    except FileNotFoundError:
        print(f"softnic exec: {cmd[0]}: command not found", file=sys.stderr)
        return 127


def _c_faces(env: dict, program: str, asked: bool) -> bool:
    """Every program of the tree loads softnic's libibverbs, however it loads it, and its
    librdmacm beside it (``env`` gains what makes them).  Each is offered on its own: one
    that cannot be built costs only what needs it, with a one-line warning saying what
    to install; but without libibverbs a program that links it, or a run that asked for
    the C faces (``asked``), would not run on softnic at all: False, after saying why."""
    from ..faces.libibverbs.launch import BuildError, library_env, links_library
    from ..faces.librdmacm.launch import library_env as rdmacm_env
    try:
        env.update(library_env(env))
    except BuildError as e:
        if asked or links_library(program):
            print(f"softnic exec: {e}", file=sys.stderr)
            return False
        print(f"softnic exec: warning: C programs in this run will not see softnic ({e})",
              file=sys.stderr)
        return True
    try:
        env.update(rdmacm_env(env))
    except BuildError as e:
        # (perftest links librdmacm and needs it only with -R: the program runs)
        print(f"softnic exec: warning: rdma_cm calls in this run will not reach softnic "
              f"({e})", file=sys.stderr)
    return True


def _counters(args) -> int:
    from ..driver.hostfiles import process_alive, stats_dir
    d = stats_dir()
    rows = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        alive = process_alive(doc["pid"], doc.get("start")) and not doc.get("closed")
        if alive or args.all:
            rows.append((doc, alive))
    if args.json:
        print(json.dumps([d for d, _ in rows], indent=1))
        return 0
    if not rows:
        print(f"no live softnic devices (statistics in {d})")
        return 0
    for doc, alive in rows:
        age = time.time() - doc["time"]
        state = "live" if alive else "exited"
        print(f"{doc['device']}  pid {doc['pid']}  {doc['gid']}  udp {doc['ip']}:{doc['port']}  "
              f"({state}, updated {age:.1f} s ago)")
        items = [(k, v) for k, v in doc["counters"].items() if v or args.verbose]
        for k, v in items:
            print(f"    {k:<28}{v}")
    return 0


def _timeline(args) -> int:
    from ..driver.timeline import read, summary, window
    by_pid = read(args.paths)
    if not by_pid:
        print(f"no timeline in {' '.join(args.paths)} (record one with "
              f"SOFTNIC_TIMELINE=DIR in the programs' environment)", file=sys.stderr)
        return 1
    for pid, events in sorted(by_pid.items()):
        span = (max(e.end for e in events) - min(e.start for e in events)) / 1e6
        print(f"pid {pid}: {len(events)} events over {span:.1f} ms")
        print(f"    {'':34}{'count':>8}{'mean us':>10}{'total ms':>10}{'of span':>9}")
        for r in summary(events):
            print(f"    {r.what:34}{r.count:>8}{r.mean_us:>10.1f}{r.total_ms:>10.1f}"
                  f"{r.share:>9.1%}")
    if args.window:
        print(f"\n{args.window} events from {args.at:.0%} of the run on (us from the first, "
              f"duration us, pid, thread, event):")
        for line in window(by_pid, args.at, args.window):
            print("  " + line)
    return 0


def _lab(args) -> int:
    from . import labs
    from ..trace.ladder import from_fabric_trace, render_svg, render_text
    try:
        runs = labs.run_lab(args.number, args.seed)
    except ValueError as e:
        print(f"softnic lab: {e}", file=sys.stderr)
        return 2
    for i, run in enumerate(runs):
        print(labs.describe(run))
        if not run.ladder:
            print()
            continue
        events = from_fabric_trace(run.fabric.trace)
        print(render_text(events))
        if args.svg:
            path = args.svg if len(runs) == 1 else args.svg.replace(".svg", f"-{i + 1}.svg")
            render_svg(events, path)
            print(f"  ladder drawn to {path}")
        print()
    return 0


def _parser() -> argparse.ArgumentParser:
    """The command line: one subparser per subcommand."""
    ap = argparse.ArgumentParser(prog="softnic", description="A software RDMA NIC.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="two NICs in the simulated fabric over a lossy link")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--faults", default=None,
                   help="fault model, e.g. 'loss=0.02,dup=0.01' (default: the demo's)")
    d.add_argument("--mtu", type=int, default=1024, choices=(256, 512, 1024, 2048, 4096))
    d.add_argument("--selective-repeat", action="store_true",
                   help="recover from loss with selective repeat instead of go-back-N")
    _exec_arguments(sub)
    c = sub.add_parser("counters", help="counters of the softnic devices of running programs")
    from ..driver.hostfiles import KEEP_EXITED
    c.add_argument("-a", "--all", action="store_true",
                   help=f"include exited programs (their newest {KEEP_EXITED} devices' "
                        f"counters are kept)")
    c.add_argument("-v", "--verbose", action="store_true", help="show zero counters too")
    c.add_argument("--json", action="store_true")
    t = sub.add_parser("timeline", help="where programs' time in softnic went: the "
                       "timelines SOFTNIC_TIMELINE=DIR recorded, summed and merged")
    t.add_argument("paths", nargs="+", help="the directory SOFTNIC_TIMELINE named, or files")
    t.add_argument("--window", type=int, default=0, metavar="N",
                   help="also print N events of the merged timeline")
    t.add_argument("--at", type=float, default=0.5, metavar="FRACTION",
                   help="where in the run the window starts (default 0.5: the middle)")
    v = sub.add_parser("devinfo", help="what ibv_devinfo prints, for softnic's devices")
    v.add_argument("-d", "--ib-dev", help="only this device")
    v.add_argument("-v", "--verbose", action="store_true", help="all device attributes")
    from .ladder import add_arguments as trace_arguments
    trace_arguments(sub.add_parser("trace", help="packet ladder of a RoCEv2 pcap or a "
                                   "simulated lossy run (--demo)"))
    lab = sub.add_parser("lab", help="run a teaching lab (see docs/labs): ladder, completions, "
                         "counters")
    lab.add_argument("number", type=int, help="lab number (1-6)")
    lab.add_argument("--seed", type=int, default=1)
    lab.add_argument("--svg", help="also draw the ladder(s) to this SVG file")
    from .experiment_cli import add_arguments as experiment_arguments
    experiment_arguments(sub.add_parser("experiment", help="congestion (incast) and loss "
                                        "experiments in virtual time: JSON, PNG, figures"))
    from .launch import add_arguments as launch_arguments
    launch_arguments(sub.add_parser("launch", help="run N ranks of a program on this "
                                        "machine (torchrun's environment, a device each)"))
    from .perf import add_arguments as perf_arguments
    perf_arguments(sub.add_parser("perf", help="benchmarks: perftest's (write_bw, read_lat, ...) "
                                  "between two softnic processes, and allreduce"))
    from ..faces.libibverbs.launch import add_build_librdmacm_parser, add_build_parser
    add_build_parser(sub)
    add_build_librdmacm_parser(sub)
    from .doctor import add_arguments as doctor_arguments
    doctor_arguments(sub.add_parser("doctor", help="which faces work on this machine, and "
                                    "the command that installs what the others lack"))
    return ap


def _exec_arguments(sub) -> None:
    """softnic exec's options: the SOFTNIC_* settings for COMMAND, and which faces it gets."""
    e = sub.add_parser("exec", help="run a program whose 'import pyverbs' (or, for a C "
                       "program, libibverbs) uses softnic",
                       description="Run COMMAND with pyverbs resolving to softnic's (only for "
                       "that program; an installed pyverbs is untouched) and softnic's devices "
                       "configured by the options below or the SOFTNIC_* environment.")
    e.add_argument("--devices", help="e.g. 'softnic0=127.0.0.2,softnic1=127.0.0.3' or a count")
    e.add_argument("--faults", help="fault model on every device's sends, e.g. 'loss=0.05'")
    e.add_argument("--seed", type=int, help="seed of the fault model")
    e.add_argument("--capture", help="pcap path (one file per device beside it)")
    e.add_argument("--recovery", choices=("gbn", "sr"), help="go-back-N or selective repeat")
    e.add_argument("--cc", help="congestion control, e.g. 'dcqcn' or 'hpcc:eta=0.9'")
    e.add_argument("--transport", choices=("udp", "tcp"),
                   help="RoCEv2 over UDP (default) or iWARP over TCP, for every device")
    e.add_argument("--libibverbs", action=argparse.BooleanOptionalAction, default=None,
                   help="put softnic's libibverbs.so.1 on LD_LIBRARY_PATH and its preload "
                   "on LD_PRELOAD for the whole process tree (default: yes; a build failure "
                   "is then only a warning unless COMMAND links libibverbs)")
    e.add_argument("--pyverbs", choices=("softnic", "system"), default="softnic",
                   help="which pyverbs a Python COMMAND imports: softnic's own (verbs_api, "
                   "default) or the machine's (e.g. Debian's python3-pyverbs, with /usr/bin/"
                   "python3) running over softnic's libibverbs.so.1")
    e.add_argument("command", nargs=argparse.REMAINDER)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # whoever read the output stopped (``softnic timeline DIR | head``): no
        # traceback, and none from the interpreter's own flush of stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd in ("build-libibverbs", "build-librdmacm"):
        from ..faces.libibverbs.launch import run_build
        return run_build(args)
    if args.cmd == "perf":
        from .perf import main as perf
        return perf(args)
    if args.cmd == "experiment":
        from .experiment_cli import main as experiment
        return experiment(args)
    if args.cmd == "launch":
        from . import launch
        return launch.main(args)
    if args.cmd == "lab":
        return _lab(args)
    if args.cmd == "demo":
        from . import demo
        ok = demo.run(seed=args.seed, faults=args.faults or demo.DEFAULT_FAULTS, mtu=args.mtu,
                      selective_repeat=args.selective_repeat)
        return 0 if ok else 1
    if args.cmd == "exec":
        return _exec(args)
    if args.cmd == "counters":
        return _counters(args)
    if args.cmd == "timeline":
        return _timeline(args)
    if args.cmd == "trace":
        from .ladder import main as trace
        return trace(args)
    if args.cmd == "doctor":
        from .doctor import main as doctor
        return doctor(args)
    if args.cmd == "devinfo":
        from .devinfo import main as devinfo
        return devinfo(args.ib_dev, args.verbose)
    return 2


if __name__ == "__main__":
    sys.exit(main())
