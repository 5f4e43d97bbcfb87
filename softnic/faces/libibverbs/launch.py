"""Running unmodified C verbs programs on softnic: ``softnic exec`` and
``softnic build-libibverbs`` use these."""

from __future__ import annotations

import os
import shutil

from .build import PRELOAD, SONAME, BuildError, build

__all__ = ["BuildError", "links_library", "links_libibverbs", "library_env",
           "add_build_parser", "run_build"]


def links_library(program: str, soname: str = SONAME) -> bool:
    """Is ``program`` (a path or a name on PATH) an ELF binary that loads ``soname``
    (libibverbs.so.1 by default)?"""
    path = program if os.sep in program else shutil.which(program)
    if not path or not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return False
            return soname.encode() in f.read(64 << 20)
    except OSError:
        return False


def links_libibverbs(program: str) -> bool:
    return links_library(program)


def _prepend(value: str, old: str | None, sep: str) -> str:
    parts = [p for p in (old or "").split(sep) if p and p != value]
    return sep.join([value] + parts)


def library_env(env: dict) -> dict:
    """The variables that make every program of a process tree load softnic's
    libibverbs (built if need be): its directory first on ``LD_LIBRARY_PATH`` (found by
    the loader however the library is loaded: linked, or dlopen'ed by a plugin such as
    UCX's libuct_ib), and ``libsoftnic_preload.so`` in ``LD_PRELOAD`` (makes
    /dev/infiniband/uverbsN look usable to UCX, and answers for the devices under
    /sys/class/infiniband from ``SOFTNIC_SYSFS``; see preload.c).  Children inherit
    them (mpirun's daemons and ranks, a Python program's C libraries)."""
    d = build()
    out = {"LD_LIBRARY_PATH": _prepend(str(d), env.get("LD_LIBRARY_PATH"), os.pathsep),
           "LD_PRELOAD": _prepend(str(d / PRELOAD), env.get("LD_PRELOAD"), " ")}
    # the devices' sysfs entries, which the preload answers for (sysfs.py)
    from softnic.driver import config
    from softnic.driver.hostfiles import prune
    from .sysfs import ENV, tools, tree
    try:
        out[ENV] = str(tree(config.load(env)))
        prune()             # trees and counters exited programs left (at times)
        # and `rdma link`, which asks the kernel (sysfs.RDMA_TOOL)
        out["PATH"] = _prepend(str(tools()), env.get("PATH", os.defpath), os.pathsep)
    except (ValueError, OSError):
        pass                # a bad configuration fails in the program, as without exec
    return out


def add_build_parser(sub) -> None:
    from .build import add_arguments
    p = sub.add_parser("build-libibverbs", help="build the drop-in libibverbs.so.1 that runs "
                       "C verbs programs on softnic (softnic exec uses it)")
    add_arguments(p)


def add_build_librdmacm_parser(sub) -> None:
    from ..librdmacm.build import add_arguments
    p = sub.add_parser("build-librdmacm", help="build the drop-in librdmacm.so.1 that runs "
                       "rdma_cm programs on softnic (softnic exec uses it)")
    add_arguments(p)


def run_build(args) -> int:
    if args.cmd == "build-librdmacm":
        from ..librdmacm.build import run
        return run(args)
    from .build import run
    return run(args)
