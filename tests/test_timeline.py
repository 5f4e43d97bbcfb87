"""SOFTNIC_TIMELINE (softnic/driver/timeline.py): a live device records its steps,
posts and flushes, and a C face's calls into Python are recorded whole; each device
writes its file when it closes, and ``softnic timeline`` sums and merges them.
Unset, nothing is wrapped."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from softnic.cli.main import main
from softnic.core.enums import SendFlags, WROpcode as W
from softnic.core.qp import RecvWR, SendWR
from softnic.driver import timeline
from softnic.driver.config import DeviceSpec, RuntimeConfig
from softnic.driver.nic import NIC
from softnic.driver.timeline import Event, read, summary, window
from softnic.experiments.rig import bring_up, endpoint


def _pair():
    cfg = RuntimeConfig(min_timer=2e-3)
    a, b = (NIC(DeviceSpec(f"t{i}", None, 0), cfg) for i in range(2))
    with a.lock, b.lock:
        ea, eb = endpoint(a.dev, buf_size=1 << 16), endpoint(b.dev, buf_size=1 << 16)
        bring_up(ea, eb, mtu=1024)
        bring_up(eb, ea, mtu=1024)
    return a, b, ea, eb


def test_a_send_is_recorded_on_both_sides_and_summed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(timeline, "DIR", str(tmp_path))
    a, b, ea, eb = _pair()
    try:
        b.call(b.dev.post_recv, eb.qp, RecvWR(7, [eb.sge(0, 4096)]))
        a.post(ea.qp.qpn, a.dev.post_send, ea.qp,
               SendWR(1, W.SEND, [ea.sge(0, 3000)], SendFlags.SIGNALED))
        got = []
        end = time.monotonic() + 10
        while not got:                     # b polls: its inline steps take the SEND
            assert time.monotonic() < end
            b.poll()
            with b.lock:
                got = b.dev.poll_cq(eb.recv_cq, 4)
        assert got[0].wr_id == 7 and got[0].byte_len == 3000
        done = []
        while not done:                    # a polls: its inline steps take the ACK
            assert time.monotonic() < end
            a.poll()
            with a.lock:
                done = a.dev.poll_cq(ea.send_cq, 4)
        assert done[0].wr_id == 1
    finally:
        a.close()
        b.close()
    by_pid = read([tmp_path])
    (events,) = by_pid.values()            # one process: both devices' files
    assert all(e.start <= e.end and e.tid > 0 for e in events)
    kinds = {(e.kind, e.fields[0]) for e in events if e.kind in ("post", "build", "send")}
    assert ("post", "0") in kinds          # the post's output left at once (nothing outstanding)
    assert ("build", "1") in kinds         # one item: the SEND's three packets as one run
    steps = [e for e in events if e.kind == "step"]
    # the SEND's three packets and its ACK, received by steps (of a program's
    # polls or of a device's thread)
    assert sum(int(e.fields[1]) for e in steps) >= 4
    # the progress threads' sleeps, each with why it ended (at the latest, the close)
    sleeps = [e for e in events if e.kind == "sleep"]
    assert {e.tid for e in sleeps} and threading.get_native_id() not in {e.tid for e in sleeps}
    assert all(e.fields[0] in ("0", "1", "2", "3", "4") for e in sleeps)
    names = sorted(p.name.split("-", 1)[1] for p in tmp_path.iterdir())
    assert names == ["t0.timeline", "t1.timeline"]
    assert main(["timeline", str(tmp_path), "--window", "4"]) == 0
    out = capsys.readouterr().out
    assert "post, sent" in out and "build" in out and "4 events from 50%" in out


def test_unset_nothing_is_wrapped(monkeypatch):
    monkeypatch.setattr(timeline, "DIR", None)
    a, b, _, _ = _pair()
    try:
        for nic in (a, b):
            assert nic._timeline is None
            assert "_step" not in vars(nic) and "post" not in vars(nic)
            assert "datagram_runs" not in vars(nic.dev) and "send" not in vars(nic.sock)
    finally:
        a.close()
        b.close()

    def sn_x():
        return 3
    assert timeline.guard_call(sn_x) is sn_x


def test_a_call_is_recorded_whole_and_written_when_a_device_closes(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline, "DIR", str(tmp_path))
    monkeypatch.setattr(timeline, "_calls", None)

    def sn_poll_cq(x):
        time.sleep(0.002)
        if x < 0:
            raise ValueError("refused")
        return x

    call = timeline.guard_call(sn_poll_cq)
    assert call.__name__ == "sn_poll_cq"
    assert call(5) == 5
    with pytest.raises(ValueError):
        call(-1)                           # recorded all the same
    timeline.flush_calls()
    (events,) = read([tmp_path]).values()
    assert [(e.kind, e.fields) for e in events] == [("call", ("sn_poll_cq",))] * 2
    assert all(e.end - e.start >= 2_000_000 for e in events)


def test_summary_and_window_arithmetic():
    ev = [Event("call", 0, 10_000, 1, ("sn_poll_cq",)),
          Event("step", 2_000, 8_000, 1, ("1", "3", "0", "1")),
          Event("call", 20_000, 40_000, 1, ("sn_poll_cq",)),
          Event("step", 50_000, 60_000, 2, ("0", "1", "1", "0")),
          Event("post", 90_000, 100_000, 1, ("1",)),
          Event("sleep", 60_000, 90_000, 2, ("3",))]
    rows = {r.what: r for r in summary(ev)}
    assert rows["call sn_poll_cq"].count == 2
    assert rows["call sn_poll_cq"].mean_us == pytest.approx(15.0)
    assert rows["call sn_poll_cq"].total_ms == pytest.approx(0.03)
    assert rows["call sn_poll_cq"].share == pytest.approx(0.3)     # of a 100 us span
    assert rows["step, inline"].count == 1 and rows["step, progress thread"].count == 1
    assert rows["post, held"].mean_us == pytest.approx(10.0)
    assert rows["sleep, woken by held output"].total_ms == pytest.approx(0.03)
    assert [r.what for r in summary(ev)][0] == "call sn_poll_cq"   # most time first
    lines = window({42: ev}, at=0.4, count=2)
    assert len(lines) == 2
    assert lines[0].split()[:5] == ["0.0", "20.0", "42", "1", "call"]
    assert lines[1].split()[:2] == ["30.0", "10.0"]


def test_the_command_stops_quietly_when_its_reader_does(tmp_path):
    """``softnic timeline DIR --window N | head``: no traceback when the pipe closes."""
    with open(tmp_path / "1-softnic0.timeline", "w") as f:
        for i in range(20000):
            f.write(f"step {i * 1000} {i * 1000 + 500} 1 1 1 0 0\n")
    p = subprocess.Popen([sys.executable, "-m", "softnic.cli", "timeline", str(tmp_path),
                          "--window", "20000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()                        # the reader goes (as head does)
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 1
    assert "Traceback" not in err and "BrokenPipe" not in err, err
