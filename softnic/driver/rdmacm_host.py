"""The host's loopback address for rdma_cm: one listener table for every process.

On Linux a RoCE device on the loopback netdev (rxe on ``lo``) is one device that every
process of the host shares: a server that binds ``127.0.0.1:7471`` is reached by a client
in another process connecting to ``127.0.0.1:7471`` (rdma-core's own test suite runs its
rdma_cm tests so, passive and active side as two forked processes on one device).
softnic's devices are per process, each its own loopback address, so ``127.0.0.1`` is no
device's: binding it binds the process's first device (``rdmacm.CmId.bind``, the kernel's
rule for loopback), and this module makes it reachable from the other processes of the
host, as the kernel's shared device would be.

A listener bound to such an address publishes ``(port space, port, address)`` and the
device (IP and UDP port) that answers for it, in a file of the per-user state directory
(one table per network namespace, as an address is).  A connect to a loopback address
that is no device of the process looks the table up and sends its REQ (or SIDR_REQ) to
that device; the rest of the exchange runs between the two devices' own addresses, as
any connection.  A second listener on the same entry while its owner lives gets
``EADDRINUSE``, as a second bind of the host's address would; an entry whose owner died
is taken over.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from softnic.core.errors import VerbsError
from softnic.driver.hostfiles import namespace_table, own_start, process_alive


def _table() -> Path:
    return namespace_table("rdmacm")


def _entry(ps: int, port: int, ip: str) -> Path:
    return _table() / f"{ps}-{port}-{ip}.json"


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def publish(ps: int, port: int, ip: str, device: tuple[str, int]) -> None:
    """Record that this process listens on ``ip:port`` (of port space ``ps``) through the
    device at ``device``; ``EADDRINUSE`` if a live process already does."""
    path = _entry(ps, port, ip)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = json.dumps({"pid": os.getpid(), "start": own_start(), "ip": device[0],
                      "port": device[1]})
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            old = _read(path)
            if old is not None and old.get("pid") != os.getpid() \
                    and process_alive(old["pid"], old.get("start")):
                raise VerbsError(errno.EADDRINUSE,
                                 f"{ip}:{port} has a listener in process {old['pid']}") from None
            try:
                path.unlink()                     # its owner is gone (or it is ours)
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(doc)
        return
    raise VerbsError(errno.EADDRINUSE, f"{ip}:{port} is being taken by another process")


def withdraw(ps: int, port: int, ip: str) -> None:
    """Remove this process's entry (a listener that is destroyed)."""
    path = _entry(ps, port, ip)
    doc = _read(path)
    if doc is not None and doc.get("pid") == os.getpid():
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def lookup(ps: int, port: int, ip: str) -> tuple[str, int] | None:
    """The device (IP, UDP port) of the live listener on ``ip:port``, if any."""
    doc = _read(_entry(ps, port, ip))
    if doc is None or not process_alive(doc.get("pid", 0), doc.get("start")):
        return None
    return doc["ip"], int(doc["port"])
