"""Where softnic writes for the user running it (softnic.driver.hostfiles): its build
cache, and its own directory in the shared /tmp.  An ordinary user, even one without a
writable home (``nobody``), gets both; a directory in /tmp that is not the user's is
refused."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


# ------------------------------------------------------------------ what exited programs leave

def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen(["true"])
    p.wait()
    assert not hostfiles.process_alive(p.pid)
    return p.pid


def _aged(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.mark.unprivileged
def test_counters_of_exited_programs_beyond_the_newest_are_removed(monkeypatch, tmp_path):
    monkeypatch.setattr(hostfiles, "KEEP_EXITED", 3)
    d = tmp_path / "stats"
    d.mkdir()
    dead = _dead_pid()
    exited = []
    for i in range(7):                       # the older the smaller i
        f = d / f"{dead}-dev{i}.json"
        f.write_text("{}")
        _aged(f, 1000 - i)
        exited.append(f)
    orphan = d / f"{dead}-dev9.tmp"          # a write the program did not finish
    orphan.write_text("")
    _aged(orphan, 5000)
    live = d / f"{os.getpid()}-softnic0.json"
    live.write_text("{}")
    _aged(live, 9000)                        # old, but its writer lives
    other = d / "notes.json"
    other.write_text("{}")
    _aged(other, 9000)
    assert hostfiles.prune(d, force=True) == 5
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [f.name for f in exited[-3:]] + [live.name, other.name, ".pruned"])


@pytest.mark.unprivileged
def test_a_reused_pid_does_not_keep_an_exited_writers_files_alive(monkeypatch, tmp_path):
    """A file records its writer's pid and start (``own_start``): a live process
    given the pid of a writer that exited is not that writer.  Its counters are
    removed as an exited program's and ``softnic counters`` shows them exited; a
    host-wide listener's entry is not found; a multicast member is no member."""
    from softnic.driver import rdmacm_host
    start = hostfiles.own_start()
    assert isinstance(start, int) and start > 0
    assert hostfiles.process_start(os.getpid()) == start
    assert hostfiles.process_alive(os.getpid(), start)
    assert not hostfiles.process_alive(os.getpid(), start + 1)
    assert hostfiles.process_alive(os.getpid())          # (a file that records no start)
    monkeypatch.setattr(hostfiles, "KEEP_EXITED", 0)
    d = tmp_path / "stats"
    d.mkdir()
    docs = {"softnic0": start, "softnic1": start - 1, "softnic2": None}
    for dev, st in docs.items():
        doc = {"pid": os.getpid(), "device": dev, "gid": "::", "ip": "127.0.0.1",
               "port": 1, "time": time.time(), "closed": False, "counters": {"x": 1}}
        if st is not None:
            doc["start"] = st
        (d / f"{os.getpid()}-{dev}.json").write_text(json.dumps(doc))
    assert hostfiles.prune(d, force=True) == 1
    assert sorted(p.name for p in d.glob("*.json")) == [
        f"{os.getpid()}-softnic0.json", f"{os.getpid()}-softnic2.json"]
    (d / f"{os.getpid()}-softnic1.json").write_text(json.dumps(
        {"pid": os.getpid(), "start": start - 1, "device": "softnic1", "gid": "::",
         "ip": "127.0.0.1", "port": 1, "time": time.time(), "closed": False,
         "counters": {"x": 1}}))
    r = subprocess.run([sys.executable, "-m", "softnic.cli", "counters", "--all"],
                       env=dict(os.environ, SOFTNIC_STATS_DIR=str(d)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    state = {line.split()[0]: line.split("(")[1].split(",")[0]
             for line in r.stdout.splitlines() if line.startswith("softnic")}
    assert state == {"softnic0": "live", "softnic1": "exited", "softnic2": "live"}, r.stdout
    monkeypatch.setenv("SOFTNIC_STATS_DIR", str(d))
    rdmacm_host.publish(0x106, 4791, "127.0.0.1", ("127.0.0.1", 5000))
    assert rdmacm_host.lookup(0x106, 4791, "127.0.0.1") == ("127.0.0.1", 5000)
    entry = rdmacm_host._entry(0x106, 4791, "127.0.0.1")
    doc = json.loads(entry.read_text())
    entry.write_text(json.dumps(dict(doc, start=start + 1)))
    assert rdmacm_host.lookup(0x106, 4791, "127.0.0.1") is None
    # a multicast member's file names its process by pid and start too
    from types import SimpleNamespace
    from softnic.driver import mcast
    nic = SimpleNamespace(ip="127.0.0.9", port=4791)
    mcast.attach(nic, 5, True, "::ffff:239.1.2.3")
    assert mcast.members("239.1.2.3") == [("127.0.0.9", 4791, 5)]
    table = mcast._table() / "239.1.2.3"
    (table / f"127.0.0.9-4791-6-{os.getpid()}-{start + 1}").touch()   # the pid's earlier owner
    (table / f"127.0.0.9-4791-7-{os.getpid()}").touch()               # (written with no start)
    assert sorted(mcast.members("239.1.2.3")) == [("127.0.0.9", 4791, 5), ("127.0.0.9", 4791, 7)]
    assert not (table / f"127.0.0.9-4791-6-{os.getpid()}-{start + 1}").exists()   # removed
    mcast.detach(nic, 5, "::ffff:239.1.2.3")
    assert mcast.members("239.1.2.3") == [("127.0.0.9", 4791, 7)]


@pytest.mark.unprivileged
def test_sysfs_trees_no_process_names_are_removed_after_their_grace(tmp_path):
    d = tmp_path / "stats"
    d.mkdir()
    used, unused, fresh, unfinished = (d / n for n in ("sysfs-aaaa", "sysfs-bbbb",
                                                        "sysfs-cccc", ".sysfs-x1"))
    for t in (used, unused, fresh, unfinished):
        (t / "softnic0" / "ports").mkdir(parents=True)
        (t / "softnic0" / "node_type").write_text("1: CA\n")
    for t in (used, unused, unfinished):
        _aged(t, hostfiles.TREE_GRACE + 60)
    # a program started with the tree in its environment (so are its children)
    env = dict(os.environ, SOFTNIC_SYSFS=str(used))
    p = subprocess.Popen(["sleep", "60"], env=env)
    try:
        # (until it has exec'd, /proc shows the forking parent's environment)
        deadline = time.monotonic() + 10
        while b"SOFTNIC_SYSFS=" not in Path(f"/proc/{p.pid}/environ").read_bytes():
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.01)
        assert hostfiles.prune(d, force=True) == 2
        assert sorted(x.name for x in d.iterdir()) == [".pruned", "sysfs-aaaa", "sysfs-cccc"]
    finally:
        p.kill()
        p.wait()
    assert hostfiles.prune(d, force=True) == 1           # its program gone: removed too
    assert sorted(x.name for x in d.iterdir()) == [".pruned", "sysfs-cccc"]


@pytest.mark.unprivileged
def test_prune_looks_at_most_every_prune_every(tmp_path):
    d = tmp_path / "stats"
    d.mkdir()
    dead = _dead_pid()
    now = time.time()
    assert hostfiles.prune(d, now=now) == 0              # (nothing to remove yet)
    files = []
    for i in range(hostfiles.KEEP_EXITED + 2):
        files.append(d / f"{dead}-dev{i}.json")
        files[-1].write_text("{}")
    assert hostfiles.prune(d, now=now + hostfiles.PRUNE_EVERY - 1) == 0
    assert all(f.exists() for f in files)
    assert hostfiles.prune(d, now=now + hostfiles.PRUNE_EVERY + 1) == 2


def test_a_tree_taken_up_again_is_young_again(tmp_path):
    from softnic.driver import config as _config
    from softnic.faces.libibverbs import sysfs
    cfg = _config.RuntimeConfig(devices=_config.parse_devices("2"))
    t = sysfs.tree(cfg, tmp_path)
    _aged(t, hostfiles.TREE_GRACE + 60)
    assert sysfs.tree(cfg, tmp_path) == t
    assert time.time() - t.stat().st_mtime < 60
    assert hostfiles.prune(tmp_path, force=True) == 0
    shutil.rmtree(t)                         # removed between a look and its use: made again
    assert sysfs.tree(cfg, tmp_path) == t and (t / "softnic1").is_dir()


def test_softnic_exec_removes_what_exited_programs_left(tmp_path):
    d = tmp_path / "stats"
    d.mkdir()
    dead = _dead_pid()
    old_tree = d / "sysfs-0123456789ab"
    (old_tree / "softnic0").mkdir(parents=True)
    _aged(old_tree, hostfiles.TREE_GRACE + 60)
    stale = []
    for i in range(hostfiles.KEEP_EXITED + 4):
        stale.append(d / f"{dead}-dev{i}.json")
        stale[-1].write_text("{}")
        _aged(stale[-1], 1000 - i)
    env = dict(os.environ, SOFTNIC_STATS_DIR=str(d))
    env.pop("SOFTNIC_SYSFS", None)
    r = subprocess.run([sys.executable, "-m", "softnic.cli", "exec", "--", "sh", "-c",
                        'echo "$SOFTNIC_SYSFS"'], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    mine = Path(r.stdout.strip())
    assert mine.parent == d and mine.is_dir()            # the program's own tree stays
    assert not old_tree.exists()
    assert [f.exists() for f in stale] == [False] * 4 + [True] * hostfiles.KEEP_EXITED


def test_a_device_closing_removes_what_exited_programs_left(monkeypatch, tmp_path):
    from softnic.driver.config import DeviceSpec, RuntimeConfig
    from softnic.driver.nic import NIC
    d = tmp_path / "stats"
    d.mkdir()
    monkeypatch.setenv("SOFTNIC_STATS_DIR", str(d))
    dead = _dead_pid()
    stale = []
    for i in range(hostfiles.KEEP_EXITED + 1):
        stale.append(d / f"{dead}-dev{i}.json")
        stale[-1].write_text("{}")
        _aged(stale[-1], 1000 - i)
    nic = NIC(DeviceSpec("pr0", None, 0), RuntimeConfig())
    nic.close()
    assert not stale[0].exists() and all(f.exists() for f in stale[1:])
    assert (d / f"{os.getpid()}-pr0.json").exists()      # its own counters, closed


@pytest.mark.unprivileged
def test_one_look_removes_at_most_its_share_oldest_first(monkeypatch, tmp_path):
    monkeypatch.setattr(hostfiles, "KEEP_EXITED", 1)
    monkeypatch.setattr(hostfiles, "PRUNE_MAX_FILES", 2)
    monkeypatch.setattr(hostfiles, "PRUNE_MAX_TREES", 1)
    d = tmp_path / "stats"
    d.mkdir()
    dead = _dead_pid()
    files, trees = [], []
    for i in range(4):                       # the older the smaller i
        files.append(d / f"{dead}-dev{i}.json")
        files[-1].write_text("{}")
        _aged(files[-1], 1000 - i)
        trees.append(d / f"sysfs-{i:012x}")
        trees[-1].mkdir()
        _aged(trees[-1], hostfiles.TREE_GRACE + 100 - i)
    assert hostfiles.prune(d, force=True) == 3
    assert [f.exists() for f in files] == [False, False, True, True]
    assert [t.exists() for t in trees] == [False, True, True, True]
    assert hostfiles.prune(d, force=True) == 2
    assert [f.exists() for f in files] == [False, False, False, True]
    assert [t.exists() for t in trees] == [False, False, True, True]
