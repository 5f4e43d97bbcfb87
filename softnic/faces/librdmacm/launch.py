"""``softnic exec`` loads softnic's librdmacm.so.1 beside its libibverbs.so.1."""

from __future__ import annotations

import os

from .build import BuildError, build

__all__ = ["BuildError", "library_env"]


def library_env(env: dict) -> dict:
    """Builds softnic's librdmacm (if need be) beside its libibverbs; LD_LIBRARY_PATH
    gains its directory only if that is not there already."""
    d = str(build())
    old = env.get("LD_LIBRARY_PATH")
    if old and d in old.split(os.pathsep):
        return {}
    return {"LD_LIBRARY_PATH": d + (os.pathsep + old if old else "")}
