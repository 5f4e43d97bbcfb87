"""Run rdma-core's own Python test suite against softnic as its authors run it:
``tests/run_tests.py --dev softnic0 -v``, every module of the suite in one process, under
``softnic exec`` through either face.

    python tools/rdma_core_tests.py --face c        # the machine's pyverbs over softnic's libibverbs.so.1
    python tools/rdma_core_tests.py --face python   # softnic's verbs_api as pyverbs
    python tools/rdma_core_tests.py --face both -k test_mr --timeout 900
    python tools/rdma_core_tests.py --face python --tests ~/rdma-core/tests

The tests come from Debian's python3-pyverbs (``/usr/share/doc/rdma-core/tests``, some
files gzipped) or ``--tests DIR`` (rdma-core's ``tests/``, holding ``run_tests.py``).
They are copied (and gunzipped) into a temporary directory, and rdma-core's runner loads
every module there (its ``tests/__init__.py`` imports each ``test_*.py``: one that cannot
load stops the run, as it would on a real device).  ``-k`` is unittest's own filter.
The output is the runner's own, then a summary per module, every skip grouped by its
reason, every failure and error with the last lines of its traceback, and the runner's
closing lines ("Ran N tests in T s", "OK (skipped=K)").  ``--json FILE`` writes the
results for tools (tests/test_rdma_core_suite.py reads them).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
DEBIAN_TESTS = Path("/usr/share/doc/rdma-core/tests")
SYSTEM_PYTHON = "/usr/bin/python3"
FACES = {"c": "C face (the machine's pyverbs over softnic's libibverbs.so.1)",
         "python": "Python face (softnic's verbs_api as pyverbs)"}

# unittest's verbose lines: "test_x (tests.mod.Class.test_x)" (then, on the next line,
# the first line of the test's docstring), " ... " and the outcome; what the test prints
# may come between " ... " and the outcome.
_HEAD = re.compile(r"^(test\w*) \((tests\.[\w.]+)\)")
_OUTCOME = re.compile(r"(?:^|\.\.\. )(ok|ERROR|FAIL|skipped (['\"])(.*)\2|expected failure|"
                      r"unexpected success)$")
_REPORT = re.compile(r"^(ERROR|FAIL): (test\w*) \((tests\.[\w.]+)\)")
_OUTCOMES = {"ok": "passed", "ERROR": "error", "FAIL": "failed", "expected failure": "passed",
             "unexpected success": "failed"}


def prepare(src: Path, dest: Path) -> Path:
    """Copy rdma-core's ``tests`` directory ``src`` (gunzipping ``*.gz``) to
    ``dest/tests``; return it."""
    if not (src / "run_tests.py").exists():
        raise FileNotFoundError(f"{src} holds no run_tests.py (rdma-core's tests/ does)")
    pkg = dest / "tests"
    pkg.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name.endswith(".py.gz"):
            with gzip.open(f, "rb") as g:
                (pkg / f.name[:-3]).write_bytes(g.read())
        elif f.is_file() and f.suffix == ".py":
            shutil.copyfile(f, pkg / f.name)
    return pkg


def face_command(face: str) -> list[str]:
    """The command prefix that runs a Python program on softnic through ``face``."""
    exec_ = [sys.executable, "-m", "softnic.cli", "exec"]
    if face == "c":
        return exec_ + ["--pyverbs", "system", "--", SYSTEM_PYTHON]
    return exec_ + ["--pyverbs", "softnic", "--", sys.executable]


def parse(text: str) -> tuple[list[dict], list[str]]:
    """Each test's outcome in the runner's verbose output, the traceback of each error
    and failure as detail, and the runner's closing lines ("Ran ...", "OK ..." or
    "FAILED ...")."""
    results: dict[str, dict] = {}
    current = None
    lines = text.splitlines()
    for line in lines:
        head = _HEAD.match(line)
        if head:
            current = head.group(2)
        m = _OUTCOME.search(line.rstrip())
        if m and current is not None:
            word = m.group(1)
            outcome = "skipped" if word.startswith("skipped") else _OUTCOMES[word]
            results[current] = {"test": current, "module": current.split(".")[1],
                                "outcome": outcome,
                                "detail": m.group(3) if outcome == "skipped" else ""}
            current = None
    # the tracebacks, after the run: "ERROR: test_x (id)", a rule, the traceback
    i = 0
    while i < len(lines):
        m = _REPORT.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith(("=" * 20, "Ran ")):
            j += 1
        tid = m.group(3)
        r = results.setdefault(tid, {"test": tid, "module": tid.split(".")[1],
                                     "outcome": "error" if m.group(1) == "ERROR" else "failed"})
        r["detail"] = "\n".join(ln for ln in lines[i + 1:j] if not set(ln) <= {"-"}).strip()
        i = j
    closing = [ln for ln in lines if ln.startswith("Ran ") and " test" in ln]
    closing += [ln for ln in lines if re.match(r"^(OK|FAILED)( \(.*\))?$", ln)]
    return list(results.values()), closing[-2:]


def run_face(face: str, pkg: Path, dev: str, timeout: float, only: list[str],
             out=sys.stdout) -> dict:
    """rdma-core's runner through ``face``: its output streamed to ``out``, then
    ``{"face", "results", "closing", "status", "seconds"}``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = face_command(face) + [str(pkg / "run_tests.py"), "--dev", dev, "-v"]
    for k in only:
        cmd += ["-k", k]
    print(f"== {FACES[face]}: {' '.join(cmd[cmd.index('--') + 1:])}", file=out, flush=True)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         cwd=str(pkg.parent), start_new_session=True, text=True,
                         errors="replace")
    timed_out = threading.Event()

    def expire():                    # a hang: the run ends here, as a hung test ends it
        timed_out.set()
        _kill_group(p, wait=False)

    watchdog = threading.Timer(timeout, expire)
    watchdog.start()
    chunks = []
    try:
        for line in p.stdout:
            chunks.append(line)
            out.write(line)
        status = p.wait()
    finally:
        watchdog.cancel()
        _kill_group(p)               # what a test left behind (forked children)
    took = time.monotonic() - t0
    text = "".join(chunks)
    results, closing = parse(text)
    if timed_out.is_set():
        status = None
        closing.append(f"(timed out after {timeout:.0f} s)")
    elif status < 0:
        closing.append(f"(killed by signal {signal.Signals(-status).name})")
    for r in results:
        r["face"] = face
    return {"face": face, "results": results, "closing": closing, "status": status,
            "seconds": round(took, 1), "tail": "\n".join(text.splitlines()[-15:])}


