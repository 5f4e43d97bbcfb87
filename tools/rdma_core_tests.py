"""Run rdma-core's own Python test suite against softnic, through either face.

    python tools/rdma_core_tests.py --face c        # the machine's pyverbs over softnic's libibverbs.so.1
    python tools/rdma_core_tests.py --face python   # softnic's verbs_api as pyverbs
    python tools/rdma_core_tests.py --face both -k test_mr -j 2 --timeout 60

The tests come from Debian's python3-pyverbs (``/usr/share/doc/rdma-core/tests``, some
files gzipped) or ``--tests DIR`` (rdma-core's ``tests/``).  They are copied (and
gunzipped) into a temporary ``tests`` package holding the support files and the generic
modules asked for, so a provider-only module (mlx5, efa) is never imported.  Each test
runs in its own process group under ``softnic exec`` with a timeout, so a crash or a hang
costs that one test.  The output lists every test's outcome, every skip with its reason,
every failure with the last lines of its traceback, and a summary per module and face.
``--json FILE`` writes the results for tools (tests/test_rdma_core_suite.py reads them).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
DEBIAN_TESTS = Path("/usr/share/doc/rdma-core/tests")
SYSTEM_PYTHON = "/usr/bin/python3"
MODULES = ("test_pd", "test_device", "test_addr", "test_cq", "test_cq_events", "test_cqex",
           "test_qp", "test_qpex", "test_srq", "test_atomic", "test_mr",
           "test_relaxed_ordering", "test_fork", "test_odp", "test_parent_domain",
           "test_rdmacm")
SUPPORT = ("__init__.py", "args_parser.py", "base.py", "utils.py", "base_rdmacm.py",
           "rdmacm_utils.py", "efa_base.py", "mlx5_base.py", "mlx5_prm_structs.py",
           "cuda_utils.py")
MARK = "@@rdma-core-test@@ "
# Modules whose tests run one at a time: test_rdmacm's listen on the host's address
# (127.0.0.1, port 7471), which one listener at a time may hold, as on a kernel device.
SERIAL = {"test_rdmacm"}

# What runs in the child: one test (or the listing of a module), its outcome as one line.
CHILD = r'''
import json, os, sys, traceback, unittest
root, mode, target, dev = sys.argv[1:5]
sys.path[:0] = [root, os.path.join(root, "tests")]
sys.argv = [sys.argv[0], "--dev", dev]
from args_parser import parser
parser.parse_args()
MARK = "@@rdma-core-test@@ "
def emit(**kw):
    sys.stdout.flush()
    os.write(1, (MARK + json.dumps(kw) + "\n").encode())
loader = unittest.TestLoader()
if mode == "list":
    try:
        suite = loader.loadTestsFromName(target)
    except BaseException:
        emit(error=traceback.format_exc())
        raise SystemExit(0)
    def ids(s):
        for t in s:
            if isinstance(t, unittest.TestSuite):
                yield from ids(t)
            else:
                yield t.id()
    failed = [t for t in ids(suite) if t.startswith("unittest.loader._FailedTest")]
    if failed:
        case = next(iter(suite))
        while isinstance(case, unittest.TestSuite):
            case = next(iter(case))
        emit(error=str(getattr(case, "_exception", failed[0])))
        raise SystemExit(0)
    emit(tests=sorted(set(ids(suite))))
    raise SystemExit(0)
suite = loader.loadTestsFromName(target)
result = unittest.TestResult()
suite.run(result)
if result.failures or result.errors or result.unexpectedSuccesses:
    text = "".join(tb for _, tb in result.failures + result.errors) or "unexpected success"
    emit(outcome="failed", detail=text)
elif result.skipped:
    emit(outcome="skipped", detail="; ".join(str(r) for _, r in result.skipped))
elif result.testsRun:
    emit(outcome="passed", detail="")
else:
    emit(outcome="failed", detail="no test ran")
sys.stdout.flush()
os._exit(0)
'''


def _read(src: Path, name: str) -> bytes | None:
    plain, packed = src / name, src / (name + ".gz")
    if plain.exists():
        return plain.read_bytes()
    if packed.exists():
        with gzip.open(packed, "rb") as f:
            return f.read()
    return None


def prepare(src: Path, modules: list[str], dest: Path) -> list[str]:
    """Copy the support files and each of ``modules`` (gunzipped) into its own
    ``dest/<module>/tests`` package (the package's ``__init__`` imports every test module
    beside it, so one that cannot load would take the others down); return the modules
    found."""
    support = {name: _read(src, name) for name in SUPPORT}
    found = []
    for mod in modules:
        text = _read(src, mod + ".py")
        if text is None:
            continue
        pkg = dest / mod / "tests"
        pkg.mkdir(parents=True)
        for name, data in support.items():
            if data is not None:
                (pkg / name).write_bytes(data)
        (pkg / (mod + ".py")).write_bytes(text)
        found.append(mod)
    (dest / "child.py").write_text(CHILD)
    return found


def face_command(face: str) -> list[str]:
    """The command prefix that runs a Python program on softnic through ``face``."""
    exec_ = [sys.executable, "-m", "softnic.cli", "exec"]
    if face == "c":
        return exec_ + ["--pyverbs", "system", "--", SYSTEM_PYTHON]
    return exec_ + ["--pyverbs", "softnic", "--", sys.executable]


def run_child(cmd: list[str], timeout: float, env: dict) -> tuple[dict | None, str, int | None]:
    """Run ``cmd`` in its own process group; (its marked line, its output, its status)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         cwd=str(PROJECT), start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        status = p.returncode
    except subprocess.TimeoutExpired:
        _kill_group(p)
        out, _ = p.communicate()
        status = None
    _kill_group(p)                      # anything the test left behind (forked children)
    text = out.decode(errors="replace")
    record = None
    for line in text.splitlines():
        if line.startswith(MARK):
            record = json.loads(line[len(MARK):])
    return record, text, status


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if not ln.startswith(MARK)]
    return "\n".join(lines[-n:])


