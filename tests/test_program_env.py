"""Under ``softnic exec`` a Python program's environment stays its own.

The program sees the modules it would see without softnic (its interpreter's, its
venv's, its PYTHONPATH's), except ``pyverbs`` with softnic's face: only the shim's
directory joins its path.  When softnic's engine runs inside the program's own
interpreter (Debian's /usr/bin/python3 loading softnic's libibverbs.so.1, directly or
through UCX under mpi4py), softnic finds its modules off the program's path
(softnic/faces/privateimport.py), so the program's cffi and numpy are Debian's, and cffi
works (mpi4py's test_cffi: a cffi package of softnic's environment beside Debian's
_cffi_backend failed with "Version mismatch").

The live tests need Debian's python3-cffi and python3-numpy (and for mpirun
openmpi-bin, ucx-utils and python3-mpi4py): skipped where missing, failed under CI=true.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from softnic.cli.main import SHIM
from test_libibverbs import _missing, libdir, softnic_exec  # noqa: F401

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "c" / "host_modules.py"
HOST = "/usr/bin/python3"
TIMEOUT = 180


def last_json(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines, out
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def reference():
    """The program under Debian's python3 without softnic."""
    r = subprocess.run([HOST, str(PROGRAM), "probe"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    if r.returncode:
        _missing(f"{HOST} cannot import cffi and numpy (Debian: python3-cffi "
                 f"python3-numpy): {r.stderr.strip()[-200:]}")
    return last_json(r.stdout)


def assert_own_environment(seen: dict, ref: dict) -> None:
    assert seen["cffi"] == ref["cffi"] and seen["cffi"][1].startswith("/usr/lib/python3/")
    assert seen["numpy"] == ref["numpy"] and seen["numpy"][1].startswith("/usr/lib/python3/")
    assert seen["ffi_works"] is True
    # the path is the program's, with softnic's pyverbs shim (and nothing else) after its
    # script's directory
    assert seen["path"] == ref["path"][:1] + [str(SHIM)] + ref["path"][1:]
    assert seen["importable"] == ref["importable"]


@pytest.mark.unprivileged
def test_host_python_keeps_its_cffi_and_numpy_while_verbs_run_on_the_c_face(libdir,
                                                                           reference):
    cmd, env = softnic_exec(HOST, str(PROGRAM), "ibverbs", devices="2")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = last_json(r.stdout)
    assert seen["devices"] == ["softnic0", "softnic1"]
    assert "softnic" in seen["loaded"]          # the engine ran in this interpreter
    assert seen["mr"] == [True, True]           # a numpy array of Debian's, registered
    assert seen["closed"] == [0, 0, 0]
    assert_own_environment(seen, reference)


def test_mpi4py_test_cffi_passes_over_rc_verbs(libdir, reference, tmp_path):
    from test_middleware import mpirun
    r = subprocess.run([HOST, "-c", "import mpi4py"], capture_output=True, timeout=TIMEOUT)
    if r.returncode:
        _missing("needs Debian's python3-mpi4py")
    out, docs = mpirun(tmp_path, 2, "rc_v,self", [HOST, str(PROGRAM), "mpi"])
    seen = last_json(out)
    assert seen["test_cffi"] == [True, True, 22], out
    assert seen["ring"] is True
    assert "softnic" in seen["loaded"]
    assert_own_environment(seen, reference)
    assert {d["pid"] for d in docs if d["counters"].get("sent_pkts", 0)}, docs


def test_python_face_adds_only_pyverbs(reference):
    prog = textwrap.dedent("""
        import importlib.util, json, sys
        import pyverbs.device as d
        names = [x.name.decode() for x in d.get_device_list()]
        print(json.dumps({"names": names, "path": sys.path, "pyverbs": d.__name__,
                          "softnic": "softnic" in sys.modules,
                          "crc32c": importlib.util.find_spec("crc32c") is not None}))
    """)
    cmd, env = softnic_exec(HOST, "-c", prog, devices="2")
    cmd.insert(cmd.index("exec") + 1, "--no-libibverbs")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = last_json(r.stdout)
    assert seen["names"] == ["softnic0", "softnic1"]
    assert seen["pyverbs"] == "verbs_api.device" and seen["softnic"]
    # -c: the path starts with '' where a script's directory would be
    assert seen["path"] == [""] + [str(SHIM)] + reference["path"][1:]
    assert seen["crc32c"] == ("crc32c" in reference["importable"])


PRIVATE = Path(__file__).resolve().parents[1] / "softnic" / "faces" / "privateimport.py"


def test_private_finders_serve_softnic_and_leave_the_program_its_own(tmp_path):
    """In a bare interpreter: a program with its own ``congestion`` module; softnic's
    root (a ``softnic`` that imports ``congestion`` and a dependency ``depmod``) and
    softnic's site directory (``depmod``, and a ``cffi`` that must never be taken)."""
    prog, root, site = tmp_path / "prog", tmp_path / "root", tmp_path / "site"
    for d in (prog, root / "softnic", root / "congestion", site / "cffi"):
        d.mkdir(parents=True)
    (prog / "congestion.py").write_text("WHO = 'program'\n")
    (root / "congestion" / "__init__.py").write_text("WHO = 'softnic'\n")
    (root / "softnic" / "__init__.py").write_text(
        "import congestion, depmod\nWHO = (congestion.WHO, depmod.WHO)\n"
        "def later():\n    import cffi\n")
    (site / "depmod.py").write_text("WHO = 'softnic site'\n")
    (site / "cffi" / "__init__.py").write_text("WHO = 'softnic site'\n")
    code = textwrap.dedent(f"""
        import importlib.util, sys
        sys.path.insert(0, {str(prog)!r})
        spec = importlib.util.spec_from_file_location("_softnic_privateimport", {str(PRIVATE)!r})
        pi = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(pi)
        pi.install({str(root)!r}, [{str(site)!r}])
        pi.install({str(root)!r}, [{str(site)!r}])       # a second face: no second finders
        assert sum(isinstance(f, pi.SoftnicFinder) for f in sys.meta_path) == 2
        softnic = pi.import_module("softnic")
        print(softnic.WHO)
        for name in ("depmod", "cffi"):
            try:
                __import__(name)
                print(name, "imported")
            except ImportError:
                print(name, "not found")
        try:
            softnic.later()
            print("cffi for softnic")
        except ImportError:
            print("no cffi for softnic")
    """)
    # (no site-packages: this interpreter has no cffi of its own)
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # softnic's code gets softnic's congestion (not the program's, first on sys.path) and
    # depmod from softnic's site, which is then in sys.modules for the program too; cffi
    # never comes from softnic's site
    assert r.stdout.splitlines() == ["('softnic', 'softnic site')", "depmod imported",
                                     "cffi not found", "no cffi for softnic"]


def test_a_dependency_softnic_has_not_loaded_stays_unseen_by_the_program(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "depmod.py").write_text("WHO = 'softnic site'\n")
    code = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("_softnic_privateimport", {str(PRIVATE)!r})
        pi = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(pi)
        pi.install({str(tmp_path / 'root')!r}, [{str(site)!r}])
        print(importlib.util.find_spec("depmod"))
        try:
            import depmod
        except ImportError:
            print("not found")
    """)
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["None", "not found"]


def test_the_engine_in_a_c_program_ignores_the_programs_python_variables(libdir, tmp_path):
    """A C program's environment may steer its own Python programs (PYTHONPATH with a
    cffi and a numpy of their own, PYTHONHOME): softnic's interpreter inside the C
    program takes its path from the build, so modules that would break it go unseen."""
    import shutil
    ibv_devices = shutil.which("ibv_devices")
    if ibv_devices is None:
        _missing("needs ibv_devices (Debian: ibverbs-utils)")
    bad = tmp_path / "theirs"
    for name in ("cffi", "numpy", "softnic", "congestion"):
        (bad / name).mkdir(parents=True)
        (bad / name / "__init__.py").write_text(f"raise ImportError('the program\\'s {name}')\n")
    (bad / "_cffi_backend.py").write_text("raise ImportError('the program\\'s _cffi_backend')\n")
    # (env sets them for ibv_devices only: softnic exec itself is a Python program)
    cmd, env = softnic_exec("env", f"PYTHONPATH={bad}", f"PYTHONHOME={bad}", ibv_devices,
                            devices="2")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "softnic0" in r.stdout and "softnic1" in r.stdout, r.stdout + r.stderr
    assert "ImportError" not in r.stderr, r.stderr
