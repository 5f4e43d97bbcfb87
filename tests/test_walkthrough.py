"""docs/walkthrough.md follows a WRITE, a SEND and a READ; a traced run checks it.

For each case the walk names (``write-only``, ``write-long``, ``send-only``, ...)
the doc carries two fenced blocks the tests read:

    ```path write-only          the functions on the path, in the order taken
    ```not-taken write-only     functions the walk says this case does not call

One line each, ``module.qualname`` as Python names them (``softnic.core.
requester.generate``, ``softnic.driver.nic.NIC._flush``); ``a | b`` where either
is the path (the compiled kernel present or not, a run or a stream of packets);
``#`` starts a comment.  The test posts the case's work request on one of two
live NICs over UDP on loopback (``softnic.driver.nic.NIC``, each with its
progress thread) and records, with ``sys.setprofile`` and
``threading.setprofile``, every call of a Python function under ``softnic/``
from the post to the completions, in every thread.  The path must be a
subsequence of that record, and no not-taken function may be in it: a walk that
names a step the run does not take, or in another order, fails here.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
from pathlib import Path

import pytest

from softnic.core.enums import SendFlags, WCOpcode, WCStatus, WROpcode as W
from softnic.core.qp import RecvWR, SendWR
from softnic.driver.config import DeviceSpec, RuntimeConfig
from softnic.driver.nic import NIC
from softnic.experiments.rig import bring_up, endpoint

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "walkthrough.md"
PACKAGE = str(ROOT / "softnic") + os.sep
BLOCK = re.compile(r"^```(path|not-taken) ([\w-]+)\n(.*?)^```", re.M | re.S)
PAIR = re.compile(r"`((?:softnic/|verbs_api/)?[\w/]+)\.py`\s+`([A-Za-z_][\w.]*)`")
#: the walk's cases: work request, bytes, path MTU (a long message is 16 packets)
CASES = {
    "write-only": (W.RDMA_WRITE, 8), "write-long": (W.RDMA_WRITE, 16 << 10),
    "send-only": (W.SEND, 8), "send-long": (W.SEND, 16 << 10),
    "read-only": (W.RDMA_READ, 8), "read-long": (W.RDMA_READ, 16 << 10),
}
MTU = 1024


def blocks(text: str) -> dict[tuple[str, str], list[tuple[str, ...]]]:
    """(kind, case) -> its lines, each a tuple of alternatives."""
    found = {}
    for kind, case, body in BLOCK.findall(text):
        steps = []
        for line in body.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                steps.append(tuple(a.strip() for a in line.split("|")))
        found[(kind, case)] = steps
    return found


def first_missing(path: list[tuple[str, ...]], calls: list[str]) -> int | None:
    """The index of the first step of ``path`` not found, in order, in ``calls``
    (a subsequence match, each step taking the earliest call after the last);
    None if every step is there."""
    at = 0
    for i, alternatives in enumerate(path):
        hits = [calls.index(a, at) for a in alternatives if a in calls[at:]]
        if not hits:
            return i
        at = min(hits) + 1
    return None


def _resolve(name: str) -> bool:
    """Whether ``module.qualname`` names a function or method that exists."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part, None)
            if obj is None:
                return False
        return callable(obj)
    return False


