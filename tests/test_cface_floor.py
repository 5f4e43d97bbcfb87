"""tools/cface_floor.c, the C floor of a message's work that the C face's cost per
message (tools/cface_loop.py) is measured against: it must put softnic's packets
on the wire (decoded by softnic.wire, ICRCs checked), or it measures other work."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from softnic.wire.icrc import check_icrc
from softnic.wire.roce import AethCode, Opcode, decode

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
SEG = 12 + 4096 + 4            # a FIRST's or MIDDLE's datagram at MTU 4096


@pytest.fixture(scope="module")
def floor(tmp_path_factory) -> str:
    if shutil.which("gcc") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("needs gcc (.ci/run's machine has it)")
        pytest.skip("needs gcc")
    exe = tmp_path_factory.mktemp("floor") / "cface_floor"
    r = subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(exe),
                        str(ROOT / "tools" / "cface_floor.c"), "-ldl"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return str(exe)


def _run(floor: str, tmp_path: Path, op: str, size: int):
    """The first message's datagram (or GSO run) and its ACK, and A's and B's ports."""
    dump = tmp_path / f"{op}.bin"
    r = subprocess.run([floor, op, str(size), "20", "1"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, FLOOR_DUMP=str(dump)))
    assert r.returncode == 0, r.stderr
    assert re.search(rf"floor {op} {size}: 20 messages, cpu_us [\d.]+ wall_us [\d.]+", r.stdout)
    m = re.search(r"ports (\d+) -> (\d+)", r.stderr)
    assert m, r.stderr
    return dump.read_bytes(), Path(f"{dump}.ack").read_bytes(), int(m[1]), int(m[2])


def _ack_of(ack: bytes, a: int, b: int, psn: int) -> None:
    assert check_icrc(ack, LOOPBACK, LOOPBACK, b, a)
    p = decode(ack[:-4])
    assert p.bth.opcode == Opcode.RC_ACKNOWLEDGE and p.bth.psn == psn
    assert p.aeth.code == AethCode.ACK and p.aeth.msn == 1


def test_an_eager_send_is_softnics_first_middle_and_last(floor, tmp_path):
    run, ack, a, b = _run(floor, tmp_path, "send", 8256)
    grams = [run[o:o + SEG] for o in range(0, len(run), SEG)]
    assert [len(g) for g in grams] == [SEG, SEG, 12 + 64 + 4]
    packets = []
    for g in grams:
        assert check_icrc(g, LOOPBACK, LOOPBACK, a, b)
        assert not check_icrc(g[:20] + bytes([g[20] ^ 1]) + g[21:], LOOPBACK, LOOPBACK, a, b)
        packets.append(decode(g[:-4]))
    assert [p.bth.opcode for p in packets] == [Opcode.RC_SEND_FIRST, Opcode.RC_SEND_MIDDLE,
                                               Opcode.RC_SEND_LAST]
    psn = packets[0].bth.psn
    assert [p.bth.psn for p in packets] == [psn, psn + 1, psn + 2]
    assert [p.bth.ackreq for p in packets] == [False, False, True]
    assert [len(p.payload) for p in packets] == [4096, 4096, 64]
    _ack_of(ack, a, b, psn + 2)


def test_a_small_write_is_softnics_write_only(floor, tmp_path):
    run, ack, a, b = _run(floor, tmp_path, "write", 8)
    assert check_icrc(run, LOOPBACK, LOOPBACK, a, b)
    p = decode(run[:-4])
    assert p.bth.opcode == Opcode.RC_RDMA_WRITE_ONLY and p.bth.ackreq
    assert p.reth.dma_len == 8 and len(p.payload) == 8
    _ack_of(ack, a, b, p.bth.psn)
