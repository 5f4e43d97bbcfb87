"""``softnic exec`` loads softnic's librdmacm.so.1 beside its libibverbs.so.1."""

from __future__ import annotations

import os

from .build import BuildError, build

__all__ = ["BuildError", "library_env"]


def library_env(env: dict) -> dict:
    """LD_LIBRARY_PATH with softnic's librdmacm first (built if need be)."""
    d = str(build())
    old = env.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": d + (os.pathsep + old if old else "")}
