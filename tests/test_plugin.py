"""The pytest plugin (softnic.testing.plugin), exercised the way a user meets it:
a small separate project whose tests use the fixtures, run by ``pytester``."""

from __future__ import annotations

import importlib.metadata
import re
import sys

import pytest

import softnic.driver.nic
import softnic.testing.plugin as plugin

pytest_plugins = ["pytester"]

HELPERS = '''
import pytest
import softnic.driver.nic
import verbs_api.enums as e
from verbs_api.wr import RecvWR, SendWR


def write(pair, data, offset=0):
    """RDMA WRITE data from a's MR into b's MR at offset; the requester's WC."""
    a, b = pair
    a.mr.write(data, len(data))
    wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[a.sge(0, len(data))],
                send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf + offset)
    a.qp.post_send(wr)
    wc, = a.poll()
    return wc
'''


def _project(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(test_app=HELPERS + body)


def test_the_plugin_is_a_pytest11_entry_point(pytestconfig):
    eps = importlib.metadata.entry_points(group="pytest11")
    assert any(ep.name == "softnic" and ep.value == "softnic.testing.plugin" for ep in eps)
    assert pytestconfig.pluginmanager.has_plugin("softnic")


def test_fixtures_give_connected_resources_and_leave_nothing_open(pytester):
    _project(pytester, '''
def test_write(softnic_rc_pair):
    a, b = softnic_rc_pair.a, softnic_rc_pair.b
    wc = write(softnic_rc_pair, b"hello, softnic", offset=100)
    assert wc.status == e.IBV_WC_SUCCESS and wc.opcode == e.IBV_WC_RDMA_WRITE
    assert b.mr.read(14, 100) == b"hello, softnic"
    assert softnic_rc_pair.config.backend == "sim"
    assert a.counters()["sent_pkts"] == 1

def test_ud_send(softnic_ud_pair):
    a, b = softnic_ud_pair
    b.qp.post_recv(RecvWR(7, 1, [b.sge(0, 40 + 64)]))
    a.mr.write(b"datagram", 8)
    wr = SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[a.sge(0, 8)],
                send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_ud(a.ah, b.qp.qp_num, softnic_ud_pair.qkey)
    a.qp.post_send(wr)
    assert a.poll()[0].status == e.IBV_WC_SUCCESS
    wc, = b.poll()
    assert wc.status == e.IBV_WC_SUCCESS and wc.src_qp == a.qp.qp_num
    assert wc.byte_len == 40 + 8 and b.mr.read(8, 40) == b"datagram"

def test_devices(softnic_devices):
    c0, c1 = softnic_devices
    assert (c0.name, c1.name) == ("softnic0", "softnic1")
    assert c0.query_gid(1, 0) != c1.query_gid(1, 0)
    assert len(softnic.driver.nic.open_nics()) == 2

def test_nothing_left_open():
    assert softnic.driver.nic.open_nics() == []
    assert softnic.driver.nic.runtime_config().backend in ("udp", "sim")
''')
    result = pytester.runpytest()
    result.assert_outcomes(passed=4)
    assert softnic.driver.nic.open_nics() == []


def test_a_failing_test_reports_seed_and_last_packets(pytester):
    _project(pytester, '''
def test_bad(softnic_rc_pair):
    assert write(softnic_rc_pair, b"x" * 3000).status == e.IBV_WC_SUCCESS
    assert softnic_rc_pair.b.mr.read(3, 0) == b"yyy"
''')
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*- softnic (seed 0) -*",
        "seed 0, backend sim, faults none, path MTU 1024*",
        "replay: pytest test_app.py::test_bad --softnic-seed=0",
        "links: sent=4 delivered=4*",
        "softnic0: sent_pkts=3 rcvd_pkts=1*",
        "*softnic0*softnic1*",
        "*WRITE*FIRST*psn*0*",
        "*WRITE*MIDDLE*psn*1*",
        "*WRITE*LAST*psn*2*",
        "*ACK*psn*2*",
    ])