def run_face(face: str, root: Path, modules: list[str], dev: str, timeout: float,
             jobs: int, only: list[str], out=sys.stdout) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONUNBUFFERED", "1")
    prefix = face_command(face) + [str(root / "child.py")]
    results: list[dict] = []
    tests: list[tuple[str, str]] = []
    for mod in modules:
        record, text, status = run_child(prefix + [str(root / mod), "list", f"tests.{mod}", dev],
                                          120, env)
        if record is None or "error" in record:
            why = (record or {}).get("error") or _tail(text) or f"exit status {status}"
            results.append({"face": face, "module": mod, "test": f"tests.{mod}",
                            "outcome": "failed", "detail": "module does not load: " + why})
            print(f"[{face}] tests.{mod}: FAILED (module does not load)\n"
                  f"    {_tail(why, 4).replace(chr(10), chr(10) + '    ')}", file=out, flush=True)
            continue
        for t in record["tests"]:
            if not only or any(k in t for k in only):
                tests.append((mod, t))

    serial = threading.Lock()

    def one(item):
        mod, test = item
        with serial if mod in SERIAL else contextlib.nullcontext():
            t0 = time.monotonic()
            record, text, status = run_child(prefix + [str(root / mod), "run", test, dev],
                                              timeout, env)
            took = time.monotonic() - t0
        if record is None:
            if status is None:
                detail = f"timed out after {timeout:.0f} s"
            elif status < 0:
                detail = f"killed by signal {signal.Signals(-status).name}"
            else:
                detail = f"exit status {status} before a result"
            detail += ("\n" + _tail(text)) if text.strip() else ""
            record = {"outcome": "failed", "detail": detail}
        elif record.get("outcome") == "failed" and _tail(text):
            # what the test's own processes printed (test_rdmacm's sides say why they failed)
            record["detail"] += "\n-- its output:\n" + _tail(text, 12)
        return {"face": face, "module": mod, "test": test, "seconds": round(took, 2), **record}

    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for r in pool.map(one, tests):
            results.append(r)
            line = f"[{face}] {r['test']}: {r['outcome'].upper()} ({r['seconds']:.1f} s)"
            if r["outcome"] == "skipped":
                line += f"  -- {r['detail']}"
            elif r["outcome"] == "failed":
                line += "\n    " + _tail(r["detail"], 8).replace("\n", "\n    ")
            print(line, file=out, flush=True)
    return results


def summary(results: list[dict], faces: list[str], out=sys.stdout) -> None:
    for face in faces:
        rs = [r for r in results if r["face"] == face]
        by_mod: dict[str, dict[str, int]] = {}
        for r in rs:
            c = by_mod.setdefault(r["module"], {"passed": 0, "failed": 0, "skipped": 0})
            c[r["outcome"]] += 1
        label = {"c": "C face (the machine's pyverbs over softnic's libibverbs.so.1)",
                 "python": "Python face (softnic's verbs_api as pyverbs)"}[face]
        print(f"\n== {label}", file=out)
        print(f"{'module':<24}{'passed':>8}{'failed':>8}{'skipped':>9}", file=out)
        for mod, c in by_mod.items():
            print(f"{mod:<24}{c['passed']:>8}{c['failed']:>8}{c['skipped']:>9}", file=out)
        tot = {k: sum(c[k] for c in by_mod.values()) for k in ("passed", "failed", "skipped")}
        print(f"{'total':<24}{tot['passed']:>8}{tot['failed']:>8}{tot['skipped']:>9}", file=out)
        skips = [r for r in rs if r["outcome"] == "skipped"]
        if skips:
            print(f"skipped ({len(skips)}):", file=out)
            for r in skips:
                print(f"  {r['test']}: {r['detail']}", file=out)
        fails = [r for r in rs if r["outcome"] == "failed"]
        if fails:
            print(f"failed ({len(fails)}):", file=out)
            for r in fails:
                last = _tail(r["detail"], 1)
                print(f"  {r['test']}: {last}", file=out)
    out.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--face", choices=("c", "python", "both"), default="both")
    ap.add_argument("--tests", type=Path, default=DEBIAN_TESTS,
                    help="rdma-core's tests directory (default: Debian's python3-pyverbs)")
    ap.add_argument("--modules", default=",".join(MODULES),
                    help="comma-separated test modules (default: the generic ones)")
    ap.add_argument("-k", action="append", default=[],
                    help="only tests whose id contains this (repeatable)")
    ap.add_argument("--dev", default="softnic0")
    ap.add_argument("--timeout", type=float, default=90, help="seconds per test")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the results here")
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
    wanted = [m.strip() for m in args.modules.split(",") if m.strip()]
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rdma-core-tests-") as tmp:
        root = Path(tmp)
        found = prepare(args.tests, wanted, root)
        for m in wanted:
            if m not in found:
                print(f"(module {m} is not in {args.tests}; not run)")
        for face in faces:
            results += run_face(face, root, found, args.dev, args.timeout, args.jobs, args.k)
    summary(results, faces)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if any(r["outcome"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
