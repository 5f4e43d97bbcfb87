"""The torch.distributed backend ``softnic``: its collectives on CPU tensors, and DDP
training whose loss equals gloo's step for step (2 ranks through ``softnic launch``).

Needs the ``torch`` extra (``pip install -e '.[torch]'``, torch==2.13.0, CPU build).
Without torch these tests skip locally; under CI=true a missing torch fails them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import verbs_api.enums as e

HERE = Path(__file__).resolve().parent
STEPS = 6


def need_torch():
    if importlib.util.find_spec("torch") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("torch is required in CI (.ci/run installs torch==2.13.0 into .venv)")
        pytest.skip("torch not installed (pip install -e '.[torch]')")


@pytest.mark.compat("torch")
def test_softnic_backend_collectives_and_ddp_loss_equal_to_gloo(tmp_path):
    need_torch()
    out = tmp_path / "torch.json"
    cmd = [sys.executable, "-m", "softnic.cli", "launch", "-n", "2", "--timeout", "60",
           str(HERE / "torch_worker.py"), str(out), str(STEPS)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["world"] == 2
    assert len(doc["checked"]) >= 20
    softnic, gloo = doc["runs"]["softnic"], doc["runs"]["gloo"]
    assert softnic["identical"] and gloo["identical"]
    assert len(softnic["losses"]) == STEPS
    # two ranks: a sum of two gradients is the same bits in any order, so the losses
    # (rank 0's own and the mean over ranks) must be equal exactly, step for step
    assert softnic["losses"] == gloo["losses"]
    assert softnic["params"] == gloo["params"]
    # and the model trained: the losses are not all the same
    assert len({round(l, 6) for l, _ in softnic["losses"]}) == STEPS


def test_a_rank_that_dies_fails_the_waiting_work_with_a_clear_error():
    need_torch()
    cmd = [sys.executable, "-m", "softnic.cli", "launch", "-n", "2", "--timeout", "30",
           str(HERE / "torch_worker.py"), "--die"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert "rank 1 exited with status 3" in res.stderr, res.stderr[-3000:]
    m = re.search(r"rank 0 failed after ([\d.]+) s: (\w+): (.*)", res.stdout)
    assert m, res.stdout + res.stderr[-3000:]
    # well within the 30 s timeout, whichever of two detectors sees it first: the
    # store's (rank 1's heartbeat stood still for DEAD_AFTER) or the QP's (its
    # retries ran out: a completion with IBV_WC_RETRY_EXC_ERR, 12); both name rank 1
    assert float(m.group(1)) < 20
    msg = m.group(3)
    assert m.group(2) == "CollectiveError" and (
        "rank(s) [1] left the job" in msg
        or f"work completion with status {e.IBV_WC_RETRY_EXC_ERR} on the connection to "
           "rank 1" in msg), m.group(0)
    assert "softnic backend: an earlier collective failed" in res.stdout
