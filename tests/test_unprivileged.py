"""The part of the suite that needs neither root nor a network namespace, run as an
ordinary user.

Tests marked ``unprivileged`` (the C faces and the preload's sysfs and /dev answers,
perftest, rdma_cm with a capture, UCX, Open MPI, counters, Debian's Python and pyverbs,
where softnic writes for a user, ``softnic doctor`` live) are run by a second pytest, and this test asserts that every one of them passed: as
many as a collection of the same files finds (more than none), none skipped, none
failed.

Run by an ordinary user, the second pytest is this interpreter's, in this checkout.
Run as root (CI runs as root), it runs as the user ``softnic-ci`` (no login; created
here under CI=true, or by hand with the ``useradd`` line below): root copies this
checkout into that user's home (a CI checkout may lie where the user cannot read),
``tools/install.sh`` run as that user makes its venv with Debian's /usr/bin/python3
(the venv's own interpreter may lie under a home the user cannot read) and installs
softnic there, and the tests run with ``runuser``.  Locally, as root without that
user, this test skips and says how to create it; under CI=true it fails instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER = "softnic-ci"
USERADD = ["useradd", "--system", "--create-home", "--home-dir", f"/var/lib/{USER}",
           "--shell", "/usr/sbin/nologin", USER]
SYSTEM_PYTHON = "/usr/bin/python3"
MARKER = "unprivileged"
INSTALL_TIMEOUT = 1800      # a first venv downloads softnic's dependencies
RUN_TIMEOUT = 1200          # the sub-run takes minutes; this only stops a hang
# what the copy leaves out: the checkout's own venv, caches and run output
SKIP_ANYWHERE = {".venv", ".git", "__pycache__", ".hypothesis", ".pytest_cache"}
SKIP_TOP = {"build", "dist", "results", "perf-results"}


def _missing(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI runs the unprivileged part of the suite as {USER})")
    pytest.skip(why)


def marked_files() -> list[str]:
    """The test files that mark a test ``unprivileged`` (a mark names it in its file)."""
    here = Path(__file__).name
    return sorted(f"tests/{p.name}" for p in (REPO / "tests").glob("test_*.py")
                  if p.name != here and re.search(rf"\b{MARKER}\b", p.read_text()))


def expected(files: list[str]) -> list[str]:
    """The node ids of the marked tests, collected by this interpreter."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", MARKER,
                        "-p", "no:cacheprovider", *files], cwd=REPO, env=_own_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [line.strip() for line in r.stdout.splitlines() if "::" in line]


def _own_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


# ---------------------------------------------------------------- as root: the user's copy


def _ignore(top: Path):
    def ignore(directory: str, names: list[str]) -> set[str]:
        out = {n for n in names if n in SKIP_ANYWHERE or n.endswith((".egg-info", ".pcap"))}
        if Path(directory) == top:
            out |= {n for n in names if n in SKIP_TOP}
        return out
    return ignore


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.lchown(root, uid, gid)
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(d, name), uid, gid)


def _user_env(pw: pwd.struct_passwd, venv: Path | None) -> dict:
    """The user's environment: its home, Debian's PATH (the venv's bin first), and of
    ours only what says how to run (CI, the locale, pip's index settings)."""
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name, "SHELL": "/bin/sh",
           "PATH": f"{venv / 'bin'}:{path}" if venv else path}
    for k, v in os.environ.items():
        if k in ("CI", "LANG", "LC_ALL", "TZ") or k.startswith("PIP_"):
            env[k] = v
    return env


