"""docs/walkthrough.md names files and functions: they must exist.

Every "`path.py` `Name`" (or "`path.py` `Class.method`") pair the walk names is
looked up in that module, and every ``sn_*`` function it names in kernel.c, so
a rename that leaves the walk behind fails here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "walkthrough.md"
PAIR = re.compile(r"`((?:softnic/|verbs_api/)?[\w/]+)\.py`\s+`([A-Za-z_][\w.]*)`")


def _module(path: str) -> str:
    if path.startswith(("core/", "wire/", "transport/", "accel/")):
        path = "softnic/" + path
    return path.replace("/", ".")


def test_every_function_the_walk_names_exists():
    text = DOC.read_text()
    pairs = PAIR.findall(text)
    assert len(pairs) >= 30, "the walk names fewer functions than it should"
    missing = []
    for path, name in pairs:
        obj = importlib.import_module(_module(path))
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                missing.append(f"{path}.py {name}")
                break
    assert not missing, missing


def test_the_kernel_functions_the_walk_names_exist():
    text = DOC.read_text()
    kernel = (ROOT / "softnic" / "accel" / "kernel.c").read_text()
    names = set(re.findall(r"`(sn_\w+)`", text))
    assert names >= {"sn_tx_middles", "sn_rx_middles"}
    for name in names:
        assert re.search(rf"\b{name}\(", kernel), name
