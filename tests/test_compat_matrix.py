"""tools/compat_matrix.py: the compat marker's record, and the matrix written from a
real pytest run's JUnit XML (a small suite with a passing, a failing and a skipped
tagged test, run with the tool's plugin)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("compat_matrix", ROOT / "tools" / "compat_matrix.py")
cm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cm)


@pytest.mark.parametrize("model, modes", [
    (None, ["lossless"]), ("", ["lossless"]), ("loss=0.02", ["loss"]),
    ("reorder=0.05/300us,dup=0.01", ["reorder"]), ("loss=0.01,reorder=0.01/200us",
                                                   ["loss", "reorder"]),
    ("dup=0.01", ["lossless"]), ("burst=0.01/0.5", ["loss"])])
def test_fault_modes(model, modes):
    assert cm.fault_modes(model) == modes


def test_record_takes_transport_and_faults_from_the_parameters():
    mark = pytest.mark.compat("rdmacm-utils").mark
    rec = cm.record(mark, {"faults": "loss=0.02", "transport": "tcp"})
    assert (rec["program"], rec["transport"], rec["faults"]) == ("rdmacm-utils", "iwarp",
                                                                  ["loss"])
    assert rec["version"].startswith(("rdmacm-utils ", "not installed"))
    rec = cm.record(pytest.mark.compat("ucx", faults="loss").mark, {"faults": None})
    assert (rec["transport"], rec["faults"]) == ("roce", ["loss"])
    rec = cm.record(pytest.mark.compat("torch", transport="sim").mark, {})
    assert (rec["transport"], rec["faults"]) == ("sim", ["lossless"])
    for bad in (pytest.mark.compat("nosuch"), pytest.mark.compat("ucx", transport="ib"),
                pytest.mark.compat("ucx", faults="dup"), pytest.mark.compat()):
        with pytest.raises(ValueError):
            cm.record(bad.mark, {})


SUITE = '''
import pytest

@pytest.mark.compat("qperf")
@pytest.mark.parametrize("faults", [None, "loss=0.02"])
def test_ok(faults):
    pass

@pytest.mark.compat("ucx", transport="iwarp")
def test_broken():
    assert 1 == 2, "the program printed nothing"

@pytest.mark.compat("torch", transport="sim", faults="reorder")
def test_missing():
    pytest.skip("needs torch")

def test_untagged():
    pass
'''


def test_matrix_from_a_run(tmp_path):
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE))
    xml, doc = tmp_path / "run.xml", tmp_path / "compatibility.md"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tools"), str(ROOT)]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "compat_matrix",
                        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                        f"--junitxml={xml}", "test_suite.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr      # test_broken fails
    assert cm.write(xml, doc) == 0
    text = doc.read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line.strip("|").split(" | ")
            for line in text.splitlines() if line.startswith("| ")}
    header = [h.strip() for h in rows["program"]]
    assert header[2:] == [f"{t}, {f}" for t in ("RoCEv2/UDP", "RoCEv2/UDP over IPv6", "iWARP/TCP",
                                                "simulated fabric")
                          for f in ("lossless", "loss", "reorder")]

    def cell(program, column):
        return rows[program][header.index(column)].strip()
    assert cell("qperf", "RoCEv2/UDP, lossless") == "passed (1)"
    assert cell("qperf", "RoCEv2/UDP, loss") == "passed (1)"
    assert cell("qperf", "RoCEv2/UDP, reorder") == "not tested"
    assert cell("UCX", "iWARP/TCP, lossless") == "**FAILED** 1 of 1"
    assert cell("UCX", "RoCEv2/UDP, lossless") == "not tested"
    assert cell("torch", "simulated fabric, reorder") == "skipped (1)"
    assert cell("Open MPI", "version") == "(no test)"
    assert all(c.strip() == "not tested" for c in rows["Open MPI"][2:])
    assert re.search(r"4 tests \(2 passed, 1 failed, 1 skipped\)", text)
    assert "test_untagged" not in text
    assert "`test_suite.py::test_broken` (iWARP/TCP, lossless): failed: " in text
    assert "the program printed nothing" in text
    # the version is the installed package's (dpkg-query), as the run recorded it
    assert cell("qperf", "version") == cm.version("qperf")
