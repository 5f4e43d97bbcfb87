"""Numbers and switches from the environment: blank means the default, a bad number
names its variable."""

import os
import subprocess
import sys

import pytest

from softnic.driver import env


def test_blank_and_unset_mean_default(monkeypatch):
    monkeypatch.delenv("SOFTNIC_TEST_N", raising=False)
    assert env.number("SOFTNIC_TEST_N", 7) == 7
    monkeypatch.setenv("SOFTNIC_TEST_N", "  ")
    assert env.number("SOFTNIC_TEST_N", 7) == 7
    monkeypatch.setenv("SOFTNIC_TEST_N", " 12 ")
    assert env.number("SOFTNIC_TEST_N", 7) == 12
    monkeypatch.setenv("SOFTNIC_TEST_N", "2.5")
    assert env.number("SOFTNIC_TEST_N", 1.0, float) == 2.5


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("SOFTNIC_TEST_N", "four")
    with pytest.raises(ValueError, match="SOFTNIC_TEST_N='four': expected an integer"):
        env.number("SOFTNIC_TEST_N", 7)
    with pytest.raises(ValueError, match="expected a number"):
        env.number("SOFTNIC_TEST_N", 7.0, float)


def test_a_switch_is_off_only_when_told(monkeypatch):
    monkeypatch.delenv("SOFTNIC_TEST_F", raising=False)
    assert env.flag("SOFTNIC_TEST_F") is True and env.flag("SOFTNIC_TEST_F", False) is False
    for off in ("0", "no", " OFF ", "False"):
        monkeypatch.setenv("SOFTNIC_TEST_F", off)
        assert env.flag("SOFTNIC_TEST_F") is False, off
    for on in ("1", "yes", "on", "2"):
        monkeypatch.setenv("SOFTNIC_TEST_F", on)
        assert env.flag("SOFTNIC_TEST_F", False) is True, on
    monkeypatch.setenv("SOFTNIC_TEST_F", " ")
    assert env.flag("SOFTNIC_TEST_F") is True and env.flag("SOFTNIC_TEST_F", False) is False


def test_collectives_import_with_blank_tunables():
    """Every tunable set but empty: the modules import, with the defaults."""
    names = ["SOFTNIC_COLL_SMALL", "SOFTNIC_COLL_MID", "SOFTNIC_COLL_SMALL_BCAST",
             "SOFTNIC_COLL_MIN_CHUNK", "SOFTNIC_COLL_ZCOPY", "SOFTNIC_COLL_DIRECT",
             "SOFTNIC_COLL_WINDOW", "SOFTNIC_SPIN_LEASE_US", "SOFTNIC_HOLD_US",
             "SOFTNIC_PROGRESS_NICE", "SOFTNIC_POLL_RUNS"]
    e = dict(os.environ, **dict.fromkeys(names, ""))
    code = ("import softnic.collectives.communicator as c, softnic.collectives.transport as t, "
            "softnic.driver.nic as n, softnic.faces.libibverbs.backend as b; "
            "print(c.SMALL_BROADCAST, c.SMALL_ALLREDUCE[2], t.WINDOW, n.PROGRESS_NICE, b.POLL_RUNS)")
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["65536", "65536", "384", "-10", "16"]