def test_the_seed_option_and_marker_set_the_seed_shown(pytester):
    _project(pytester, '''
def test_bad(softnic_rc_pair):
    write(softnic_rc_pair, b"x")
    assert False

@pytest.mark.softnic(seed=99)
def test_pinned(softnic_config, softnic_rc_pair):
    assert softnic_config.seed == 99
    assert softnic.driver.nic.sim_world().fabric.seed == 99
''')
    result = pytester.runpytest("--softnic-seed=1234")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["softnic: backend=sim seed=1234 faults=none",
                                 "*- softnic (seed 1234) -*",
                                 "seed 1234, backend sim*",
                                 "replay: pytest test_app.py::test_bad --softnic-seed=1234"])
    assert "seed 0" not in result.stdout.str()


def test_the_faults_option_makes_the_lossy_pair_drop_yet_deliver(pytester):
    _project(pytester, '''
def test_lossy(softnic_lossy_pair, softnic_fabric):
    assert softnic_fabric.faults == "loss=0.05"
    data = bytes(range(256)) * 1024
    wc = write(softnic_lossy_pair, data)
    assert wc.status == e.IBV_WC_SUCCESS
    assert softnic_lossy_pair.b.mr.read(len(data), 0) == data
    links = softnic_lossy_pair.fault_counters()
    print("LINKS", links["sent"], links["dropped_loss"])
    assert links["dropped_loss"] > 0
    assert softnic_lossy_pair.a.counters()["sent_pkts"] > len(data) // 1024    # resent some
''')
    result = pytester.runpytest("--softnic-faults=loss=0.05", "-s", "--softnic-seed=3",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    sent, dropped = map(int, re.search(r"LINKS (\d+) (\d+)", result.stdout.str()).groups())
    assert sent > 256 and 0 < dropped < sent // 5


def test_the_lossy_pair_is_lossy_by_default_and_only_it(pytester):
    _project(pytester, '''
def test_lossy(softnic_lossy_pair, softnic_fabric):
    assert softnic_fabric.faults == "loss=0.05"
    assert write(softnic_lossy_pair, bytes(1 << 18)).status == e.IBV_WC_SUCCESS
    assert softnic_lossy_pair.fault_counters()["dropped_loss"] > 0

def test_plain(softnic_rc_pair):
    assert write(softnic_rc_pair, bytes(65536)).status == e.IBV_WC_SUCCESS
    assert softnic_rc_pair.fault_counters()["dropped_loss"] == 0

@pytest.mark.softnic(lossy_faults="dup=0.2")
def test_own_model(softnic_lossy_pair, softnic_fabric):
    assert write(softnic_lossy_pair, bytes(65536)).status == e.IBV_WC_SUCCESS
    assert softnic_fabric.faults == "dup=0.2"
    assert softnic_lossy_pair.fault_counters()["duplicated"] > 0
''')
    pytester.runpytest("--softnic-seed=1").assert_outcomes(passed=3)


def test_live_udp_backend_by_marker_and_its_failure_report(pytester):
    _project(pytester, '''
@pytest.mark.softnic(backend="udp", mtu=4096)
def test_live(softnic_rc_pair):
    assert softnic_rc_pair.config.mtu == 4096
    assert not hasattr(softnic.driver.nic.open_nics()[0], "world")      # a live NIC
    wc = write(softnic_rc_pair, b"z" * 10000)
    assert wc.status == e.IBV_WC_SUCCESS
    assert softnic_rc_pair.b.mr.read(10000, 0) == b"z" * 10000

@pytest.mark.softnic(backend="udp")
def test_live_bad(softnic_rc_pair):
    write(softnic_rc_pair, b"x" * 2000)
    assert False
''')
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "seed 0, backend udp, faults none*",
        "replay: pytest test_app.py::test_live_bad --softnic-seed=0 --softnic-backend=udp*",
        "pcap: *",
        "*WRITE*FIRST*psn*0*",
        "*WRITE*LAST*psn*1*",
        "*ACK*psn*1*",
    ])


