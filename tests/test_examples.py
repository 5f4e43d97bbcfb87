"""The example pyverbs program runs unmodified under `softnic exec`, also over lossy links."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.compat("pyverbs-softnic")
@pytest.mark.parametrize("faults", [None, "loss=0.05", "reorder=0.05/300us,dup=0.01"])
def test_rc_write_pingpong_under_softnic_exec(faults):
    cmd = [sys.executable, "-m", "softnic.cli", "exec"]
    if faults:
        cmd += ["--faults", faults, "--seed", "7"]
    cmd += ["--", sys.executable, str(ROOT / "examples" / "rc_write_pingpong.py")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    # the program itself asserts the 1 MiB WRITE landed byte for byte
    assert "RDMA WRITE 1 MiB: landed" in out
    assert "RDMA READ: b'hello from b'" in out
    assert "SEND_WITH_IMM: b'a message', imm_data 0x12345678" in out
    assert "10 x FETCH_AND_ADD(5) on 100: 150" in out


def test_every_gid_index_rxe_programs_use_is_there():
    prog = ("from pyverbs.device import Context\n"
            "c = Context(name='softnic0')\n"
            "g = [str(c.query_gid(1, i)) for i in range(5)]\n"
            "assert len(set(g[:4])) == 1 and g[0].endswith(':7f00:' + g[0][-4:]), g\n"
            "assert g[4] == '0000:0000:0000:0000:0000:0000:0000:0000', g  # empty, as rxe's\n"
            "print(c.query_port(1).gid_tbl_len)\n")
    r = subprocess.run([sys.executable, "-m", "softnic.cli", "exec", "--", sys.executable, "-c",
                        prog], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1024"          # rxe's table length; 0-3 hold the GID
