"""Files the live NICs of one host share: where they go, and whether their writer lives;
and where softnic keeps what it builds for this user.

A live NIC publishes its counters there (``softnic counters``), an rdma_cm listener on
the host's loopback address its entry (``rdmacm_host``), a multicast member its
membership (``mcast``); an entry whose process is gone is stale.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path


def user_tmp_dir() -> Path:
    """``$TMPDIR/softnic-<uid>``: this user's own directory in the shared temporary
    directory, made mode 0700 if missing.  What softnic puts on a program's PATH (the
    ``rdma`` tool) is written there, so a directory of that name that is not this
    user's (another user may make it first) is refused, not used."""
    import tempfile                 # (here: finding the cache, cache_home, stays cheap)
    d = Path(tempfile.gettempdir()) / f"softnic-{os.getuid()}"
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{d} is not a directory of this user (uid {os.getuid()}): "
                              f"remove it, or name another with SOFTNIC_STATS_DIR")
    if st.st_mode & 0o077:
        d.chmod(0o700)
    return d


def stats_dir() -> Path:
    """Where live NICs publish their counters for ``softnic counters``."""
    given = os.environ.get("SOFTNIC_STATS_DIR")
    return Path(given) if given else user_tmp_dir()


def cache_home() -> Path:
    """Where softnic keeps what it builds (its C libraries, its packet kernel):
    ``$XDG_CACHE_HOME/softnic``, else ``~/.cache/softnic``; for a user whose home cannot
    be written (``nobody``'s /nonexistent, a container run with a uid that has no
    home), ``cache`` in ``user_tmp_dir()``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    home = Path(base) / "softnic"
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    else:
        if os.access(home, os.W_OK | os.X_OK):
            return home
    fallback = user_tmp_dir() / "cache"
    fallback.mkdir(exist_ok=True)
    return fallback


def namespace_table(kind: str) -> Path:
    """The directory of a host-wide table of ``kind`` ("rdmacm", "mcast") for this
    process's network namespace: processes in other namespaces (with other
    interfaces and addresses) keep tables of their own."""
    try:
        ns = os.readlink("/proc/self/ns/net").strip("net:[]")
    except OSError:
        ns = "0"
    return stats_dir() / f"{kind}-{ns}"


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (``/proc/<pid>/stat``'s
    22nd field, ``starttime``), or None where /proc cannot tell.  A pid is reused;
    a pid and its start name one process for good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # (the second field, the command, is in parentheses and may hold any byte)
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


_own_start: tuple[int, int | None] = (0, None)


def own_start() -> int | None:
    """``process_start`` of this process (read once per pid: a fork's child reads its
    own), what a file this process publishes records beside its pid."""
    global _own_start
    pid = os.getpid()
    if _own_start[0] != pid:
        _own_start = (pid, process_start(pid))
    return _own_start[1]


def process_alive(pid: int, start: int | None = None) -> bool:
    """Whether the process that published a file (counters, a host-wide listener)
    lives: ``pid`` is a live process and, given ``start`` (the writer's
    ``own_start()``), that process, not a later one the pid was given to."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start is not None:
        now = process_start(pid)
        if now is not None and now != start:
            return False
    return True


