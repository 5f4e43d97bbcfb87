"""softnic's modules inside a Python program that is not softnic's own, off its path.

Two faces put softnic's code into a program's interpreter: the pyverbs shim
(``softnic exec`` with softnic's pyverbs) and the C faces when the program is itself
a Python interpreter (Debian's python3 running mpi4py or pyverbs, whose libibverbs.so.1
is softnic's).  Either way the program keeps its ``sys.path``, and so the modules it
would import without softnic: its interpreter's, its venv's, its ``PYTHONPATH``'s.
softnic's code finds its own through two finders on ``sys.meta_path``, and only when
the import comes from softnic's code:

- ``softnic``, ``verbs_api`` and ``congestion`` from softnic's own directory, before
  anything of the program's (a program's own module of one of those names stays its
  own);
- softnic's dependencies (crc32c, isal, ...) from the program's path as usual, and from
  softnic's environment's site directories only where the program has none.  cffi is
  never taken from there: the program's interpreter already holds a ``_cffi_backend``,
  and a second cffi package would not match it.

Which code imports is read from the calling frames: the first frame outside importlib
belongs to softnic when its module is one of softnic's, one a fallback supplied, or one
given as ``trusted`` (the pyverbs shim).  One interpreter has one ``sys.modules``: a
module softnic has loaded is there for the program too, under its name.

Standard library only: loaded by file path under ``NAME``, before softnic is importable
(``embedding.Library.init_code``, the pyverbs shim).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys

#: softnic's top-level packages.
OWN = ("softnic", "verbs_api", "congestion")
#: Bound to the ``_cffi_backend`` the interpreter has loaded: never a second copy.
BOUND = ("cffi", "_cffi_backend", "pycparser")
#: The name this module is loaded under.
NAME = "_softnic_privateimport"


def _top(name: str) -> str:
    return name.partition(".")[0]


class SoftnicFinder(importlib.abc.MetaPathFinder):
    """Finds, for softnic's code only, its own packages (``first``: before the
    program's path) or its dependencies (after the program's path) in ``dirs``."""

    def __init__(self, dirs: list[str], names, trusted: set[str], first: bool):
        self.dirs = list(dirs)
        self.names = names                  # a tuple of names, or None: any but BOUND
        self.trusted = trusted              # top-level names whose imports are softnic's
        self.first = first

    def _wanted(self, name: str) -> bool:
        if self.names is not None:
            return name in self.names
        return name not in BOUND

    def find_spec(self, name, path=None, target=None):
        if path is not None or not self._wanted(name) or not self._from_softnic():
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, self.dirs)
        if spec is not None and not self.first:
            self.trusted.add(name)          # what a dependency imports is softnic's too
        return spec

    def _from_softnic(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            module = frame.f_globals.get("__name__") or ""
            if _top(module) not in ("importlib", "_frozen_importlib",
                                    "_frozen_importlib_external"):
                return _top(module) in self.trusted
            frame = frame.f_back
        return False


def install(root: str, site_dirs: list[str], trusted=()) -> None:
    """Put the two finders on ``sys.meta_path`` (once per interpreter): softnic's
    packages from ``root``, its dependencies from ``site_dirs``; imports from modules
    named in ``trusted`` count as softnic's too."""
    mine = [f for f in sys.meta_path if isinstance(f, SoftnicFinder)]
    for f in mine:                          # installed by the other face: add to them
        f.trusted.update(trusted)
        if not f.first:
            f.dirs += [d for d in site_dirs if d not in f.dirs]
    if mine:
        return
    names = set(OWN) | {NAME} | set(trusted)
    sys.meta_path.insert(0, SoftnicFinder([root], OWN, names, first=True))
    sys.meta_path.append(SoftnicFinder(site_dirs, None, names, first=False))


def import_module(name: str):
    """``importlib.import_module`` from softnic's side (this module is trusted)."""
    return importlib.import_module(name)

