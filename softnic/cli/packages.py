"""The Debian packages each face of softnic needs, and those its tests run.

The one list: ``softnic doctor`` checks it, ``tools/install.sh`` installs from it
(before softnic is installed, so this module imports only the standard library and
runs as a script):

    python3 softnic/cli/packages.py c rdmacm        # the packages, one line
    python3 softnic/cli/packages.py all tests

A face's list includes the faces it stands on (``REQUIRES``).
"""

from __future__ import annotations

import sys

#: face -> Debian packages of its own (name, why)
OWN: dict[str, tuple[tuple[str, str], ...]] = {
    "python": (),
    "c": (("gcc", "compiles softnic's libibverbs.so.1 (cffi embedding)"),
          ("python3-dev", "Python.h, for the C faces' embedded interpreter"),
          ("libibverbs-dev", "<infiniband/verbs.h>, for softnic's libibverbs.so.1"),
          ("ibverbs-utils", "ibv_devinfo, ibv_rc_pingpong: C programs on the face")),
    "rdmacm": (("librdmacm-dev", "<rdma/rdma_cma.h>, for softnic's librdmacm.so.1"),
               ("rdmacm-utils", "rping, ucmatose: rdma_cm programs on the face")),
    "system-pyverbs": (("python3-pyverbs", "rdma-core's pyverbs, run over softnic's "
                        "libibverbs.so.1 with /usr/bin/python3"),),
    "ucx": (("ucx-utils", "UCX (libuct_ib, ucx_info, ucx_perftest)"),),
    "mpi": (("openmpi-bin", "Open MPI (mpirun, ompi_info; pml ucx)"),
            ("libopenmpi-dev", "mpicc, to build MPI programs"),
            ("python3-mpi4py", "mpi4py for /usr/bin/python3")),
    "tests": (("tshark", "the wire cross-checks"),
              ("iproute2", "the two-host tests in network namespaces"),
              ("sockperf", "the C UDP reference of tools/perf_harness.py"),
              ("perftest", "ib_write_bw and the other perftest programs"),
              ("qperf", "qperf over rdma_cm"),
              ("libfabric-bin", "libfabric's verbs provider over rdma_cm"),
              ("iperf3", "an unmodified socket program over rsockets (librspreload.so)"),
              ("python3-cffi", "Debian's cffi: a /usr/bin/python3 program keeps its own "
               "under softnic exec"),
              ("python3-numpy", "Debian's numpy, likewise"),
              ("python3-venv", "a venv of /usr/bin/python3, for the tests run as an "
               "ordinary user (tests/test_unprivileged.py)")),
}

#: face -> the faces it stands on
REQUIRES: dict[str, tuple[str, ...]] = {
    "python": (), "c": (), "rdmacm": ("c",), "system-pyverbs": ("c",), "ucx": ("c",),
    "mpi": ("ucx",), "tests": ("python", "c", "rdmacm", "system-pyverbs", "ucx", "mpi"),
}

#: the faces (``all`` names them; ``tests`` is the test suite's own programs on top)
FACES = ("python", "c", "rdmacm", "system-pyverbs", "ucx", "mpi")

#: other names a user may give a face
ALIASES = {"c-libibverbs": "c", "libibverbs": "c", "pyverbs": "system-pyverbs",
           "librdmacm": "rdmacm", "openmpi": "mpi", "middleware": "ucx+mpi"}


def expand(names) -> list[str]:
    """Faces as given (``all``, aliases, ``a,b`` or ``a+b``) -> each face once, in
    FACES order then ``tests``; a ValueError names an unknown one."""
    want: set[str] = set()
    for item in names:
        for name in str(item).replace(",", " ").replace("+", " ").split():
            name = ALIASES.get(name, name)
            if name == "all":
                want.update(FACES)
            elif "+" in name:
                want.update(expand([name]))
            elif name in OWN:
                want.add(name)
            else:
                raise ValueError(f"unknown face {name!r} (faces: {', '.join(FACES)}, "
                                 f"tests, all)")
    return [f for f in (*FACES, "tests") if f in want]


def closure(face: str) -> list[str]:
    """``face`` and every face it stands on, those first."""
    out: list[str] = []
    for dep in REQUIRES[face]:
        for f in closure(dep):
            if f not in out:
                out.append(f)
    out.append(face)
    return out


def packages(faces) -> list[str]:
    """The Debian packages the faces need, each once."""
    out: list[str] = []
    for face in expand(faces):
        for f in closure(face):
            for name, _why in OWN[f]:
                if name not in out:
                    out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        print(" ".join(packages(argv or ["all"])))
    except ValueError as e:
        print(f"packages: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
