"""``pyverbs`` for programs run under ``softnic exec``.

This directory (and nothing else of softnic's) is put first on PYTHONPATH only
for the program that ``softnic exec`` starts, so ``import pyverbs`` there gives
softnic's implementation while the machine's own pyverbs (if any) stays untouched
for everything else.  Each ``pyverbs.X`` module (``pyverbs.providers.mlx5.mlx5dv``
too) is softnic's ``verbs_api.X``: the same module object under both names.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

# softnic's own packages, found for softnic's code (and this shim's) without putting
# softnic's directory on the program's path (softnic/faces/privateimport.py)
_ROOT = Path(__file__).resolve().parents[4]
_pi = sys.modules.get("_softnic_privateimport")
if _pi is None:
    _spec = importlib.util.spec_from_file_location(
        "_softnic_privateimport", _ROOT / "softnic" / "faces" / "privateimport.py")
    _pi = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_pi)
_pi.install(str(_ROOT), [], trusted=(__name__,))

_MODULES = ("device", "pd", "mr", "cq", "qp", "wr", "addr", "srq", "base", "mem_alloc", "utils",
            "pyverbs_error", "enums", "libibverbs_enums", "cmid", "cm_enums")


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``pyverbs.X`` as ``verbs_api.X``."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        real = "verbs_api" + fullname[len(__name__):]
        try:
            if importlib.util.find_spec(real) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module("verbs_api" + spec.name[len(__name__):])
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # the import system has just set the alias's spec on the module: give it its own
        # back, so its relative imports resolve in verbs_api (and warn of no mismatch)
        module.__spec__ = self._specs.pop(module.__spec__.name)

    _specs: dict = {}


sys.meta_path.insert(0, _Alias())

for _name in _MODULES:
    globals()[_name] = importlib.import_module(f"{__name__}.{_name}")

SOFTNIC = True
