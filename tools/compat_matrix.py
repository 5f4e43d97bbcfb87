"""The compatibility matrix: which real programs run on softnic, over which transport,
under which faults, at which version, with which result, from a run of the tests.

    python tools/compat_matrix.py run                  # pytest -m compat, then the doc
    python tools/compat_matrix.py write results/compat.xml   # the doc from a run's XML

A test says what it exercises with a marker (registered in pyproject.toml):

    @pytest.mark.compat("rdmacm-utils")                       # transport and faults from
    @pytest.mark.parametrize("faults", [None, "loss=0.02"])   # the test's parameters
    def test_rping(faults): ...

    @pytest.mark.compat("ucx", faults="loss")                 # or given

``program`` is a key of PROGRAMS; ``transport`` is roce, roce6 (RoCEv2 between devices with
IPv6 addresses), iwarp or sim (default: the
test's ``transport`` parameter, udp -> roce and tcp -> iwarp, else roce); ``faults`` is
lossless, loss or reorder, or a list (default: the test's ``faults`` parameter, a fault
model string: none is lossless, loss or bursts count as loss, reorder as reorder).

``run`` runs the tagged tests (only those) with this module as a pytest plugin
(``-p compat_matrix``), which writes each test's marker, the program's version (the
Debian package's, from dpkg-query, or the Python distribution's) and the interpreter
into pytest's JUnit XML as properties; ``write`` reads that XML and writes
docs/compatibility.md.  A cell no test covers says "not tested".
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "compatibility.md"

#: program -> (what the matrix calls it, where its version comes from: ("deb", package)
#: or ("dist", Python distribution), what the tests run of it)
PROGRAMS: dict[str, tuple[str, tuple[str, str], str]] = {
    "ibverbs-utils": ("ibverbs-utils", ("deb", "ibverbs-utils"),
                      "ibv_devices, ibv_devinfo, ibv_rc_pingpong"),
    "perftest": ("perftest", ("deb", "perftest"), "ib_write_bw; with -R: ib_write_bw, "
                 "ib_read_lat, ib_send_lat"),
    "qperf": ("qperf", ("deb", "qperf"), "rc_bw, rc_lat ... with -cm1"),
    "rdmacm-utils": ("rdmacm-utils", ("deb", "rdmacm-utils"), "rping, ucmatose, udaddy, "
                     "rdma_server/rdma_client, rdma_xserver/rdma_xclient, mckey, cmtime; "
                     "over rsockets: rstream, riostream, rcopy"),
    "iperf3-rspreload": ("iperf3 over rsockets", ("deb", "iperf3"),
                         "an unmodified iperf3 with Debian's librspreload.so"),
    "ucx": ("UCX", ("deb", "ucx-utils"), "ucx_info, ucx_perftest over rc_verbs and ud_verbs"),
    "openmpi": ("Open MPI", ("deb", "openmpi-bin"), "mpirun of a C MPI program, pml ucx"),
    "mpi4py": ("mpi4py", ("deb", "python3-mpi4py"), "an mpi4py program in /usr/bin/python3"),
    "libfabric": ("libfabric", ("deb", "libfabric-bin"), "fi_info, fi_pingpong (verbs, "
                  "verbs;ofi_rxm), between two network namespaces"),
    "rdma-core-tests": ("rdma-core's tests", ("deb", "python3-pyverbs"),
                        "rdma-core's Python test suite (tools/rdma_core_tests.py), both faces"),
    "pyverbs-softnic": ("pyverbs programs on softnic's pyverbs", ("dist", "softnic"),
                        "unmodified pyverbs programs under softnic exec (examples/, tests/)"),
    "pyverbs-debian": ("pyverbs programs on Debian's pyverbs", ("deb", "python3-pyverbs"),
                       "the same programs on Debian's pyverbs over softnic's C libraries"),
    "torch": ("torch", ("dist", "torch"), "torch.distributed with softnic's backend "
              "(collectives, DDP)"),
}
TRANSPORTS = {"roce": "RoCEv2/UDP", "roce6": "RoCEv2/UDP over IPv6", "iwarp": "iWARP/TCP",
              "sim": "simulated fabric"}
FAULTS = {"lossless": "lossless", "loss": "loss", "reorder": "reorder"}
PROPERTY = "compat"


# ---------------------------------------------------------------- the pytest plugin


def fault_modes(model: str | None) -> list[str]:
    """A fault model string (``loss=0.02,reorder=0.01/200us``) -> its columns."""
    if not model:
        return ["lossless"]
    keys = {item.split("=", 1)[0].strip() for item in model.split(",") if item.strip()}
    modes = []
    if keys & {"loss", "burst", "gilbert", "ge"}:
        modes.append("loss")
    if "reorder" in keys:
        modes.append("reorder")
    return modes or ["lossless"]


@functools.cache
def version(program: str) -> str:
    kind, name = PROGRAMS[program][1]
    from softnic.cli.doctor import distribution_version, package_version
    v = package_version(name) if kind == "deb" else distribution_version(name)
    return f"{name} {v}" if v else "not installed"


def record(marker, params: dict) -> dict:
    """What a test's ``compat`` marker says, with its parameters resolved."""
    if len(marker.args) != 1 or set(marker.kwargs) - {"transport", "faults"}:
        raise ValueError("compat(program, transport=..., faults=...)")
    program = marker.args[0]
    if program not in PROGRAMS:
        raise ValueError(f"compat: unknown program {program!r} (one of {', '.join(PROGRAMS)})")
    transport = marker.kwargs.get("transport")
    if transport is None:
        transport = {"udp": "roce", "tcp": "iwarp"}.get(params.get("transport"), "roce")
    faults = marker.kwargs.get("faults")
    if faults is None:
        faults = fault_modes(params.get("faults"))
    elif isinstance(faults, str):
        faults = [faults]
    if transport not in TRANSPORTS or not set(faults) <= set(FAULTS):
        raise ValueError(f"compat: transport {transport!r} (one of {', '.join(TRANSPORTS)}), "
                         f"faults {faults!r} (of {', '.join(FAULTS)})")
    return {"program": program, "transport": transport, "faults": list(faults),
            "version": version(program), "python": platform.python_version()}