def _file_start(path: str) -> int | None:
    """The writer's start a counters file records (``"start"``), or None."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        start = doc.get("start")
        return start if type(start) is int else None
    except (OSError, ValueError, AttributeError):
        return None


#: the counters of exited programs' devices kept for ``softnic counters --all``: the
#: newest this many; older ones are removed (``prune``)
KEEP_EXITED = 256
#: how often, at most, a process looks for files to remove (seconds; ``prune``)
PRUNE_EVERY = 300.0
#: a sysfs tree younger than this is never removed: the launcher that made it may not
#: have exec'd its program yet, so no process names it in its environment (seconds)
TREE_GRACE = 600.0
#: what one look removes at most, oldest first: counters files, and sysfs trees (a
#: directory that has not been pruned for long drains over several looks, each a
#: fraction of a second, not all at once in one program's start or close)
PRUNE_MAX_FILES = 2000
PRUNE_MAX_TREES = 100
#: the stamp whose mtime says when ``prune`` last ran in a directory
_STAMP = ".pruned"


def _pid_of(name: str) -> int | None:
    """The writer's pid in a counters file's name (``<pid>-<device>.json``)."""
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _trees_in_use() -> set[str] | None:
    """The sysfs trees (their names: ``sysfs-<key>``) that ``SOFTNIC_SYSFS`` names in
    the environment of a process this user can read (``/proc/<pid>/environ``: what
    each was started with, which its children inherit), or None where /proc cannot
    tell.  By name, not path: the same directory may be spelled two ways, and a key
    is a hash of the tree's content, so a name alike in another directory only keeps
    a tree longer."""
    key = b"SOFTNIC_SYSFS="
    used: set[str] = set()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    if not pids:
        return None
    for p in pids:
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read()
        except OSError:              # gone, or another user's (not in this directory)
            continue
        for var in env.split(b"\0"):
            if var.startswith(key):
                used.add(os.path.basename(os.fsdecode(var[len(key):]).rstrip("/")))
    return used


def prune(d: Path | None = None, now: float | None = None, force: bool = False) -> int:
    """Remove what exited programs left in the directory ``d`` (``stats_dir()``), at
    most every ``PRUNE_EVERY`` seconds (``force``: now): their devices' counters
    beyond the newest ``KEEP_EXITED`` (a file whose writer's pid is gone), and the
    sysfs trees (``sysfs.tree``) no process names in ``SOFTNIC_SYSFS`` any more and
    none has made or taken up for ``TREE_GRACE``; at most ``PRUNE_MAX_FILES`` and
    ``PRUNE_MAX_TREES`` of them, the oldest.  A tree is made per device layout, and test
    runs use a fresh loopback address per test, so without this the directory grows
    by every run (about 90 trees and 440 counters files a run of softnic's own
    suite).  Returns how many entries it removed; errors (a file another process
    removes first) are skipped: this is housekeeping."""
    import shutil
    import time
    d = stats_dir() if d is None else d
    now = time.time() if now is None else now
    stamp = d / _STAMP
    try:
        last = stamp.stat().st_mtime
    except OSError:
        last = None                  # never pruned here (or no directory yet)
    if not force and last is not None and 0 <= now - last < PRUNE_EVERY:
        return 0
    try:
        stamp.touch()
        os.utime(stamp, (now, now))
        entries = list(os.scandir(d))
    except OSError:
        return 0
    removed = 0
    exited = []
    for e in entries:
        if e.name.endswith((".json", ".tmp")) and e.is_file(follow_symlinks=False):
            pid = _pid_of(e.name)
            # (a live pid's file is read for its writer's start: the pid may be reused)
            if pid is not None and not (process_alive(pid) and (
                    not e.name.endswith(".json")
                    or process_alive(pid, _file_start(e.path)))):
                try:
                    exited.append((e.stat().st_mtime, e.path))
                except OSError:
                    pass
    exited.sort(reverse=True)
    for _, path in exited[KEEP_EXITED:][-PRUNE_MAX_FILES:]:
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    trees = []
    for e in entries:
        if e.name.startswith(("sysfs-", ".sysfs-")) and e.is_dir(follow_symlinks=False):
            try:
                mtime = e.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if now - mtime >= TREE_GRACE:
                trees.append((mtime, e.path))
    if trees:
        used = _trees_in_use()
        if used is not None:
            trees.sort()
            trees = [p for _, p in trees if os.path.basename(p) not in used]
            for path in trees[:PRUNE_MAX_TREES]:
                try:                 # (a launcher may have taken it up meanwhile)
                    if now - os.stat(path).st_mtime < TREE_GRACE:
                        continue
                except OSError:
                    continue
                shutil.rmtree(path, ignore_errors=True)
                removed += not os.path.exists(path)
    return removed