def _kill_group(p: subprocess.Popen, wait: bool = True) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if wait:
        p.wait()


def summary(run: dict, out=sys.stdout) -> None:
    rs = run["results"]
    by_mod: dict[str, Counter] = defaultdict(Counter)
    for r in rs:
        by_mod[r["module"]][r["outcome"]] += 1
    print(f"\n== {FACES[run['face']]}: {run['seconds']:.0f} s", file=out)
    cols = ("passed", "failed", "error", "skipped")
    print(f"{'module':<28}" + "".join(f"{c:>9}" for c in cols), file=out)
    for mod in sorted(by_mod):
        print(f"{mod:<28}" + "".join(f"{by_mod[mod][c]:>9}" for c in cols), file=out)
    print(f"{'total':<28}" + "".join(f"{sum(c[k] for c in by_mod.values()):>9}" for k in cols),
          file=out)
    reasons: dict[str, list[str]] = defaultdict(list)
    for r in rs:
        if r["outcome"] == "skipped":
            reasons[r["detail"]].append(r["test"])
    if reasons:
        print("skipped, by reason:", file=out)
        for why, tests in sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            mods = sorted({t.split(".")[1] for t in tests})
            print(f"  {len(tests):>3}  {why}  [{', '.join(mods)}]", file=out)
    bad = [r for r in rs if r["outcome"] in ("failed", "error")]
    for r in bad:
        last = [ln for ln in r.get("detail", "").splitlines() if ln.strip()][-1:] or [""]
        print(f"  {r['outcome'].upper()}: {r['test']}: {last[0]}", file=out)
    print("closing lines: " + " / ".join(run["closing"] or ["(none: the run did not end)"]),
          file=out)
    out.flush()


def passed(run: dict) -> bool:
    """The runner ended and said OK."""
    return run["status"] == 0 and bool(run["closing"]) and run["closing"][-1].startswith("OK")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--face", choices=("c", "python", "both"), default="both")
    ap.add_argument("--tests", type=Path, default=DEBIAN_TESTS,
                    help="rdma-core's tests directory (default: Debian's python3-pyverbs)")
    ap.add_argument("-k", action="append", default=[],
                    help="unittest's -k: only tests matching this (repeatable)")
    ap.add_argument("--dev", default="softnic0")
    ap.add_argument("--timeout", type=float, default=1500, help="seconds per face")
    ap.add_argument("--json", type=Path, help="also write the runs here")
    args = ap.parse_args(argv)
    if not args.tests.is_dir():
        print(f"rdma_core_tests: no tests at {args.tests} (install python3-pyverbs or give "
              f"--tests)", file=sys.stderr)
        return 2
    faces = ["c", "python"] if args.face == "both" else [args.face]
    if "c" in faces and not Path(SYSTEM_PYTHON).exists():
        print(f"rdma_core_tests: the C face needs {SYSTEM_PYTHON} with pyverbs",
              file=sys.stderr)
        return 2
    runs = []
    with tempfile.TemporaryDirectory(prefix="rdma-core-tests-") as tmp:
        pkg = prepare(args.tests, Path(tmp))
        for face in faces:       # one after the other: test_rdmacm listens on 127.0.0.1:7471
            runs.append(run_face(face, pkg, args.dev, args.timeout, args.k))
    for run in runs:
        summary(run)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0 if all(passed(r) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
