"""The labs show what their answer keys say."""

from __future__ import annotations

import sys

from softnic.cli import labs
from softnic.core.enums import QPState, WCStatus


def _statuses(run):
    return [(name, wc.wr_id, wc.status) for name, wc in run.completions]


def test_lab1_segmentation_and_wrap():
    (run,) = labs.run_lab(1)
    a, b = run.devices
    assert a.counters["sent_pkts"] == 5 and b.counters["sent_pkts"] == 1   # one coalesced ACK
    assert _statuses(run) == [("softnic0", 1, WCStatus.SUCCESS)]
    assert "bytes landed: True" in run.notes


def test_lab2_go_back_n_resends_the_tail_selective_repeat_only_the_hole():
    gbn, sr = labs.run_lab(2)
    assert gbn.devices[0].counters["retransmitted_pkts"] == 13      # PSN 3..15
    assert sr.devices[0].counters["retransmitted_pkts"] == 1        # PSN 3 only
    for run in (gbn, sr):
        assert _statuses(run) == [("softnic0", 1, WCStatus.SUCCESS)]
        assert "bytes landed: True" in run.notes


def test_lab3_rnr_then_success():
    (run,) = labs.run_lab(3)
    a, b = run.devices
    assert a.counters["rcvd_rnr_err"] == b.counters["send_rnr_err"] >= 2
    assert sorted(_statuses(run)) == [("softnic0", 1, WCStatus.SUCCESS),
                                      ("softnic1", 9, WCStatus.SUCCESS)]


def test_lab4_protection_error_flushes():
    (run,) = labs.run_lab(4)
    assert _statuses(run) == [("softnic0", 1, WCStatus.REM_ACCESS_ERR),
                              ("softnic0", 2, WCStatus.WR_FLUSH_ERR)]
    assert "target memory untouched: True" in run.notes
    assert all(d.qps[0x11].state == QPState.ERR for d in run.devices)


def test_lab5_atomic_once_under_duplication():
    (run,) = labs.run_lab(5)
    assert [s for _, _, s in _statuses(run)] == [WCStatus.SUCCESS] * 3
    assert "value: 1000 -> 1003 after 3 fetch-adds of 1; returned [1000, 1001, 1002]" in run.notes
    assert run.devices[1].counters["duplicate_request"] > 0
    assert run.devices[1].counters["atomic_replayed"] > 0


def test_lab6_dcqcn_reacts_to_ecn_marks():
    dcqcn, none = labs.run_lab(6)
    s0, s1, recv = dcqcn.devices
    assert [s for _, _, s in _statuses(dcqcn)] == [WCStatus.SUCCESS] * 2
    marks = recv.counters["np_ecn_marked_roce_packets"]
    cnps = recv.counters["np_cnp_sent"]
    # marks became CNPs (at most one per 50 us per QP, so fewer), each reached its sender
    assert 0 < cnps < marks
    assert s0.counters["rp_cnp_handled"] + s1.counters["rp_cnp_handled"] == cnps
    # the sender cut its rate: the timeline shows a rate below line rate
    assert any(" 2.500 Gbit/s" in n for n in dcqcn.notes)
    # with no controller the switch marks nothing and the queue stays high
    assert none.devices[2].counters["np_ecn_marked_roce_packets"] == 0
    med = lambda run: float(next(n for n in run.notes if "median" in n)
                            .split("median ")[1].split(" KB")[0])
    assert med(dcqcn) < med(none) / 10


def test_unknown_lab():
    import pytest
    with pytest.raises(ValueError):
        labs.run_lab(9)
