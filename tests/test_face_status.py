"""face_status(): each face offered on its own, from the same checks the builds make.

A missing header is simulated by pointing the build at an include directory
(SOFTNIC_RDMA_INCLUDE) that lacks it; no package is uninstalled.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from softnic.faces.availability import FACES, face_status
from softnic.faces.embedding import INCLUDE_ENV, BuildError
from softnic.faces.libibverbs.build import LIBRARY as IBV
from softnic.faces.librdmacm.build import LIBRARY as RDMACM
from test_libibverbs import _missing, need_face


@pytest.fixture
def include(tmp_path, monkeypatch):
    """An include directory holding only the headers a test gives it."""
    def make(*headers):
        for h in headers:
            (tmp_path / h).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / h).write_text("/* empty */\n")
        monkeypatch.setenv(INCLUDE_ENV, str(tmp_path))
        return tmp_path
    return make


def test_every_face_is_named():
    assert tuple(face_status()) == FACES


def test_missing_rdma_cma_h_costs_librdmacm_only(include):
    include("infiniband/verbs.h")
    st = face_status()
    assert st["pyverbs"].ok
    assert "verbs.h" not in st["libibverbs"].reason
    assert not st["librdmacm"].ok
    assert "<rdma/rdma_cma.h> is missing" in st["librdmacm"].reason
    assert "librdmacm-dev" in st["librdmacm"].install
    assert "libibverbs-dev" not in st["librdmacm"].install


def test_missing_verbs_h_costs_the_c_faces_not_the_python_face(include):
    include("rdma/rdma_cma.h")
    st = face_status()
    assert st["pyverbs"] == (True, "", "")
    for face in ("libibverbs", "librdmacm"):
        assert not st[face].ok
        assert "<infiniband/verbs.h> is missing" in st[face].reason
        assert "libibverbs-dev" in st[face].install


def test_a_missing_compiler_is_named(include, monkeypatch):
    include("infiniband/verbs.h", "rdma/rdma_cma.h")
    monkeypatch.setenv("CC", "softnic-no-such-compiler")
    st = face_status()
    for face in ("libibverbs", "librdmacm"):
        assert "no C compiler" in st[face].reason and "gcc" in st[face].install
    assert st["pyverbs"].ok


def test_the_build_refuses_with_the_same_words(include, tmp_path):
    include("infiniband/verbs.h")
    with pytest.raises(BuildError, match=r"<rdma/rdma_cma.h> is missing.*install librdmacm-dev"):
        RDMACM.check_tools(tmp_path / "out")
    if not face_status()["libibverbs"].ok:      # no compiler or Python.h here
        return
    IBV.check_tools(tmp_path / "out")


# ------------------------------------------------ softnic exec offers each face on its own

SOFTNIC = [sys.executable, "-m", "softnic.cli", "exec", "--devices", "2"]
PYVERBS_PROG = "import pyverbs.device as d; print([x.name.decode() for x in d.get_device_list()])"


def _warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "warning" in ln]


def test_exec_without_verbs_h_keeps_the_python_face(include, tmp_path):
    """No <infiniband/verbs.h> and nothing built: a pyverbs program runs on softnic's
    Python face with one warning naming the package; a C program that links libibverbs
    is refused with the same words (it would not run on softnic at all)."""
    inc = include("rdma/rdma_cma.h")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), **{INCLUDE_ENV: str(inc)})
    r = subprocess.run(SOFTNIC + ["--", sys.executable, "-c", PYVERBS_PROG], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['softnic0', 'softnic1']"
    (warning,) = _warnings(r.stderr)
    assert "<infiniband/verbs.h> is missing" in warning and "libibverbs-dev" in warning
    ibv_devices = shutil.which("ibv_devices")
    if ibv_devices is None:
        _missing("needs ibv_devices (Debian: ibverbs-utils)")
    r = subprocess.run(SOFTNIC + ["--", ibv_devices], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    assert "<infiniband/verbs.h> is missing: install libibverbs-dev" in r.stderr
    assert not (tmp_path / "cache" / "softnic" / "libibverbs").exists()


def test_exec_without_rdma_cma_h_runs_verbs_programs(include, tmp_path):
    """No <rdma/rdma_cma.h>: softnic's libibverbs.so.1 (built, from the cache) still
    serves C programs; librdmacm costs one warning line naming librdmacm-dev."""
    need_face("libibverbs")
    ibv_devices = shutil.which("ibv_devices")
    if ibv_devices is None:
        _missing("needs ibv_devices (Debian: ibverbs-utils)")
    from softnic.faces.libibverbs import build as ibv
    built = ibv.build()
    inc = include()
    (inc / "infiniband").symlink_to("/usr/include/infiniband")
    cache = tmp_path / "cache"
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), **{INCLUDE_ENV: str(inc)})
    # this libibverbs.so.1 as the build under that cache would make it (its key is the
    # sources'), without librdmacm.so.1 beside it
    dest = cache / "softnic" / "libibverbs" / ibv.cache_key()
    dest.mkdir(parents=True)
    for name in (ibv.SONAME, ibv.PRELOAD):
        shutil.copy(built / name, dest / name)
    from softnic import accel                   # the per-packet kernel, built already
    (cache / "softnic" / "kernel").symlink_to(accel.cache_dir().parent)
    r = subprocess.run(SOFTNIC + ["--", ibv_devices], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "softnic0" in r.stdout and "softnic1" in r.stdout
    (warning,) = _warnings(r.stderr)
    assert "rdma_cm" in warning and "<rdma/rdma_cma.h> is missing: install librdmacm-dev" \
        in warning
    assert not (dest / "librdmacm.so.1").exists()


def test_c_face_tests_skip_with_the_reason_and_fail_under_ci(include, tmp_path):
    """The libibverbs tests' fixture where <infiniband/verbs.h> is missing: the test is
    skipped, naming the package, locally; it fails (an error in its fixture) under
    CI=true."""
    inc = include()
    test = f"{Path(__file__).parent / 'test_libibverbs.py'}::test_devices_and_devinfo"
    outcome = {}
    for ci in ("", "true"):
        env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), CI=ci, COLUMNS="400",
                   **{INCLUDE_ENV: str(inc)})
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                            test], env=env, capture_output=True, text=True, timeout=300)
        outcome[ci] = (r.returncode, r.stdout)
    rc, out = outcome[""]
    assert rc == 0 and "1 skipped" in out, out
    assert "<infiniband/verbs.h> is missing (apt-get install -y libibverbs-dev)" in out, out
    rc, out = outcome["true"]
    assert rc == 1 and "1 error" in out and "libibverbs-dev" in out, out   # (in the fixture)
