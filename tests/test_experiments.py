"""softnic experiment: incast and loss runs in virtual time (small, fast versions)."""

from __future__ import annotations

import json

import pytest

from softnic.experiments import bottleneck as ex
from softnic.cli import main


def test_jain_and_percentile():
    assert ex.jain([1, 1, 1, 1]) == pytest.approx(1.0)
    assert ex.jain([1, 0, 0, 0]) == pytest.approx(0.25)
    assert ex.jain([3, 1]) == pytest.approx(16 / 20)
    assert ex.percentile([5, 1, 3], 50) == 3
    assert ex.percentile(list(range(101)), 99) == pytest.approx(99)


def test_convergence_time_needs_the_band_held():
    times = [i * 1e-4 for i in range(1, 101)]
    fair = 2.0
    tput = [10.0] * 30 + [2.1] * 5 + [6.0] * 5 + [1.9] * 60     # in band at 3.0 ms, left, back
    t = ex.convergence_time(times, tput, 0.0, fair, smooth=1, hold=1e-3)
    assert t == pytest.approx(times[40])
    assert ex.convergence_time(times, [10.0] * 100, 0.0, fair, smooth=1) is None


SMALL = ["--senders", "4", "--duration", "4ms", "--buffer", "256KB", "--mtu", "4096",
         "--no-progress"]


def test_incast_without_control_overflows_and_dcqcn_marks(tmp_path):
    out = tmp_path / "res"
    assert main(["experiment", "incast", "--cc", "none+dcqcn", "--out", str(out)] + SMALL) == 0
    none = json.loads((out / "incast-none.json").read_text())["summary"]
    dcqcn = json.loads((out / "incast-dcqcn.json").read_text())["summary"]
    assert (out / "incast-none.png").stat().st_size > 10_000
    assert (out / "incast-dcqcn.png").read_bytes()[:4] == b"\x89PNG"
    # no controller: the 256 KB buffer overflows, packets drop and are resent
    assert none["switch_drops"] > 0 and none["retransmitted_pkts"] > 0
    assert none["ecn_marked"] == 0 and none["cnps_sent"] == 0
    assert none["queue_steady_p50_kb"] > 200
    # DCQCN: the switch marks, the receiver sends CNPs; fewer drops, a short queue
    # at steady state, and the four flows share fairly
    assert dcqcn["ecn_marked"] > 0 and dcqcn["cnps_sent"] > 0
    assert dcqcn["switch_drops"] < none["switch_drops"] / 2
    assert dcqcn["queue_steady_p50_kb"] < 20
    assert dcqcn["jain_steady"] > max(0.9, none["jain_steady"])
    for s in (none, dcqcn):
        assert s["senders"] == 4 and s["wc_errors"] == 0
        assert 0 < s["goodput_fraction"] <= 1.0
        assert 0.25 <= s["jain_steady"] <= 1.0


def test_incast_late_flow_is_reported(tmp_path):
    res = ex.incast(ex.IncastConfig(cc="swift", senders=2, duration=2e-3, late_join=1e-3,
                                    mtu=4096, bin=20e-6))
    flows = res["flows"]
    assert len(flows) == 3 and flows[-1]["start"] == 1e-3
    t = [x for x, g in zip(res["times"], flows[-1]["goodput_gbps"]) if g > 0]
    assert t and t[0] > 1e-3                     # it sent nothing before it joined
    assert "late_flow_converged_after_s" in res["summary"]


def test_bad_controller_is_a_clear_error(tmp_path, capsys):
    assert main(["experiment", "incast", "--cc", "nosuch", "--out", str(tmp_path)] + SMALL) == 2
    assert "unknown congestion controller 'nosuch'" in capsys.readouterr().err


def test_loss_total_below_one_message_is_a_clear_error(tmp_path, capsys):
    assert main(["experiment", "loss", "--total", "64KiB", "--msg", "1MiB",
                 "--out", str(tmp_path), "--no-progress"]) == 2
    assert "--total (65536 B) must be at least --msg (1048576 B)" in capsys.readouterr().err
    goodput_under_loss = ex.goodput_under_loss
    with pytest.raises(ValueError, match="at least one message"):
        goodput_under_loss(0.0, False, total=1000, msg=4096)


def test_loss_selective_repeat_beats_go_back_n(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["experiment", "loss", "--losses", "0,0.05", "--total", "2MiB",
                 "--msg", "512KiB", "--out", str(out), "--no-progress"]) == 0
    rows = json.loads((out / "loss.json").read_text())
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    by = {(r["mode"], r["loss"]): r for r in rows}
    assert all(r["ok"] for r in rows)
    assert by[("go-back-N", 0.0)]["vs_lossless"] == 1.0
    gbn, sr = by[("go-back-N", 0.05)], by[("selective repeat", 0.05)]
    assert sr["goodput_gbps"] > gbn["goodput_gbps"]
    assert sr["retransmitted_pkts"] < gbn["retransmitted_pkts"]
    printed = capsys.readouterr().out
    assert "| selective repeat | 5.0% |" in printed


