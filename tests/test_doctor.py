"""``softnic doctor``: its JSON, the face a missing package or header costs and the
command it prints, ``--face``'s exit status, and (live) every face answering on this
machine.

The machine-independent tests replace the doctor's probes (``package_version``,
``header_exists``, ...) with a machine that has everything, then take one thing
away.  The live test runs every check for real: locally it skips when a face cannot
work here (it names what is missing); under CI=true it fails (.ci/run installs all).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from softnic.cli import doctor, packages
from softnic.cli.main import main as softnic

SOFTNIC = [sys.executable, "-m", "softnic.cli"]


@pytest.fixture
def machine(monkeypatch):
    """Every probe answers "present"; a test takes things away with ``machine.lack``."""
    lacking: set[str] = set()

    class Machine:
        def lack(self, *names):
            lacking.update(names)

    monkeypatch.setattr(doctor, "package_version",
                        lambda name: None if name in lacking else "1.0-test")
    def build_status(face):
        """As softnic.faces.availability.face_status answers on such a machine."""
        needs = [("no C compiler", "gcc", "cc"),
                 ("<infiniband/verbs.h> is missing", "libibverbs-dev", "infiniband/verbs.h")]
        if face == "rdmacm":
            needs.insert(0, ("<rdma/rdma_cma.h> is missing", "librdmacm-dev", "rdma/rdma_cma.h"))
        lacks = [(what, deb) for what, deb, name in needs if name in lacking]
        return not lacks, "; ".join(w for w, _ in lacks), list(dict.fromkeys(d for _, d in lacks))

    monkeypatch.setattr(doctor, "build_status", build_status)
    monkeypatch.setattr(doctor, "which", lambda p: None if p in lacking else f"/usr/bin/{p}")
    monkeypatch.setattr(doctor, "requirements", lambda: ["numpy>=1.26", "cffi>=1.16",
                                                         "pytest>=8; extra == 'test'"])
    monkeypatch.setattr(doctor, "distribution_version",
                        lambda name: None if name in lacking else "9.9")
    monkeypatch.setattr(doctor, "hugepages", lambda: 0 if "hugepages" in lacking else 8)
    monkeypatch.setattr(doctor, "netns_allowed", lambda: (False, "unshare: EPERM")
                        if "netns" in lacking else (True, "root"))
    monkeypatch.setattr(doctor, "libpython_shared", lambda: None)
    monkeypatch.setattr(doctor, "compiled", lambda live: {
        "kernel": (True, "built: /cache/kernel/_softnic_kernel.so"),
        "fabric": (True, "built: /cache/fabric/_softnic_fabric.so")})
    return Machine()


def run_doctor(capsys, *args) -> tuple[int, dict]:
    rc = softnic(["doctor", "--no-live", "--json", *args])
    return rc, json.loads(capsys.readouterr().out)


def test_json_shape(machine, capsys):
    rc, doc = run_doctor(capsys)
    assert rc == 0
    assert set(doc) == {"ok", "required", "live", "python", "executable", "user", "faces"}
    assert doc["user"]["root"] is (os.geteuid() == 0) and doc["user"]["uid"] == os.geteuid()
    assert doc["ok"] is True and doc["live"] is False and doc["required"] == ["python"]
    assert list(doc["faces"]) == [*packages.FACES, "tests"]
    for name, face in doc["faces"].items():
        assert set(face) == {"title", "ok", "missing", "install", "checks"}, name
        assert face["ok"] is True and face["missing"] == [] and face["install"] == []
        for check in face["checks"]:
            assert set(check) == {"name", "ok", "detail", "debs", "pip", "fix", "note"}
            assert check["ok"] in (True, None) and isinstance(check["detail"], str)
            assert check["note"] is False
    names = [c["name"] for c in doc["faces"]["c"]["checks"]]
    assert {"C compiler, Python.h, <infiniband/verbs.h>", "package libibverbs-dev",
            "build libibverbs.so.1", "ibv_devinfo under softnic exec"} <= set(names)
    # without --live nothing was built or run
    live = {c["name"]: c for f in doc["faces"].values() for c in f["checks"]}
    assert live["build libibverbs.so.1"]["ok"] is None
    assert live["rping connect under softnic exec"]["detail"] == "not run (--no-live)"


def apt(*debs: str) -> str:
    return ("sudo " if os.geteuid() else "") + "apt-get install -y " + " ".join(debs)


def test_missing_librdmacm_costs_rdmacm_only(machine, capsys):
    machine.lack("librdmacm-dev", "rdma/rdma_cma.h")
    rc, doc = run_doctor(capsys, "--face", "rdmacm")
    assert rc == 1 and doc["ok"] is False
    rdmacm = doc["faces"]["rdmacm"]
    assert rdmacm["missing"] == ["C compiler, Python.h, <rdma/rdma_cma.h>",
                                 "package librdmacm-dev"]
    assert rdmacm["install"] == [apt("librdmacm-dev")]
    assert doc["faces"]["c"]["ok"] is True          # libibverbs is not cost
    for face in ("c", "python", "ucx", "mpi", "system-pyverbs"):
        assert softnic(["doctor", "--no-live", "--face", face]) == 0, face
    out = capsys.readouterr().out
    assert "librdmacm-dev" not in out
    # the table says the same to a person
    assert softnic(["doctor", "--no-live", "--face", "rdmacm"]) == 1
    out = capsys.readouterr().out
    assert f"  install: {apt('librdmacm-dev')}" in out
    assert "does not work here: rdmacm" in out


def test_missing_libibverbs_costs_the_c_faces_not_python(machine, capsys):
    machine.lack("libibverbs-dev", "infiniband/verbs.h")
    rc, doc = run_doctor(capsys, "--face", "python")
    assert rc == 0 and doc["faces"]["python"]["ok"] is True
    for face in ("c", "rdmacm", "system-pyverbs", "ucx", "mpi"):
        rc, doc = run_doctor(capsys, "--face", face)
        assert rc == 1, face
        assert doc["faces"][face]["install"] == [apt("libibverbs-dev")], face
    # a face on top of c: its own packages, then the build and the live check not run
    checks = {c["name"]: c for c in doc["faces"]["c"]["checks"]}
    assert checks["build libibverbs.so.1"]["ok"] is None
    assert checks["build libibverbs.so.1"]["detail"] == (
        "not run: needs C compiler, Python.h, <infiniband/verbs.h>, package libibverbs-dev")


def test_several_missing_make_one_command_per_installer(machine, capsys):
    machine.lack("gcc", "cc", "ucx-utils", "numpy")
    rc, doc = run_doctor(capsys, "--face", "mpi", "--face", "python")
    assert rc == 1
    assert doc["faces"]["mpi"]["install"] == [apt("gcc", "ucx-utils")]
    assert doc["faces"]["python"]["install"] == [f"{sys.executable} -m pip install "
                                                 "'numpy>=1.26'"]
    assert doc["required"] == ["python", "mpi"]


BUILD_STATUS = doctor.build_status


def test_missing_rdma_cma_header_as_the_build_sees_it(machine, capsys, monkeypatch, tmp_path):
    """The build's own check (face_status), with rdma-core's headers looked for in a
    directory that has <infiniband/verbs.h> but not <rdma/rdma_cma.h>."""
    from softnic.faces.embedding import toolchain_missing
    if toolchain_missing():
        why = f"needs a C compiler and Python.h: {toolchain_missing()}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    monkeypatch.setattr(doctor, "build_status", BUILD_STATUS)
    (tmp_path / "infiniband").mkdir()
    (tmp_path / "infiniband" / "verbs.h").write_text("/* present */\n")
    monkeypatch.setenv("SOFTNIC_RDMA_INCLUDE", str(tmp_path))
    rc, doc = run_doctor(capsys, "--face", "rdmacm")
    assert rc == 1 and doc["faces"]["c"]["ok"] is True
    check = doc["faces"]["rdmacm"]["checks"][1]
    assert check["ok"] is False and check["detail"] == "<rdma/rdma_cma.h> is missing"
    assert doc["faces"]["rdmacm"]["install"] == [apt("librdmacm-dev")]
    (tmp_path / "infiniband" / "verbs.h").unlink()
    rc, doc = run_doctor(capsys, "--face", "python", "--face", "c")
    assert rc == 1 and doc["faces"]["python"]["ok"] is True
    assert doc["faces"]["c"]["install"] == [apt("libibverbs-dev")]


def test_tests_need_huge_pages_and_namespaces(machine, capsys):
    machine.lack("hugepages", "netns", "tshark")
    rc, doc = run_doctor(capsys, "--face", "tests")
    assert rc == 1
    tests = doc["faces"]["tests"]
    assert tests["missing"] == ["package tshark", "huge pages", "network namespaces"]
    assert tests["install"][0] == apt("tshark")
    assert tests["install"][1] == "echo 8 | sudo tee /proc/sys/vm/nr_hugepages"
    assert softnic(["doctor", "--no-live", "--face", "all"]) == 0   # the faces still work


def test_face_names_and_exit_status(machine, capsys):
    assert softnic(["doctor", "--no-live", "--face", "no-such-face"]) == 2
    assert "unknown face 'no-such-face'" in capsys.readouterr().err
    rc, doc = run_doctor(capsys, "--face", "middleware", "--face", "c-libibverbs")
    assert rc == 0 and doc["required"] == ["c", "ucx", "mpi"]
    assert list(doc["faces"]) == ["c", "ucx", "mpi"]        # with what they stand on
    machine.lack("python3-mpi4py")
    assert softnic(["doctor", "--no-live", "--face", "ucx"]) == 0
    assert softnic(["doctor", "--no-live", "--face", "middleware"]) == 1
    assert softnic(["doctor", "--no-live"]) == 0    # asked for nothing: the python face


@pytest.mark.parametrize("who", [("root", 0), ("ci", 1001)], ids=["root", "user"])
def test_user_says_whether_root_and_what_needs_it(machine, capsys, monkeypatch, who):
    monkeypatch.setattr(doctor, "user", lambda: who)
    rc, doc = run_doctor(capsys)
    assert rc == 0 and doc["user"] == {"name": who[0], "uid": who[1], "root": who[1] == 0}
    (check,) = [c for c in doc["faces"]["python"]["checks"] if c["name"] == "user"]
    assert check["ok"] is True        # no face needs root
    if who[1]:
        assert check["detail"].startswith("ci (uid 1001), not root: every face works")
        assert "network namespaces" in check["detail"] and "huge pages" in check["detail"]
    else:
        assert check["detail"].startswith("root:") and "--allow-run-as-root" in check["detail"]


def test_a_shared_libpython_is_a_note_not_a_failure(machine, capsys, monkeypatch, tmp_path):
    """An interpreter that runs from a libpython shared library works, slower: the
    doctor says so, with the measurement and how to choose another (the system's
    python3 when it is 3.11 or later), and the face still works."""
    system = tmp_path / "python3.12"
    system.touch()
    monkeypatch.setattr(doctor, "SYSTEM_PYTHON", str(system))
    rc, doc = run_doctor(capsys)
    (check,) = [c for c in doc["faces"]["python"]["checks"] if c["name"] == "interpreter build"]
    assert check["ok"] is True and check["note"] is False and "statically linked" in check["detail"]
    monkeypatch.setattr(doctor, "libpython_shared",
                        lambda: "/opt/py/lib/libpython3.11.so.1.0")
    rc, doc = run_doctor(capsys)
    assert rc == 0 and doc["faces"]["python"]["ok"] is True
    (check,) = [c for c in doc["faces"]["python"]["checks"] if c["name"] == "interpreter build"]
    assert check["ok"] is True and check["note"] is True
    assert "/opt/py/lib/libpython3.11.so.1.0" in check["detail"]
    assert f"tools/install.sh --python {system} makes softnic's venv on it" in check["detail"]
    assert softnic(["doctor", "--no-live", "--face", "python"]) == 0
    assert "  note    interpreter build" in capsys.readouterr().out
    # a system python3 too old for softnic is not offered
    old = tmp_path / "python3.10"
    old.touch()
    monkeypatch.setattr(doctor, "SYSTEM_PYTHON", str(old))
    rc, doc = run_doctor(capsys)
    (check,) = [c for c in doc["faces"]["python"]["checks"] if c["name"] == "interpreter build"]
    assert str(old) not in check["detail"]
    assert "tools/install.sh --python PYTHON" in check["detail"]


def test_compiled_modules_missing_are_notes(machine, capsys, monkeypatch):
    """The per-packet kernel and the simulator's loop: built (ok), not built yet under
    --no-live (not run), or not to be had here (a note with the reason: softnic runs
    its Python loops, and the face works)."""
    rc, doc = run_doctor(capsys)
    checks = {c["name"]: c for c in doc["faces"]["python"]["checks"]}
    assert checks["compiled per-packet kernel"]["ok"] is True
    assert checks["compiled simulator loop, timers and drain"]["detail"].startswith("built: ")
    monkeypatch.setattr(doctor, "compiled", lambda live: {
        "kernel": (False, "RuntimeError: no C compiler (Debian: gcc)"),
        "fabric": (None, "not built yet (softnic builds it on first use; --no-live builds "
                         "nothing)")})
    rc, doc = run_doctor(capsys)
    assert rc == 0 and doc["faces"]["python"]["ok"] is True
    checks = {c["name"]: c for c in doc["faces"]["python"]["checks"]}
    kernel = checks["compiled per-packet kernel"]
    loop = checks["compiled simulator loop, timers and drain"]
    assert kernel["ok"] is True and kernel["note"] is True and "no C compiler" in kernel["detail"]
    assert loop["ok"] is None and loop["note"] is False


def test_libpython_probe_agrees_with_ldd():
    """``libpython_shared`` finds the shared library exactly when the interpreter's
    executable links one (as ldd says), for this interpreter and for Debian's."""
    ldd = shutil.which("ldd")
    if ldd is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no ldd (libc-bin)")
        pytest.skip("no ldd")
    pythons = [sys.executable] + [p for p in (doctor.SYSTEM_PYTHON,) if os.path.exists(p)]
    for py in pythons:
        linked = re.search(r"(libpython3[.\d]*\.so[.\d]*) =>", subprocess.run(
            [ldd, os.path.realpath(py)], capture_output=True, text=True).stdout)
        found = subprocess.run(
            [py, "-c", "from softnic.cli import doctor; print(doctor.libpython_shared())"],
            capture_output=True, text=True, check=True, env={
                **os.environ, "PYTHONPATH": str(Path(doctor.__file__).parents[2])}
        ).stdout.strip()
        if linked:
            assert found.endswith(linked.group(1)), (py, found, linked.group(1))
        else:
            assert found == "None", (py, found)