def pytest_collection_modifyitems(config, items):
    import pytest
    for item in items:
        marker = item.get_closest_marker("compat")
        if marker is None:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        try:
            rec = record(marker, params)
        except ValueError as e:
            raise pytest.UsageError(f"{item.nodeid}: {e}") from None
        item.user_properties.append((PROPERTY, json.dumps(rec)))


# ---------------------------------------------------------------- the matrix from the XML


def read_junit(path: Path) -> tuple[list[dict], str]:
    """(each tagged test: its record, its id, outcome and message; the run's timestamp)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    stamp = next((s.get("timestamp") for s in suites if s.get("timestamp")), "")
    tests = []
    for suite in suites:
        for case in suite.iter("testcase"):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            if PROPERTY not in props:
                continue
            rec = json.loads(props[PROPERTY])
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = {"failure": "failed", "error": "failed"}.get(tag, "skipped")
                    message = el.get("message") or ""
                    break
            name = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name")
            tests.append({**rec, "test": name, "outcome": outcome, "message": message})
    return tests, stamp


def cell(results: list[dict]) -> str:
    if not results:
        return "not tested"
    n = len(results)
    failed = sum(r["outcome"] == "failed" for r in results)
    skipped = sum(r["outcome"] == "skipped" for r in results)
    passed = n - failed - skipped
    if failed:
        return f"**FAILED** {failed} of {n}"
    if not passed:
        return f"skipped ({n})"
    return f"passed ({passed})" + (f", {skipped} skipped" if skipped else "")


def _when(stamp: str) -> str:
    """JUnit's timestamp of the run, in UTC when it carries its offset."""
    if not stamp:
        return "(no timestamp)"
    t = _dt.datetime.fromisoformat(stamp)
    if t.tzinfo is None:
        return t.strftime("%Y-%m-%d %H:%M") + " (the machine's local time)"
    return t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _system() -> str:
    try:
        return platform.freedesktop_os_release()["PRETTY_NAME"]
    except (OSError, KeyError):
        return platform.system()