@pytest.mark.parametrize("rate_gbps,mtu", [(25, 4096), (100, 1024)])
def test_incast_gives_controllers_the_fabric_base_rtt(monkeypatch, rate_gbps, mtu):
    """T, the base RTT every controller is given (HPCC's W_init = B T and its
    queue term's B T), is the path's own round trip with empty queues: a lone
    flow's smallest RTT sample.  It counts a full packet's serialisation at both
    hops (sender NIC and switch), as HPCC's ns-3 maxRtt does (2 x propagation +
    payload x 8 / B per hop), plus the ACK's; at MTU 4096 and 25 Gbit/s that
    serialisation is 2.6 of the 6.7 us, so a T of propagation alone would be far
    off."""
    import congestion

    seen, bases = [], []

    class Probe(congestion.HPCC):
        def __init__(self, flow, **params):
            bases.append(flow.base_rtt)
            super().__init__(flow, **params)

        def on_ack(self, *, now, acked_bytes, rtt, telemetry):
            if rtt is not None:
                seen.append(rtt)
            super().on_ack(now=now, acked_bytes=acked_bytes, rtt=rtt, telemetry=telemetry)

    monkeypatch.setitem(congestion.CONTROLLERS, "hpcc", Probe)
    # (N = 100: a lone flow told it is alone, N = 1, adds W_AI = (1 - eta) W_init
    # per RTT and holds its window at W_init, a packet's worth of queue now and
    # then; with N = 100 it stays below, and some packet sees the empty path)
    ex.incast(ex.IncastConfig(cc="hpcc:expected_flows=100", senders=1, rate_gbps=rate_gbps,
                              mtu=mtu, duration=200e-6))
    assert seen and bases
    t = bases[-1]
    assert min(seen) == pytest.approx(t, rel=1e-9, abs=0)
    rate = rate_gbps * 1e9
    delay = ex.IncastConfig().delay
    data = mtu + 12 + 4 + ex.WIRE_OVERHEAD          # BTH + ICRC, with IP/UDP
    # third.cc's delay * 2 + txDelay (one packet per hop; its payload there, the
    # datagram here), and the ACK's serialisation at both hops back
    ns3 = 2 * (2 * delay) + 2 * data * 8 / rate
    assert t == pytest.approx(ns3 + 2 * ex.ACK_BYTES * 8 / rate, rel=1e-12)


def test_hpcc_at_mtu_4096_meets_its_goal_with_the_ack_clock(monkeypatch):
    """The 16:1 incast at 25 Gbit/s and MTU 4096, where each flow's share of
    W_init is a third of a packet, with the defaults (``--cc hpcc``): W_AI from
    the paper's rule for the 16 flows the incast tells its controllers share
    the link, HPCC holds Jain >= 0.95 and goodput >= 0.9 of the bottleneck at
    the fabric's own T once its window below one packet is clocked by its ACKs
    (``Controller.ack_clocked``), and falls far short without it (the flows'
    own pacing clocks swing them together).  Virtual time: the figures are the
    code's, whatever the machine."""
    import congestion

    cfg = ex.IncastConfig(cc="hpcc", senders=16, duration=10e-3, mtu=4096)
    got = ex.incast(cfg)["summary"]
    assert got["jain_steady"] >= 0.95 and got["goodput_fraction"] >= 0.9, got
    assert got["switch_drops"] == 0 and got["wc_errors"] == 0
    monkeypatch.setattr(congestion.HPCC, "ack_clocked", False)
    without = ex.incast(cfg)["summary"]
    assert without["goodput_fraction"] < 0.8, without


@pytest.mark.parametrize("late", [None, 2e-3])
def test_the_incast_tells_its_controllers_the_flows_sharing_the_bottleneck(late):
    """Every sender's controller is told how many flows share the bottleneck,
    the late one counted (``FlowInfo.expected_flows``), and HPCC's W_AI follows
    the paper's rule with it; a spec's own N wins."""
    from congestion.hpcc import DEFAULT_FLOWS

    for spec, n in (("hpcc", 5 if late else 4), ("hpcc:expected_flows=7", 7)):
        run = ex._IncastRun(ex.IncastConfig(cc=spec, senders=4, late_join=late,
                                            duration=1e-3))
        ccs = [qp.cc for dev, *_ in run.flows for qp in dev.qps.values() if qp.cc is not None]
        assert len(ccs) == run.n == (5 if late else 4)
        for cc in ccs:
            assert cc.n == n and cc.w_ai == pytest.approx(cc.w_init * 0.05 / n)
    assert DEFAULT_FLOWS not in (4, 5, 7)       # (so the default could not pass for them)