def trace(case: str) -> list[str]:
    """Run ``case`` over two live NICs; every softnic function called from the post
    to the completions, as ``module.qualname``, in the order called."""
    opcode, size = CASES[case]
    calls: list[str] = []
    on = [False]

    def profile(frame, event, arg):
        if event == "call" and on[0]:
            code = frame.f_code
            if code.co_filename.startswith(PACKAGE):
                calls.append(f"{frame.f_globals.get('__name__')}.{code.co_qualname}")

    # each NIC's progress thread must start with the profiler in place
    threading.setprofile(profile)
    sys.setprofile(profile)
    cfg = RuntimeConfig(seed=11)
    a = b = None
    try:
        a = NIC(DeviceSpec("walk0", "127.44.0.2", 0), cfg)
        b = NIC(DeviceSpec("walk1", "127.44.0.3", 0), cfg)
        with a.lock, b.lock:
            ea, eb = endpoint(a.dev, buf_size=1 << 20), endpoint(b.dev, buf_size=1 << 20)
            # a retransmission timeout of 4.096 us * 2**20 (4.3 s): nothing is resent
            bring_up(ea, eb, mtu=MTU, timeout=20)
            bring_up(eb, ea, mtu=MTU, timeout=20)
        ea.buf.view[:size] = os.urandom(size)
        eb.buf.view[:size] = os.urandom(size)
        if opcode == W.SEND:
            b.call(b.dev.post_recv, eb.qp, RecvWR(7, [eb.sge(1 << 19, size)]))
            wr = SendWR(1, opcode, [ea.sge(0, size)], SendFlags.SIGNALED)
        else:
            wr = SendWR(1, opcode, [ea.sge(0, size)], SendFlags.SIGNALED,
                        remote_addr=eb.buf.addr, rkey=eb.mr.rkey)
        on[0] = True
        a.call(a.dev.post_send, ea.qp, wr)
        got: list = []
        assert a.wait_until(lambda: got.extend(a.dev.poll_cq(ea.send_cq, 4)) or got, 30)
        if opcode == W.SEND:
            rcv: list = []
            assert b.wait_until(lambda: rcv.extend(b.dev.poll_cq(eb.recv_cq, 4)) or rcv, 30)
        on[0] = False
        assert [w.status for w in got] == [WCStatus.SUCCESS]
        if opcode == W.RDMA_READ:
            assert bytes(ea.buf.view[:size]) == bytes(eb.buf.view[:size])
        elif opcode == W.SEND:
            assert rcv[0].opcode == WCOpcode.RECV and rcv[0].byte_len == size
            assert bytes(eb.buf.view[1 << 19:(1 << 19) + size]) == bytes(ea.buf.view[:size])
        else:
            assert bytes(eb.buf.view[:size]) == bytes(ea.buf.view[:size])
        # the walk is the run without loss or resends
        assert a.counters.get("retransmitted_pkts", 0) == 0
        assert b.counters.get("duplicate_request", 0) == 0
    finally:
        on[0] = False
        sys.setprofile(None)
        threading.setprofile(None)
        for nic in (a, b):
            if nic is not None:
                nic.close()
    return calls


def test_the_doc_has_a_path_for_each_case_and_names_functions_that_exist():
    found = blocks(DOC.read_text())
    assert {case for kind, case in found if kind == "path"} == set(CASES)
    for (kind, case), steps in found.items():
        assert case in CASES, f"```{kind} {case}: no such case"
        assert kind == "not-taken" or len(steps) >= 12, f"{case}: too short a path"
        for alternatives in steps:
            for name in alternatives:
                assert name.startswith("softnic."), name
                assert _resolve(name), f"```{kind} {case}: {name} does not exist"


def test_the_subsequence_match():
    calls = ["a", "b", "x", "c", "b", "d"]
    assert first_missing([("a",), ("b",), ("d",)], calls) is None
    assert first_missing([("a",), ("c",), ("b",), ("d",)], calls) is None
    assert first_missing([("c",), ("a",)], calls) == 1          # order counts
    assert first_missing([("a",), ("q", "x"), ("d",)], calls) is None
    assert first_missing([("a",), ("q",)], calls) == 1
    assert first_missing([("d",), ("b",)], calls) == 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_run_takes_the_path_the_walk_names(case):
    found = blocks(DOC.read_text())
    path = found[("path", case)]
    absent = [name for step in found.get(("not-taken", case), []) for name in step]
    calls = trace(case)
    assert calls, "nothing traced"
    i = first_missing(path, calls)
    if i is not None:
        done = [" | ".join(s) for s in path[:i]]
        pytest.fail(f"{case}: step {i + 1} of the walk, {' | '.join(path[i])}, is not "
                    f"taken after {done[-1] if done else 'the post'}; the run called, in "
                    f"order (first calls of each):\n  "
                    + "\n  ".join(dict.fromkeys(calls)))
    called = sorted(set(absent) & set(calls))
    assert not called, f"{case}: the walk says these are not taken, the run called them: " \
        f"{called}"


def test_every_file_and_function_the_rule_table_names_exists():
    """The table of where each rule lives names "`path.py` `Name`" pairs."""
    pairs = PAIR.findall(DOC.read_text())
    assert len(pairs) >= 30, "the walk names fewer functions than it should"
    missing = []
    for path, name in pairs:
        if path.startswith(("core/", "wire/", "transport/", "accel/", "driver/")):
            path = "softnic/" + path
        obj = importlib.import_module(path.replace("/", "."))
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                missing.append(f"{path}.py {name}")
                break
    assert not missing, missing


def test_the_kernel_functions_the_walk_names_exist():
    text = DOC.read_text()
    kernel = "".join((ROOT / "softnic" / "accel" / f).read_text()
                     for f in ("kernel.c", "rx.c", "send.c", "requester.c", "responder.c",
                               "completer.c"))
    names = set(re.findall(r"`(sn_\w+)`", text))
    assert names >= {"sn_tx_middles", "sn_rx_middles"}
    for name in names:
        assert re.search(rf"\b{name}\(", kernel), name
