"""``pyverbs`` for programs run under ``softnic exec``.

This directory is put first on PYTHONPATH only for the program that
``softnic exec`` starts, so ``import pyverbs`` there gives softnic's
implementation while the machine's own pyverbs (if any) stays untouched for
everything else.  Each ``pyverbs.X`` module is softnic's ``verbs_api.X``.
"""

import importlib
import sys

_MODULES = ("device", "pd", "mr", "cq", "qp", "wr", "addr", "srq", "base", "mem_alloc", "utils",
            "pyverbs_error", "enums", "libibverbs_enums", "cmid", "cm_enums")

for _name in _MODULES:
    try:
        _mod = importlib.import_module(f"verbs_api.{_name}")
    except ModuleNotFoundError as _e:       # a module softnic does not provide yet
        if _e.name != f"verbs_api.{_name}":
            raise
        continue
    sys.modules[f"{__name__}.{_name}"] = _mod
    globals()[_name] = _mod

SOFTNIC = True
