"""The rdma_cm event channel (softnic/driver/rdmacm.py's EventChannel): its fd
counts the events, and a reader reads a count before it takes the event (the C
face's rdma_get_cm_event does exactly that).  Destroying an id purges its events
without reading counts a reader may already hold: it must never block (rping's
client hung so, its main thread reading the fd under the channel's lock while the
thread that had read the count waited for that lock to take the event)."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

from softnic.driver import rdmacm as R


def _event(cid):
    return R.Event(R.ESTABLISHED, cid)


def test_purge_after_a_reader_read_the_count_does_not_block():
    ch = R.EventChannel()
    cid = SimpleNamespace()
    ch.post(_event(cid))
    os.eventfd_read(ch.fd)                   # a reader has the count, not the event yet
    done = threading.Event()
    t = threading.Thread(target=lambda: (ch.purge(cid), done.set()), daemon=True)
    t.start()
    assert done.wait(5), "purge blocked on the channel's fd"
    assert ch.take() is None                 # the reader finds nothing: it reads again
    ch.close()


def test_a_count_left_by_a_purge_is_skipped_by_get():
    ch = R.EventChannel()
    a, b = SimpleNamespace(), SimpleNamespace()
    ch.post(_event(a))
    ch.purge(a)                              # its count stays in the fd
    ch.post(_event(b))
    got = ch.get(timeout=5)
    assert got is not None and got.id is b   # not None for the stale count
    ch.close()