def test_compiled_probe_builds_live_and_finds_the_build_after(monkeypatch, tmp_path):
    """``compiled``, for real: --no-live's look in an empty cache finds nothing;
    live it builds (or loads) both modules, as softnic's first use does; then the
    look in the cache finds the files."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert {name: built for name, (built, _) in doctor.compiled(live=False).items()} == {
        "kernel": None, "fabric": None}
    monkeypatch.undo()
    live = doctor.compiled(live=True)
    if not (live["kernel"][0] and live["fabric"][0]):
        why = f"softnic's compiled modules cannot be built here: {live}"
        if os.environ.get("CI") == "true":
            pytest.fail(why + " (.ci/run installs gcc and Python's headers)")
        pytest.skip(why)
    assert live["kernel"][1].startswith("built: cffi kernel, CRC-32 by ")
    cached = doctor.compiled(live=False)
    for name in ("kernel", "fabric"):
        built, detail = cached[name]
        assert built is True and Path(detail.removeprefix("built: ")).is_file(), cached


def test_package_list_script_is_the_doctors():
    """tools/install.sh asks packages.py (run by the system's python3) for the list."""
    out = subprocess.run([sys.executable, packages.__file__, "rdmacm", "ucx"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["gcc", "python3-dev", "libibverbs-dev", "ibverbs-utils", "librdmacm-dev",
                   "rdmacm-utils", "ucx-utils"]
    r = subprocess.run([sys.executable, packages.__file__, "nope"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "unknown face" in r.stderr


@pytest.mark.unprivileged
def test_live_every_face_answers():
    """Every face built and answering on this machine, for real, for any user (the
    tests' own table too as root: their network namespaces need it)."""
    cmd = [*SOFTNIC, "doctor", "--json", "--face", "all"]
    if os.geteuid() == 0:
        cmd += ["--face", "tests"]
    quick = json.loads(subprocess.run(cmd + ["--no-live"], capture_output=True, text=True,
                                      timeout=120).stdout)
    if not quick["ok"]:
        missing = {n: f["install"] for n, f in quick["faces"].items() if not f["ok"]}
        why = f"faces that cannot work here: {missing}"
        if os.environ.get("CI") == "true":
            pytest.fail(why + " (.ci/run installs everything)")
        pytest.skip(why)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    doc = json.loads(r.stdout)
    failed = {n: f["missing"] for n, f in doc["faces"].items() if not f["ok"]}
    assert r.returncode == 0 and not failed, (failed, r.stderr[-2000:])
    checks = {c["name"]: c for f in doc["faces"].values() for c in f["checks"]}
    for name in ("pyverbs import (softnic's)", "build libibverbs.so.1",
                 "ibv_devinfo under softnic exec", "build librdmacm.so.1",
                 "rping connect under softnic exec",
                 "Debian's pyverbs under softnic exec --pyverbs system",
                 "ucx_info -d under softnic exec", "Open MPI's pml ucx"):
        assert checks[name]["ok"] is True, (name, checks[name])
    assert "pyverbs_shim" in checks["pyverbs import (softnic's)"]["detail"]
    assert "/usr/lib/python3" in checks[
        "Debian's pyverbs under softnic exec --pyverbs system"]["detail"]
    assert "rc_verbs" in checks["ucx_info -d under softnic exec"]["detail"]
    assert doc["user"]["root"] is (os.geteuid() == 0)