def render(tests: list[dict], stamp: str) -> str:
    by = defaultdict(list)
    for t in tests:
        for f in t["faults"]:
            by[t["program"], t["transport"], f].append(t)
    pythons = sorted({t["python"] for t in tests})
    when = _when(stamp)
    cols = [(tr, f) for tr in TRANSPORTS for f in FAULTS]
    passed = sum(t["outcome"] == "passed" for t in tests)
    failed = sum(t["outcome"] == "failed" for t in tests)
    skipped = len(tests) - passed - failed
    out = [
        "# Compatibility matrix",
        "",
        "Which real programs and test suites run on softnic, by transport and by fault "
        "mode, with the version tested and the result.  Generated by "
        "`tools/compat_matrix.py run` from one run of the tests tagged "
        "`@pytest.mark.compat` (`pytest -m compat`); do not edit by hand.",
        "",
        f"Run: {when}, {len(tests)} tests ({passed} passed, {failed} failed, {skipped} "
        f"skipped), Python {', '.join(pythons)} (the test runner's; programs in "
        f"`/usr/bin/python3` run Debian's), on {_system()}.",
        "",
        "A cell counts the tests of that program, transport and fault mode: `passed (n)`, "
        "`**FAILED** k of n`, `skipped (n)` (the program or a package was missing), or "
        "`not tested` (no test covers it).  Fault modes: lossless (no fault model), loss "
        "(random or burst loss, `loss=0.02` and the like), reorder (`reorder=...`).",
        "",
        "| program | version | " + " | ".join(f"{TRANSPORTS[tr]}, {FAULTS[f]}"
                                          for tr, f in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for key, (title, _src, _what) in PROGRAMS.items():
        versions = sorted({t["version"] for t in tests if t["program"] == key})
        row = [title, ", ".join(versions) if versions else "(no test)"]
        row += [cell(by[key, tr, f]) for tr, f in cols]
        out.append("| " + " | ".join(row) + " |")
    out += ["", "## What each row runs, test by test", ""]
    for key, (title, _src, what) in PROGRAMS.items():
        mine = [t for t in tests if t["program"] == key]
        out.append(f"**{title}**: {what}.")
        out.append("")
        if not mine:
            out += ["No test tagged.", ""]
            continue
        for t in sorted(mine, key=lambda t: t["test"]):
            modes = "+".join(t["faults"])
            note = f": {t['message'][:160]}" if t["outcome"] != "passed" and t["message"] else ""
            out.append(f"- `{t['test']}` ({TRANSPORTS[t['transport']]}, {modes}): "
                       f"{t['outcome']}{note}")
        out.append("")
    return "\n".join(out)


def write(xml: Path, out: Path = DOC) -> int:
    tests, stamp = read_junit(xml)
    if not tests:
        print(f"compat_matrix: {xml} has no tagged tests (run them with -p compat_matrix, "
              f"as 'python tools/compat_matrix.py run' does)", file=sys.stderr)
        return 1
    out.write_text(render(tests, stamp))
    print(f"{out}: {len(tests)} tests")
    return 0


def run(xml: Path, pytest_args: list[str]) -> int:
    """pytest -m compat with this plugin, then the doc (even if some test failed: the
    matrix shows it)."""
    xml.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "compat", "-p", "compat_matrix",
           f"--junitxml={xml}", *pytest_args]
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    if rc not in (0, 1):                # 1: some test failed; anything else: no run
        return rc
    return write(xml) or rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the tagged tests and write docs/compatibility.md")
    r.add_argument("--junitxml", type=Path, default=ROOT / "results" / "compat.xml")
    r.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    w = sub.add_parser("write", help="write docs/compatibility.md from a run's JUnit XML")
    w.add_argument("xml", type=Path)
    w.add_argument("--out", type=Path, default=DOC)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return run(args.junitxml, args.pytest_args)
    return write(args.xml, args.out)


if __name__ == "__main__":
    sys.exit(main())
