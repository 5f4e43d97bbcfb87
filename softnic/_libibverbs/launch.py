"""Running unmodified C verbs programs on softnic: ``softnic exec`` and
``softnic build-libibverbs`` use these."""

from __future__ import annotations

import os
import shutil

from .build import SONAME, BuildError, build

__all__ = ["BuildError", "links_libibverbs", "library_env", "add_build_parser", "run_build"]


def links_libibverbs(program: str) -> bool:
    """Is ``program`` (a path or a name on PATH) an ELF binary that loads libibverbs?"""
    path = program if os.sep in program else shutil.which(program)
    if not path or not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return False
            return SONAME.encode() in f.read(64 << 20)
    except OSError:
        return False


def library_env(env: dict) -> dict:
    """The variables that make a program load softnic's libibverbs (built if need be)."""
    d = str(build())
    old = env.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": d + (os.pathsep + old if old else "")}


def add_build_parser(sub) -> None:
    from .build import add_arguments
    p = sub.add_parser("build-libibverbs", help="build the drop-in libibverbs.so.1 that runs "
                       "C verbs programs on softnic (softnic exec uses it)")
    add_arguments(p)


def run_build(args) -> int:
    from .build import run
    return run(args)
