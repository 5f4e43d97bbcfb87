"""Files the live NICs of one host share: where they go, and whether their writer lives.

A live NIC publishes its counters there (``softnic counters``), an rdma_cm listener on
the host's loopback address its entry (``rdmacm_host``), a multicast member its
membership (``mcast``); an entry whose process is gone is stale.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def stats_dir() -> Path:
    """Where live NICs publish their counters for ``softnic counters``."""
    return Path(os.environ.get("SOFTNIC_STATS_DIR") or
                Path(tempfile.gettempdir()) / f"softnic-{os.getuid()}")


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
