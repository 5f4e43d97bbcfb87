"""Where softnic writes for the user running it (softnic.driver.hostfiles): its build
cache, and its own directory in the shared /tmp.  An ordinary user, even one without a
writable home (``nobody``), gets both; a directory in /tmp that is not the user's is
refused."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from softnic.driver import hostfiles


@pytest.fixture
def tmp(monkeypatch, tmp_path):
    """A temporary directory of the test's own standing for /tmp."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    monkeypatch.delenv("SOFTNIC_STATS_DIR", raising=False)
    return d


@pytest.mark.unprivileged
def test_cache_home_is_under_xdg_cache_home(monkeypatch, tmp, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hostfiles.cache_home() == tmp_path / "xdg" / "softnic"
    assert (tmp_path / "xdg" / "softnic").is_dir()
    assert not list(tmp.iterdir())


@pytest.mark.unprivileged
def test_a_user_without_a_writable_home_caches_in_its_own_tmp_dir(monkeypatch, tmp, tmp_path):
    # a home that cannot be made, for root too: its parent is a file
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "file" / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    home = hostfiles.cache_home()
    mine = tmp / f"softnic-{os.getuid()}"
    assert home == mine / "cache" and home.is_dir()
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    assert hostfiles.stats_dir() == mine


@pytest.mark.unprivileged
def test_the_tmp_dir_is_made_private_and_kept_so(tmp):
    mine = tmp / f"softnic-{os.getuid()}"
    mine.mkdir(mode=0o755)
    mine.chmod(0o755)               # (an earlier softnic made it so)
    assert hostfiles.user_tmp_dir() == mine
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700


@pytest.mark.unprivileged
def test_a_tmp_dir_that_is_not_the_users_is_refused(tmp, tmp_path):
    other = tmp_path / "someone-elses"
    other.mkdir()
    (tmp / f"softnic-{os.getuid()}").symlink_to(other)
    with pytest.raises(PermissionError, match="not a directory of this user"):
        hostfiles.user_tmp_dir()
    with pytest.raises(PermissionError, match="SOFTNIC_STATS_DIR"):
        hostfiles.stats_dir()


# (root only: the unprivileged sub-run leaves it out)
@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a directory to another user")
def test_a_tmp_dir_of_another_uid_is_refused(tmp):
    mine = tmp / f"softnic-{os.getuid()}"
    mine.mkdir(mode=0o700)
    os.chown(mine, 65534, 65534)
    with pytest.raises(PermissionError, match="not a directory of this user"):
        hostfiles.user_tmp_dir()


@pytest.mark.unprivileged
def test_stats_dir_given_is_taken_as_it_is(monkeypatch, tmp, tmp_path):
    monkeypatch.setenv("SOFTNIC_STATS_DIR", str(tmp_path / "stats"))
    assert hostfiles.stats_dir() == tmp_path / "stats"
    assert not list(tmp.iterdir())
