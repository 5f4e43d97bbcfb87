"""rdma-core's own Python test suite (Debian's python3-pyverbs ships version 44 of it) run
against softnic as rdma-core's authors run it -- ``tests/run_tests.py --dev softnic0 -v``,
every module in one process -- through both faces by tools/rdma_core_tests.py: the
machine's pyverbs over softnic's libibverbs.so.1 (``c``), and softnic's verbs_api as
pyverbs (``python``).

The runner must end with "OK": every module loads (its ``tests/__init__.py`` imports each
one, mlx5's and EFA's too), no test fails or errs.  Each skip must be one of the reasons
docs/rdma-core-tests.md explains (another vendor's device, no GPU, no raw Ethernet QPs,
...; off CI, a host without 2 MiB huge pages), so a new skip fails here until it is
explained, and the skips are held to a budget.
Locally a missing tool skips; under CI=true it fails (.ci/run installs python3-pyverbs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tools" / "rdma_core_tests.py"
TESTS = Path("/usr/share/doc/rdma-core/tests")
SYSTEM_PYTHON = "/usr/bin/python3"

# The skips a face may have, by the start of their reason (docs/rdma-core-tests.md).
EXPLAINED = (
    "Can not run the test over non MLX5 device",                 # mlx5's modules
    "Could not open mlx5 context (This is not an MLX5 device)",
    "Converting timestamp to nanoseconds is not supported",      # mlx5's clock
    "PCI device must be passed by the user",                     # mlx5 over VFIO
    "Can not run the test over non EFA device",                  # EFA's modules
    "cuda-python 12.0+ must be installed",                       # CUDA
    "Allocating dmabuf is not supported",                        # no GPU render node
    "Create Raw Packet QP",                                      # raw Ethernet QPs
    "Create QP type 8 is not supported",                         # (IBV_QPT_RAW_PACKET)
    "Extended CQ is not supported",                              # (tag-matching info)
)
HUGE_PAGES = "There are no huge pages of size 2M allocated"   # .ci/run reserves them: 3
SKIP_BUDGET = {"c": 127, "python": 127}     # measured 2026-12-01: 127 and 127 of 273
RAN_AT_LEAST = 273                          # v44's suite: 273 tests


def _huge_pages_reserved() -> bool:
    try:
        return int(Path("/proc/sys/vm/nr_hugepages").read_text()) > 0
    except (OSError, ValueError):
        return False


def _missing(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (.ci/run installs it; CI must run rdma-core's test suite)")
    pytest.skip(why)


@pytest.mark.compat("rdma-core-tests")
@pytest.mark.parametrize("face", ["c", "python"])
def test_rdma_core_runner_passes(face, tmp_path):
    if not TESTS.is_dir():
        _missing(f"rdma-core's tests are not at {TESTS} (Debian: python3-pyverbs)")
    if face == "c":
        if not Path(SYSTEM_PYTHON).exists() or subprocess.run(
                [SYSTEM_PYTHON, "-c", "import pyverbs.device"], capture_output=True,
                timeout=60).returncode:
            _missing(f"{SYSTEM_PYTHON} cannot import pyverbs (Debian: python3-pyverbs)")
        from softnic.faces.availability import face_status
        for name, st in face_status().items():      # (its test_rdmacm needs librdmacm)
            if name != "pyverbs" and not st.ok:
                _missing(f"softnic's {name} face cannot be built here: {st.reason} "
                         f"({st.install})")
    out = tmp_path / "runs.json"
    proc = subprocess.run([sys.executable, str(RUNNER), "--face", face, "--timeout", "1500",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=1600, cwd=ROOT)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())
    summary = proc.stdout[proc.stdout.rfind("\n== "):]
    results = run["results"]
    bad = [r for r in results if r["outcome"] in ("failed", "error")]
    assert not bad, "\n".join(f"{r['outcome']}: {r['test']}: {r.get('detail', '')[-800:]}"
                              for r in bad) + summary
    # the runner's closing lines: every module loaded, every test ran, "OK"
    assert run["status"] == 0 and run["closing"] and run["closing"][-1].startswith("OK"), \
        run["tail"] + summary
    ran = int(re.match(r"Ran (\d+) test", run["closing"][0]).group(1))
    assert ran >= RAN_AT_LEAST and ran == len(results), summary
    modules = {p.name.split(".")[0] for p in TESTS.iterdir() if p.name.startswith("test_")}
    assert modules == {r["module"] for r in results}, summary
    skipped = [r for r in results if r["outcome"] == "skipped"]
    said = re.search(r"skipped=(\d+)", run["closing"][-1])
    assert len(skipped) == (int(said.group(1)) if said else 0), summary
    explained, budget = EXPLAINED, SKIP_BUDGET[face]
    if os.environ.get("CI") != "true" and not _huge_pages_reserved():
        # a host without 2 MiB huge pages skips those 3 tests (CI reserves some)
        explained, budget = explained + (HUGE_PAGES,), budget + 3
    unexplained = [r for r in skipped if not r["detail"].startswith(explained)]
    assert not unexplained, "skips without an explanation in docs/rdma-core-tests.md:\n" + \
        "\n".join(f"{r['test']}: {r['detail']}" for r in unexplained)
    assert len(skipped) <= budget, summary


def test_exec_pyverbs_switch_chooses_the_face():
    """``softnic exec --pyverbs system``: the program's ``import pyverbs`` is the machine's
    (softnic's shim is not on its path) and softnic's libibverbs.so.1 is loaded; by
    default softnic's verbs_api answers ``import pyverbs``."""
    from softnic.cli.main import SHIM
    probe = ("import os; print(os.environ.get('PYTHONPATH', '')); "
             "print(os.environ.get('LD_LIBRARY_PATH', ''))")
    base = [sys.executable, "-m", "softnic.cli", "exec"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("LD_LIBRARY_PATH", None)
    own = subprocess.run(base + ["--no-libibverbs", "--", sys.executable, "-c", probe],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert own.returncode == 0, own.stderr
    path, _ = own.stdout.splitlines()[:2]
    assert str(SHIM) in path.split(os.pathsep)
    try:
        system = subprocess.run(base + ["--pyverbs", "system", "--", sys.executable, "-c", probe],
                                capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("softnic exec --pyverbs system did not start the program")
    if system.returncode and "building libibverbs" in system.stderr:
        _missing(f"softnic's libibverbs.so.1 cannot be built here: {system.stderr[-300:]}")
    assert system.returncode == 0, system.stderr
    path, ld = system.stdout.splitlines()[:2]
    assert str(SHIM) not in path.split(os.pathsep)
    assert any(Path(d, "libibverbs.so.1").exists() for d in ld.split(os.pathsep) if d)
