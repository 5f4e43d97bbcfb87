"""``softnic doctor``: which faces work on this machine, and what to install for the others.

    softnic doctor                      # every face, a table each
    softnic doctor --face c --face rdmacm   # exit 1 unless both work
    softnic doctor --json               # the same, for scripts
    softnic doctor --no-live            # only what is installed, run nothing

Per face (``packages.FACES``, and ``tests``: what the test suite runs on top) it
checks what the face stands on (the Python and softnic's Python dependencies, the C
compiler and headers, the Debian packages of ``packages.py``, a loopback address to
bind, huge pages, network namespaces), builds the face and makes it answer: softnic's
pyverbs imported under ``softnic exec``, ``ibv_devinfo`` on softnic's libibverbs, an
rping connection over softnic's librdmacm, Debian's pyverbs over softnic's
libibverbs, ``ucx_info -d`` finding softnic's device, Open MPI's UCX component.

A failed check gives the command that installs what is missing.  The probes are
module-level functions, so a test replaces one to stand for a machine without a
package or a header.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import packages as _packages

#: what each face is, for the table's titles
TITLES = {
    "python": "softnic's pyverbs API (verbs_api) for Python programs",
    "c": "softnic's libibverbs.so.1 for C programs (perftest, ibverbs-utils, ...)",
    "rdmacm": "softnic's librdmacm.so.1 (rping, ucmatose, perftest -R, qperf -cm1)",
    "system-pyverbs": "Debian's pyverbs (/usr/bin/python3) over softnic's libibverbs.so.1",
    "ucx": "UCX over softnic's libibverbs (rc_verbs, ud_verbs)",
    "mpi": "Open MPI (pml ucx) and mpi4py over UCX",
    "tests": "what softnic's own test suite runs on top of the faces",
}
MIN_PYTHON = (3, 11)
HUGEPAGES = 8               # rdma-core's huge-page tests (.ci/run reserves as many)
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class Check:
    """One thing a face needs.  ``ok`` is None when the check was not run (a check it
    depends on failed, or ``--no-live``).  ``debs`` and ``pip`` are what installs it.
    ``note``: the face works, but slower than it could here (``detail`` says why and
    what to do); printed as ``note``, not ``ok``."""
    name: str
    ok: bool | None
    detail: str
    debs: list[str] = field(default_factory=list)
    pip: list[str] = field(default_factory=list)
    fix: str = ""               # any other command that fixes it
    note: bool = False


@dataclass
class Face:
    name: str
    title: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    @property
    def missing(self) -> list[str]:
        return [c.name for c in self.checks if c.ok is False]

    def install(self) -> list[str]:
        """The commands that install what the face lacks, in the order to run them."""
        debs, pips, other = [], [], []
        for c in self.checks:
            if c.ok is not False:
                continue
            debs += [d for d in c.debs if d not in debs]
            pips += [p for p in c.pip if p not in pips]
            if c.fix and c.fix not in other:
                other.append(c.fix)
        out = [apt_command(debs)] if debs else []
        if pips:
            out.append(pip_command(pips))
        return out + other

    def as_json(self) -> dict:
        return {"title": self.title, "ok": self.ok, "missing": self.missing,
                "install": self.install(), "checks": [asdict(c) for c in self.checks]}


def apt_command(debs) -> str:
    return ("sudo " if os.geteuid() != 0 else "") + "apt-get install -y " + " ".join(debs)


def pip_command(reqs) -> str:
    return f"{sys.executable} -m pip install " + " ".join(f"'{r}'" if any(
        ch in r for ch in "<>=!~; ") else r for r in reqs)


# ---------------------------------------------------------------- probes (tests replace them)


def package_version(name: str) -> str | None:
    """The installed version of Debian package ``name``, or None."""
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", name],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    status, _, version = r.stdout.partition("\t")
    return version if r.returncode == 0 and status.endswith("install ok installed") else None


def requirements() -> list[str] | None:
    """softnic's requirements as installed (its metadata), or None if it is not installed
    as a distribution."""
    from importlib import metadata
    try:
        return metadata.requires("softnic") or []
    except metadata.PackageNotFoundError:
        return None


def distribution_version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def build_status(face: str) -> tuple[bool, str, list[str]]:
    """Whether softnic's library of a C face ("c": libibverbs.so.1, "rdmacm":
    librdmacm.so.1) can be built here, as the build itself decides (a C compiler,
    Python.h, rdma-core's headers: ``softnic.faces.availability.face_status``): (ok,
    what is missing, the Debian packages that install it)."""
    from ..faces.availability import face_status
    st = face_status()["libibverbs" if face == "c" else "librdmacm"]
    debs = st.install.split("apt-get install -y", 1)[1].split() if st.install else []
    return st.ok, st.reason, debs


def user() -> tuple[str, int]:
    """The user running softnic: (name, uid)."""
    import pwd
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:
        return str(uid), uid


#: what softnic or its tests do that needs root (or sudo); everything else runs as any user
NEEDS_ROOT = ("installing Debian packages", "reserving huge pages (vm.nr_hugepages)",
              "the two-host tests in network namespaces (ip netns)", "IPv6 ULA addresses on lo")


def which(program: str) -> str | None:
    return shutil.which(program)


def libpython_shared() -> str | None:
    """The libpython shared library this interpreter runs from (a build configured
    with ``--enable-shared``, as pyenv's here), or None: statically linked (as
    Debian's /usr/bin/python3), or no /proc to tell."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = re.search(r"\s(/\S*/libpython3[.\d]*\.so[.\d]*)$", maps, re.M)
    return found.group(1) if found else None


def compiled(live: bool) -> dict[str, tuple[bool | None, str]]:
    """softnic's two compiled modules for this interpreter (``softnic.accel``): the
    per-packet kernel and the simulator's event loop, each ``(built, detail)``.
    ``live``: built now if not cached (what softnic does on first use), else only
    looked for in the cache (``built`` None when it is not there yet)."""
    from .. import accel
    if not live:
        found = accel.cached()
        return {name: (True, f"built: {path}") if path is not None else
                (None, "not built yet (softnic builds it on first use; --no-live builds "
                       "nothing)") for name, path in found.items()}
    k = accel.load()
    fab = accel.fabric_loop()
    return {"kernel": (True, f"built: {accel.describe()}") if k is not None else
            (False, accel.error),
            "fabric": (True, "built") if fab is not None else (False, accel.fabric_error)}


def hugepages() -> int:
    try:
        return int(Path("/proc/sys/vm/nr_hugepages").read_text())
    except (OSError, ValueError):
        return 0


def bind_udp(ip: str, port: int = 0) -> str | None:
    """None if a UDP socket binds to ``ip``, else the error."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((ip, port))
    except OSError as e:
        return str(e)
    return None


def netns_allowed() -> tuple[bool, str]:
    """Can the two-host tests make their network namespaces here?  They use ``ip netns``,
    which needs root (CAP_NET_ADMIN), checked with ``unshare -n``."""
    if os.geteuid() != 0:
        return False, "not root: the two-host tests make network namespaces with ip netns"
    unshare = which("unshare")
    if unshare is None:
        return False, "no unshare (util-linux)"
    argv = [unshare, "-n", "true"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    if r.returncode:
        return False, f"{' '.join(argv[:-1])}: {r.stderr.strip() or 'exit %d' % r.returncode}"
    return True, "root"


def build_face(face: str) -> tuple[bool, str]:
    """Build softnic's library of a C face ("c": libibverbs.so.1, "rdmacm":
    librdmacm.so.1), or find it built: (ok, its path or why not)."""
    from ..faces.embedding import BuildError
    if face == "c":
        from ..faces.libibverbs.build import SONAME, build
    else:
        from ..faces.librdmacm.build import SONAME, build
    try:
        return True, str(build() / SONAME)
    except BuildError as e:
        return False, str(e)


def run(argv: list[str], env: dict | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """A command, its output in ``stdout`` (stderr folded in); a timeout is exit 124."""
    try:
        return subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        return subprocess.CompletedProcess(argv, 124, (out or "") + f"\n(timed out after "
                                           f"{timeout:.0f} s)")
    except OSError as e:
        return subprocess.CompletedProcess(argv, 127, str(e))


# ---------------------------------------------------------------- the checks


def _short(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _softnic_exec(ip: str, *args: str, pyverbs: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "softnic.cli", "exec", "--devices", f"softnic0={ip}"]
    if pyverbs:
        cmd += ["--pyverbs", pyverbs]
    return cmd + ["--", *args]


def _env() -> dict:
    """The live checks' environment: this one without the user's SOFTNIC_* settings
    (their devices and fault models are not the checks')."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SOFTNIC_")}


class Doctor:
    """Runs the checks of the faces asked for (and of the faces they stand on), each once."""

    def __init__(self, live: bool = True, timeout: float = 120):
        self.live = live
        self.timeout = timeout
        self.faces: dict[str, Face] = {}
        self._net: str | None = None
        self._next_host = 2

    # loopback addresses of the live checks: one /24 nobody on this machine holds
    def address(self) -> str:
        if self._net is None:
            rng = random.Random()
            for _ in range(200):
                net = f"127.{rng.randrange(20, 250)}.{rng.randrange(1, 250)}"
                if all(bind_udp(f"{net}.{h}", 4791) is None for h in range(2, 10)):
                    self._net = net
                    break
            else:
                raise RuntimeError("no free loopback /24 for the live checks")
        ip = f"{self._net}.{self._next_host}"
        self._next_host = self._next_host + 1 if self._next_host < 9 else 2
        return ip

    def face(self, name: str) -> Face:
        if name not in self.faces:
            self.faces[name] = Face(name, TITLES[name], getattr(self, "_" + name.replace(
                "-", "_"))())
        return self.faces[name]

    # -- pieces shared by several faces

    def _packages(self, face: str) -> list[Check]:
        out = []
        for name, why in _packages.OWN[face]:
            if name == "python3-dev" and sys.base_prefix != "/usr":
                continue        # this interpreter's own headers count (the Python.h check)
            version = package_version(name)
            out.append(Check(f"package {name}", version is not None,
                             f"{version} ({why})" if version else f"not installed ({why})",
                             debs=[name]))
        return out

    def _needs(self, face: str) -> Check:
        """The face ``face`` works (checked in full under its own table)."""
        f = self.face(face)
        debs: list[str] = []
        for c in f.checks:
            if c.ok is False:
                debs += [d for d in c.debs if d not in debs]
        fixes = [c.fix for c in f.checks if c.ok is False and c.fix]
        return Check(f"face {face}", f.ok, "works" if f.ok else "missing: " + ", ".join(
            f.missing), debs=debs, fix="; ".join(fixes))

    def _not_run(self, name: str, checks: list[Check]) -> Check | None:
        failed = [c.name for c in checks if c.ok is False]
        if failed:
            return Check(name, None, "not run: needs " + ", ".join(failed))
        if not self.live:
            return Check(name, None, "not run (--no-live)")
        return None

    def _buildable(self, face: str) -> Check:
        ok, reason, debs = build_status(face)
        what = "<infiniband/verbs.h>" if face == "c" else "<rdma/rdma_cma.h>"
        return Check(f"C compiler, Python.h, {what}", ok, "present" if ok else reason,
                     debs=debs)

    def _build(self, face: str, checks: list[Check]) -> Check:
        name = "build " + ("libibverbs.so.1" if face == "c" else "librdmacm.so.1")
        failed = [c.name for c in checks if c.ok is False]
        if failed:
            return Check(name, None, "not run: needs " + ", ".join(failed))
        if not self.live:
            return Check(name, None, "not run (--no-live)")
        ok, detail = build_face(face)
        return Check(name, ok, detail)

    # -- the faces

    def _python(self) -> list[Check]:
        v = sys.version_info
        checks = [Check("python", v[:2] >= MIN_PYTHON,
                        f"{sys.executable} {v.major}.{v.minor}.{v.micro}"
                        + ("" if v[:2] >= MIN_PYTHON else f" (softnic needs "
                           f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or later)"),
                        fix="" if v[:2] >= MIN_PYTHON else
                        "install Python 3.11 or later (Debian 12: apt-get install python3)")]
        checks.append(self._user())
        checks.append(self._interpreter())
        checks += self._dependencies()
        ip_err = bind_udp("127.0.0.2") or bind_udp(f"127.{random.randrange(20, 250)}.1.2")
        checks.append(Check("loopback", ip_err is None, "binds UDP on 127.x.y.z (a device "
                            "per address)" if ip_err is None else f"cannot bind UDP on "
                            f"127.x.y.z: {ip_err}", fix="" if ip_err is None else
                            "bring up lo with 127.0.0.0/8 (ip link set lo up)"))
        checks += self._compiled()
        checks.append(self._live_python(checks))
        return checks

    def _interpreter(self) -> Check:
        """How this CPython was built, where it costs softnic speed: a build whose
        interpreter is a shared library (``--enable-shared``) ran softnic slower than
        a statically linked one (docs/performance.md, "The interpreter's build")."""
        v = sys.version_info
        name = f"{platform.python_implementation()} {v.major}.{v.minor}.{v.micro}"
        lib = libpython_shared()
        if lib is None:
            return Check("interpreter build", True, f"{name}, statically linked (no "
                         "libpython shared library)")
        system = re.fullmatch(r"python3\.(\d+)", Path(os.path.realpath(SYSTEM_PYTHON)).name)
        if system and (3, int(system.group(1))) >= MIN_PYTHON and \
                os.path.realpath(SYSTEM_PYTHON) != os.path.realpath(sys.executable):
            other = f"tools/install.sh --python {SYSTEM_PYTHON} makes softnic's venv on it"
        else:
            other = ("a statically linked CPython 3.11 or later (one configured without "
                     "--enable-shared) for softnic's venv: tools/install.sh --python PYTHON")
        return Check("interpreter build", True, f"{name} runs from {lib}, a shared-library "
                     "build: on 2026-12-04 Debian's statically linked CPython 3.11.2 ran "
                     "softnic's engine and simulator 1.2x as fast per CPU second as pyenv's "
                     f"shared one, for Python programs (docs/performance.md); {other}",
                     note=True)

    def _compiled(self) -> list[Check]:
        """softnic's compiled modules (``softnic.accel``): without them it runs the
        same loops in Python, which works, slower."""
        labels = {"kernel": "compiled per-packet kernel",
                  "fabric": "compiled simulator loop, timers and drain"}
        out = []
        for name, (built, detail) in compiled(self.live).items():
            if built is False:
                out.append(Check(labels[name], True, f"not in use ({detail}): softnic runs "
                                 "the same loops in Python, slower", note=True))
            else:
                out.append(Check(labels[name], built, detail))
        return out

    def _user(self) -> Check:
        """Who runs softnic, and what that means: every face works for any user."""
        name, uid = user()
        if uid == 0:
            detail = ("root: everything is allowed (Open MPI's mpirun wants "
                      "--allow-run-as-root); no face needs it")
        else:
            detail = (f"{name} (uid {uid}), not root: every face works; root (or sudo) is "
                      "for " + ", ".join(NEEDS_ROOT))
        return Check("user", True, detail)

    def _dependencies(self) -> list[Check]:
        """softnic's own Python requirements (its installed metadata), each installed."""
        reqs = requirements()
        if reqs is None:
            return [Check("python packages", None, "softnic is not installed as a "
                          "distribution (pip install -e .): its requirements not read")]
        missing, found = [], 0
        for req in reqs:
            if ";" in req:              # an extra's (test, torch): not the face's
                continue
            if distribution_version(re.split(r"[<>=!~\[ (]", req, maxsplit=1)[0]) is None:
                missing.append(req)
            else:
                found += 1
        return [Check("python packages", not missing,
                      f"{found} of softnic's requirements installed" if not missing
                      else "missing: " + ", ".join(missing), pip=missing)]

    def _live_python(self, checks: list[Check]) -> Check:
        name = "pyverbs import (softnic's)"
        skip = self._not_run(name, checks)
        if skip:
            return skip
        code = ("import pyverbs, pyverbs.device as d; names = [x.name.decode() for x in "
                "d.get_device_list()]; c = d.Context(name=names[0]); a = c.query_device(); "
                "c.close(); print(pyverbs.__file__, names, a.max_qp)")
        r = run(_softnic_exec(self.address(), sys.executable, "-c", code), _env(),
                self.timeout)
        ok = r.returncode == 0 and "pyverbs_shim" in r.stdout and "softnic0" in r.stdout
        return Check(name, ok, _short(r.stdout) if ok else
                     f"exit {r.returncode}: {_short(r.stdout)}")

    def _c(self) -> list[Check]:
        checks = [self._buildable("c")] + self._packages("c")
        checks.append(self._build("c", checks))
        checks.append(self._live_devinfo(checks))
        return checks

    def _live_devinfo(self, checks: list[Check]) -> Check:
        name = "ibv_devinfo under softnic exec"
        skip = self._not_run(name, checks)
        if skip:
            return skip
        r = run(_softnic_exec(self.address(), "ibv_devinfo"), _env(), self.timeout)
        ok = r.returncode == 0 and "softnic0" in r.stdout and "PORT_ACTIVE" in r.stdout
        first = " ".join(line.strip() for line in r.stdout.splitlines()
                         if "hca_id" in line or "state:" in line)
        return Check(name, ok, _short(first) if ok else
                     f"exit {r.returncode}: {_short(r.stdout)}")

    def _rdmacm(self) -> list[Check]:
        checks = [self._needs("c"), self._buildable("rdmacm")] + self._packages("rdmacm")
        checks.append(self._build("rdmacm", checks))
        checks.append(self._live_rping(checks))
        return checks

    def _live_rping(self, checks: list[Check]) -> Check:
        """An rping server and client, each with a device of its own, one ping."""
        name = "rping connect under softnic exec"
        skip = self._not_run(name, checks)
        if skip:
            return skip
        server_ip, client_ip = self.address(), self.address()
        env = _env()
        deadline = time.monotonic() + self.timeout
        server = subprocess.Popen(_softnic_exec(server_ip, "rping", "-s", "-a", server_ip,
                                                "-C", "1"), env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        try:
            client = None
            while time.monotonic() < deadline and server.poll() is None:
                client = run(_softnic_exec(client_ip, "rping", "-c", "-a", server_ip, "-C", "1",
                                           "-v"), env, max(1.0, deadline - time.monotonic()))
                if client.returncode == 0 or "ping data" in client.stdout:
                    break
                time.sleep(0.5)     # the server's device was not listening yet
            try:
                sout = server.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            except subprocess.TimeoutExpired:
                server.kill()
                sout = server.communicate()[0] + "(server timed out)"
        finally:
            if server.poll() is None:
                server.kill()
                server.communicate()
        ok = (client is not None and client.returncode == 0 and server.returncode == 0
              and "ping data" in client.stdout)
        if ok:
            return Check(name, True, f"{server_ip} <- {client_ip}: "
                         + _short(client.stdout.splitlines()[0], 60))
        cout = client.stdout if client is not None else "(client not run)"
        return Check(name, False, f"client: {_short(cout, 200)} server exit "
                     f"{server.returncode}: {_short(sout, 200)}")

    def _system_pyverbs(self) -> list[Check]:
        checks = [self._needs("c")]
        ok = Path(SYSTEM_PYTHON).exists()
        checks.append(Check(SYSTEM_PYTHON, ok, "present" if ok else "missing",
                            debs=["python3"]))
        checks += self._packages("system-pyverbs")
        name = "Debian's pyverbs under softnic exec --pyverbs system"
        skip = self._not_run(name, checks)
        if skip:
            checks.append(skip)
            return checks
        code = ("import pyverbs, pyverbs.device as d; names = [x.name.decode() for x in "
                "d.get_device_list()]; c = d.Context(name=names[0]); a = c.query_device(); "
                "c.close(); print(pyverbs.__file__, names, a.max_qp)")
        r = run(_softnic_exec(self.address(), SYSTEM_PYTHON, "-c", code, pyverbs="system"),
                _env(), self.timeout)
        ok = (r.returncode == 0 and "softnic0" in r.stdout
              and "pyverbs_shim" not in r.stdout)
        checks.append(Check(name, ok, _short(r.stdout) if ok else
                            f"exit {r.returncode}: {_short(r.stdout)}"))
        return checks

    def _ucx(self) -> list[Check]:
        checks = [self._needs("c")] + self._packages("ucx")
        name = "ucx_info -d under softnic exec"
        skip = self._not_run(name, checks)
        if skip:
            checks.append(skip)
            return checks
        r = run(_softnic_exec(self.address(), "ucx_info", "-d"), _env(), self.timeout)
        tls = sorted(set(re.findall(r"Transport: (\w+)\s*\n#\s*Device: softnic0", r.stdout)))
        ok = r.returncode == 0 and bool(tls)
        checks.append(Check(name, ok, "softnic0 transports: " + ", ".join(tls) if ok else
                            f"exit {r.returncode}, no transport on softnic0: "
                            f"{_short(r.stdout)}"))
        return checks

    def _mpi(self) -> list[Check]:
        checks = [self._needs("ucx")] + self._packages("mpi")
        name = "Open MPI's pml ucx"
        skip = self._not_run(name, checks)
        if skip:
            checks.append(skip)
            return checks
        r = run(["ompi_info"], None, self.timeout)
        ok = r.returncode == 0 and re.search(r"MCA pml: ucx", r.stdout) is not None
        version = re.search(r"Open MPI: (\S+)", r.stdout)
        checks.append(Check(name, ok, f"Open MPI {version.group(1) if version else '?'}, "
                            "MCA pml: ucx" if ok else f"ompi_info exit {r.returncode}: "
                            "no 'MCA pml: ucx'"))
        return checks

    def _tests(self) -> list[Check]:
        checks = [self._needs(f) for f in _packages.FACES] + self._packages("tests")
        n = hugepages()
        checks.append(Check("huge pages", n >= HUGEPAGES, f"vm.nr_hugepages = {n} (rdma-core's "
                            f"huge-page tests need {HUGEPAGES})",
                            fix="" if n >= HUGEPAGES else
                            f"echo {HUGEPAGES} | sudo tee /proc/sys/vm/nr_hugepages"))
        ok, detail = netns_allowed()
        checks.append(Check("network namespaces", ok, detail, fix="" if ok else
                            "run the two-host tests as root (CI does); the rest of the "
                            "suite runs as any user"))
        return checks


def diagnose(faces, live: bool = True, timeout: float = 120) -> dict[str, Face]:
    """The faces named (``packages.expand``'s names) and those they stand on, each with
    its checks."""
    doctor = Doctor(live=live, timeout=timeout)
    for name in _packages.expand(faces):
        doctor.face(name)
    order = (*_packages.FACES, "tests")     # with the faces they stand on, those first
    return {name: doctor.faces[name] for name in order if name in doctor.faces}


def render(faces: dict[str, Face]) -> str:
    lines = []
    for face in faces.values():
        lines.append(f"{face.name}: {'works' if face.ok else 'DOES NOT WORK'} -- {face.title}")
        width = max(len(c.name) for c in face.checks)
        for c in face.checks:
            mark = "note" if c.ok and c.note else {True: "ok", False: "MISSING", None: "-"}[c.ok]
            lines.append(f"  {mark:<8}{c.name:<{width}}  {c.detail}")
        for cmd in face.install():
            lines.append(f"  install: {cmd}")
        lines.append("")
    return "\n".join(lines)


def add_arguments(p) -> None:
    p.add_argument("--face", action="append", default=[], metavar="FACE",
                   help="a face you need: python, c (c-libibverbs), rdmacm, system-pyverbs, "
                   "ucx, mpi, middleware (ucx and mpi), tests, all; may repeat. The exit "
                   "status is 1 when one of them does not work (without --face: when the "
                   "python face does not)")
    p.add_argument("--json", action="store_true", help="print JSON, for scripts")
    p.add_argument("--no-live", dest="live", action="store_false",
                   help="only check what is installed; build and run nothing")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds each live check may take (default 120)")


def main(args) -> int:
    asked = list(args.face)
    try:
        names = _packages.expand(asked or ["all", "tests"])
        required = _packages.expand(asked or ["python"])
    except ValueError as e:
        print(f"softnic doctor: {e}", file=sys.stderr)
        return 2
    faces = diagnose(names, live=args.live, timeout=args.timeout)
    ok = all(faces[f].ok for f in required)
    if args.json:
        name, uid = user()
        print(json.dumps({"ok": ok, "required": required, "live": args.live,
                          "python": sys.version.split()[0], "executable": sys.executable,
                          "user": {"name": name, "uid": uid, "root": uid == 0},
                          "faces": {n: f.as_json() for n, f in faces.items()}}, indent=1))
    else:
        print(render(faces), end="")
        bad = [f for f in required if not faces[f].ok]
        print(f"the faces asked for ({', '.join(required)}) work" if not bad else
              f"does not work here: {', '.join(bad)} (install what is listed above)")
    return 0 if ok else 1
