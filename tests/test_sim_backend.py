"""SOFTNIC_BACKEND=sim: unmodified pyverbs programs in the deterministic simulated fabric."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

REPORT = ("\nimport json, softnic.driver.nic as n\nw = n.sim_world().fabric\n"
          "print(json.dumps(dict(now=w.now, counters=w.counters)))\n")


def _run(faults: str, seed: int) -> tuple[str, dict]:
    prog = (ROOT / "examples" / "rc_write_pingpong.py").read_text() + REPORT
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTNIC_")}
    env.update(SOFTNIC_BACKEND="sim", SOFTNIC_FAULTS=faults, SOFTNIC_SEED=str(seed))
    r = subprocess.run([sys.executable, "-m", "softnic.cli", "exec", "--", sys.executable, "-c",
                        prog], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().split("\n")
    return "\n".join(lines[:-1]), json.loads(lines[-1])


def test_pyverbs_program_in_the_simulated_fabric_is_reproducible():
    out1, w1 = _run("loss=0.03,dup=0.01", 5)
    out2, w2 = _run("loss=0.03,dup=0.01", 5)
    assert "10 x FETCH_AND_ADD(5) on 100: 150" in out1
    assert w1["counters"]["dropped_loss"] > 0 and w1["counters"]["duplicated"] > 0
    assert w1 == w2                         # same seed: same virtual time, same packet counts
    _, w3 = _run("loss=0.03,dup=0.01", 6)
    assert w3 != w1
