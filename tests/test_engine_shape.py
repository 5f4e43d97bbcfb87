"""The engine's files stay readable: no function in softnic/core, softnic/wire or
softnic/accel over 80 lines without a written reason (tools/long_functions.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_engine_function_over_80_lines_without_a_reason():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "long_functions.py"), "--all",
                        "softnic/core", "softnic/wire", "softnic/accel"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 functions over 80 lines" in r.stdout
