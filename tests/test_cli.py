"""The softnic command: devinfo, exec, counters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from softnic.cli.main import SHIM


def run(*args, env=None, check=True):
    return subprocess.run([sys.executable, "-m", "softnic.cli", *args], capture_output=True,
                          text=True, check=check, env=env)


def test_devinfo_prints_what_ibv_devinfo_prints():
    out = run("devinfo").stdout
    assert out.count("hca_id:\t") == 2
    assert "hca_id:\tsoftnic0" in out and "hca_id:\tsoftnic1" in out
    assert "\t\t\tstate:\t\t\tPORT_ACTIVE (4)" in out
    assert "\t\t\tmax_mtu:\t\t4096 (5)" in out
    assert "\t\t\tlink_layer:\t\tEthernet" in out
    assert "\tvendor_id:\t\t\t0xffffff" in out


def test_devinfo_verbose_and_device_selection():
    out = run("devinfo", "-v", "-d", "softnic1").stdout
    assert out.count("hca_id:") == 1 and "softnic1" in out
    assert "\tmax_qp_wr:\t\t\t16384" in out
    assert "GID[  0]:\t\t::ffff:127." in out
    bad = run("devinfo", "-d", "nope", check=False)
    assert bad.returncode == 1 and "no device 'nope'" in bad.stderr


def test_devices_follow_the_environment():
    import os
    env = dict(os.environ, SOFTNIC_DEVICES="nicA=127.0.0.9:4999")
    out = run("devinfo", env=env).stdout
    assert "hca_id:\tnicA" in out and "softnic0" not in out


def test_exec_gives_the_program_softnic_pyverbs_and_passes_settings():
    prog = ("import pyverbs, pyverbs.enums as e, os; from pyverbs.device import get_device_list;"
            "print(pyverbs.SOFTNIC, e.IBV_QPT_RC, [d.name for d in get_device_list()],"
            " os.environ['SOFTNIC_FAULTS'])")
    out = run("exec", "--faults", "loss=0.05", "--devices", "2", "--", sys.executable, "-c",
              prog).stdout
    assert out.strip() == "True 2 [b'softnic0', b'softnic1'] loss=0.05"


def test_exec_leaves_other_programs_alone():
    # outside `softnic exec` the shim is not on the path
    r = subprocess.run([sys.executable, "-c", "import sys; print(any('pyverbs_shim' in p for p"
                        " in sys.path))"], capture_output=True, text=True)
    assert r.stdout.strip() == "False"
    assert (SHIM / "pyverbs" / "__init__.py").is_file()


def test_exec_refuses_a_bad_fault_model():
    r = run("exec", "--faults", "loss=2", "--", sys.executable, "-c", "pass", check=False)
    assert r.returncode != 0 and "loss" in r.stderr


@pytest.mark.unprivileged
def test_counters_of_a_running_program(tmp_path):
    import os
    env = dict(os.environ, SOFTNIC_STATS_DIR=str(tmp_path))
    prog = ("import softnic.driver.nic as n; a = n.open_device('softnic0'); a.publish_counters();"
            "import subprocess, sys; r = subprocess.run([sys.executable, '-m', 'softnic.cli',"
            " 'counters', '-v', '--json'], capture_output=True, text=True); print(r.stdout)")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env,
                         check=True).stdout
    docs = json.loads(out)
    assert len(docs) == 1 and docs[0]["device"] == "softnic0"
    assert "sent_pkts" in docs[0]["counters"]
    # after it exited, only --all shows it
    assert json.loads(run("counters", "--json", env=env).stdout) == []
    assert len(json.loads(run("counters", "--json", "--all", env=env).stdout)) == 1


def test_lab_command_prints_the_ladder(tmp_path):
    out = run("lab", "2", "--svg", str(tmp_path / "lab.svg")).stdout
    assert "one lost packet, go-back-N" in out and "one lost packet, selective repeat" in out
    assert out.count("DROP") == 2 and "NAK seq-err" in out and "RETX" in out
    assert (tmp_path / "lab-1.svg").read_text().startswith("<")
    assert run("lab", "9", check=False).returncode == 2


def test_perf_peak_is_a_rate_over_a_twentieth_of_the_run_at_least():
    """A coalesced ACK completes a burst of work requests in one poll: the peak is
    not the rate between two stamps microseconds apart."""
    from softnic.cli.perf import peak_rate
    # 20 stamps of 100 completions each, 1 ms apart, but the 10th arrives 1 us
    # after the 9th (a burst)
    t0 = 0.0
    stamps = [(100 * k, 1e-3 * k) for k in range(1, 21)]
    stamps[9] = (1000, stamps[8][1] + 1e-6)
    elapsed = 20e-3
    peak = peak_rate(stamps, t0, elapsed)
    assert peak <= 2 * 100 / 1e-3           # at most twice the steady 100 per ms
    assert peak >= 100 / 1e-3               # and at least the steady rate
    steady = [(100 * k, 1e-3 * k) for k in range(1, 21)]
    assert abs(peak_rate(steady, t0, elapsed) - 1e5) < 1