def as_user(pw: pwd.struct_passwd, argv: list[str], cwd: Path, venv: Path | None,
            timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", pw.pw_name, "--", *argv], cwd=cwd,
                          env=_user_env(pw, venv), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def ensure_user() -> pwd.struct_passwd:
    """The user, created under CI=true if it is missing."""
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        if os.environ.get("CI") != "true":
            pytest.skip(f"as root this test runs the marked tests as the user {USER}, "
                        f"which CI creates; create it with: {' '.join(USERADD)}")
    r = subprocess.run(USERADD, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return pwd.getpwnam(USER)


def prepare_user(pw: pwd.struct_passwd) -> tuple[Path, Path]:
    """A fresh copy of this checkout in the user's home, and the user's venv (made by
    tools/install.sh as that user, again whenever pyproject.toml changes)."""
    if shutil.which("runuser") is None:
        _missing("needs runuser (Debian: util-linux)")
    if not Path(SYSTEM_PYTHON).exists():
        _missing(f"needs {SYSTEM_PYTHON} (Debian: python3, python3-venv)")
    home = Path(pw.pw_dir)
    assert home.is_dir(), f"{USER}'s home {home} is missing"
    src, venv = home / "softnic", home / "venv"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO, src, symlinks=True, ignore=_ignore(REPO))
    _chown_tree(src, pw.pw_uid, pw.pw_gid)
    stamp = home / "venv.stamp"
    want = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    have = stamp.read_text() if stamp.exists() else ""
    if have != want or not (venv / "bin" / "python").exists():
        r = as_user(pw, ["tools/install.sh", "--python", SYSTEM_PYTHON, "--venv", str(venv),
                         "--extras", "test", "--faces", "all tests", "--no-doctor"],
                    src, None, INSTALL_TIMEOUT)
        assert r.returncode == 0, f"tools/install.sh as {USER}:\n{r.stdout[-5000:]}"
        stamp.write_text(want)
    return src, venv


# ---------------------------------------------------------------- the test


def junit_cases(path: Path) -> dict[str, str]:
    """Each test case of a JUnit XML report (``classname::name``) -> passed, skipped,
    failure or error."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("skipped", "failure", "error"):
                outcome = child.tag
                break
        out[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return out


def junit_name(node_id: str) -> str:
    """A node id as JUnit reports it: tests/test_x.py::Class::test_y[p] ->
    tests.test_x.Class::test_y[p]."""
    base, bracket, param = node_id.partition("[")
    path, *classes, name = base.split("::")
    return (".".join([path.removesuffix(".py").replace("/", "."), *classes]) + "::" + name
            + bracket + param)


def test_the_unprivileged_part_of_the_suite_passes_as_an_ordinary_user(tmp_path):
    files = marked_files()
    assert files, f"no test file marks a test {MARKER!r}"
    want = expected(files)
    assert want, f"{files} collect no test marked {MARKER!r}"
    args = ["-m", "pytest", "-q", "-m", MARKER, "-p", "no:cacheprovider", "-rs"]
    if os.geteuid() == 0:
        pw = ensure_user()
        with open(Path(pw.pw_dir) / ".sub-run.lock", "a") as lock:     # one at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            src, venv = prepare_user(pw)
            report = Path(pw.pw_dir) / "unprivileged.xml"
            report.unlink(missing_ok=True)
            who = f"{USER} (uid {pw.pw_uid}), {SYSTEM_PYTHON}"
            t0 = time.monotonic()
            r = as_user(pw, [str(venv / "bin" / "python"), *args, f"--junitxml={report}",
                             *files], src, venv, RUN_TIMEOUT)
            took = time.monotonic() - t0
    else:
        report = tmp_path / "unprivileged.xml"
        who = f"uid {os.geteuid()}, {sys.executable}"
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, *args, f"--junitxml={report}", *files], cwd=REPO,
                           env=_own_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=RUN_TIMEOUT)
        took = time.monotonic() - t0
    print(f"the unprivileged sub-run as {who}: {took:.0f} s\n{r.stdout[-600:]}")
    assert report.exists(), f"no report from the sub-run (exit {r.returncode}):\n" \
                            f"{r.stdout[-5000:]}"
    cases = junit_cases(report)
    skipped = sorted(n for n, o in cases.items() if o == "skipped")
    if skipped and os.environ.get("CI") != "true" and set(cases.values()) <= {"passed",
                                                                              "skipped"}:
        pytest.skip(f"the sub-run as {who} skipped {len(skipped)} of {len(cases)}: "
                    + "; ".join(re.findall(r"^SKIPPED .*$", r.stdout, re.M))[:1500])
    bad = {n: o for n, o in cases.items() if o != "passed"}
    assert r.returncode == 0 and not bad, (
        f"the sub-run as {who} (exit {r.returncode}): not passed: {bad}\n{r.stdout[-8000:]}")
    assert sorted(cases) == sorted(junit_name(node) for node in want), (sorted(cases), want)
    assert len(cases) == len(want) > 0



def test_the_report_is_read_as_pytest_writes_it(tmp_path):
    """junit_cases and junit_name on a report pytest wrote: a pass, a skip, a failure and
    an error each read as what they were, under the names their node ids give."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_four.py").write_text(
        "import pytest\n"
        "@pytest.fixture\n"
        "def broken():\n"
        "    raise RuntimeError('fixture')\n"
        "@pytest.mark.parametrize('x', ['a::b', 'c'])\n"
        "def test_passes(x):\n"
        "    pass\n"
        "class TestGroup:\n"
        "    def test_skips(self):\n"
        "        pytest.skip('no tool')\n"
        "def test_fails():\n"
        "    assert False\n"
        "def test_errors(broken):\n"
        "    pass\n")
    report = tmp_path / "report.xml"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path), f"--junitxml={report}", "tests"],
                       cwd=tmp_path, env=_own_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout
    nodes = {"tests/test_four.py::test_passes[a::b]": "passed",
             "tests/test_four.py::test_passes[c]": "passed",
             "tests/test_four.py::TestGroup::test_skips": "skipped",
             "tests/test_four.py::test_fails": "failure",
             "tests/test_four.py::test_errors": "error"}
    assert junit_cases(report) == {junit_name(n): o for n, o in nodes.items()}