def test_the_config_can_be_parametrized_over_both_backends(pytester):
    _project(pytester, '''
@pytest.mark.parametrize("softnic_config", [{"backend": "sim"}, {"backend": "udp"}],
                         indirect=True, ids=["sim", "udp"])
def test_both(softnic_config, softnic_rc_pair):
    assert softnic_rc_pair.config.backend == softnic_config.backend
    assert write(softnic_rc_pair, b"both").status == e.IBV_WC_SUCCESS
''')
    pytester.runpytest("-v").assert_outcomes(passed=2)


def test_markers_nest_and_the_config_fixture_can_be_overridden(pytester):
    pytester.makeconftest('''
import dataclasses
import pytest

@pytest.fixture
def softnic_config(softnic_config):
    return dataclasses.replace(softnic_config, recovery="sr")
''')
    _project(pytester, '''
pytestmark = pytest.mark.softnic(mtu=2048, seed=5)

@pytest.mark.softnic(mtu=512)
class TestNested:
    @pytest.mark.softnic(seed=6)
    def test_closest_wins(self, softnic_config, softnic_rc_pair):
        assert (softnic_config.mtu, softnic_config.seed) == (512, 6)
        assert softnic_config.recovery == "sr"
        assert softnic.driver.nic.runtime_config().selective_repeat
        assert write(softnic_rc_pair, bytes(2000)).status == e.IBV_WC_SUCCESS
        assert softnic_rc_pair.a.counters()["sent_pkts"] == 4         # 2000 B at MTU 512
''')
    pytester.runpytest().assert_outcomes(passed=1)


def test_bad_options_and_markers_are_reported(pytester):
    _project(pytester, '''
@pytest.mark.softnic(mtu=1000)
def test_bad_mtu(softnic_rc_pair):
    pass
''')
    result = pytester.runpytest("--softnic-faults=lots=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*softnic: *unknown fault spec key 'lots'*"])
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*softnic mtu must be one of*"])


def test_the_report_without_the_ladder_module(pytester, monkeypatch):
    """softnic.trace.ladder draws the ladder when it is there; without it the plugin
    writes one plain line per packet event."""
    monkeypatch.setitem(sys.modules, "softnic.trace.ladder", None)      # import fails
    _project(pytester, '''
@pytest.mark.softnic(faults="loss=0.3", seed=4)
def test_bad(softnic_rc_pair):
    write(softnic_rc_pair, b"x" * 5000)
    assert False
''')
    # every event shown, so the FIRST that opens the WRITE is among them whatever the
    # length of the recovery that follows
    result = pytester.runpytest("--softnic-trace-lines=200")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "replay: pytest test_app.py::test_bad --softnic-seed=4 --softnic-faults=loss=0.3",
        "last * of * packet events (virtual time):",
        "*softnic0 -> softnic1  send *RC_RDMA_WRITE_FIRST*psn=0 *qp=0x* rkey=0x* len=5000 1024 B",
        "*softnic0 -> softnic1  drop *RC_RDMA_WRITE*",
        "*softnic1 -> softnic0  send *RC_ACKNOWLEDGE*ACK msn=1*",
    ])


def test_describe_names_naks():
    from softnic.wire.icrc import append_icrc
    from softnic.wire.roce import Opcode, encode
    nak = encode(Opcode.RC_ACKNOWLEDGE, dest_qp=0x12, psn=7, aeth=(0x60, 3))
    op, psn, qpn, info = plugin._describe(bytes(append_icrc(nak, "10.0.0.1", "10.0.0.2",
                                                             4791, 4791)))
    assert (op, psn, qpn) == ("RC_ACKNOWLEDGE", "7", "0x12")
    assert info == "NAK PSN_SEQUENCE_ERROR msn=3"
    assert plugin._describe(b"\x00" * 8)[0] == "undecodable (8 B)"
