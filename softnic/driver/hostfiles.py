"""Files the live NICs of one host share: where they go, and whether their writer lives;
and where softnic keeps what it builds for this user.

A live NIC publishes its counters there (``softnic counters``), an rdma_cm listener on
the host's loopback address its entry (``rdmacm_host``), a multicast member its
membership (``mcast``); an entry whose process is gone is stale.
"""

from __future__ import annotations

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


def process_alive(pid: int) -> bool:
    """Whether the process that published a file (counters, a host-wide listener) lives."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
