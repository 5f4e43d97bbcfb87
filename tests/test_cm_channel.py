"""The rdma_cm event channel (softnic/driver/rdmacm.py's EventChannel): its fd
counts the queued events, and the count and the queue change together under the
channel's lock: a reader waits for the fd to be readable and then takes (which
reads the count), and destroying an id purges its events with their counts.  It
used to be otherwise: the C face's rdma_get_cm_event read the count first and took
after, and a purge in between read the fd for a count that was gone, blocking for
ever under the lock the reader then waited for (rping's client hung so)."""

from __future__ import annotations

import os
import select
import threading
from types import SimpleNamespace

from softnic.driver import rdmacm as R


def _event(cid):
    return R.Event(R.ESTABLISHED, cid)


def _counts(fd) -> int:
    p = select.poll()
    p.register(fd, select.POLLIN)
    n = 0
    while p.poll(0):
        os.eventfd_read(fd)
        n += 1
    return n


def test_purge_while_a_reader_waits_does_not_block_and_keeps_the_count_true():
    ch = R.EventChannel()
    a, b = SimpleNamespace(), SimpleNamespace()
    ch.post(_event(a))
    ch.post(_event(b))
    done = threading.Event()
    t = threading.Thread(target=lambda: (ch.purge(a), done.set()), daemon=True)
    t.start()
    assert done.wait(5), "purge blocked on the channel's fd"
    ev = ch.take()
    assert ev is not None and ev.id is b
    assert ch.take() is None
    assert _counts(ch.fd) == 0                 # one count per event, none left over
    ch.close()


def test_take_reads_the_count_with_the_event():
    ch = R.EventChannel()
    a = SimpleNamespace()
    for _ in range(3):
        ch.post(_event(a))
    assert ch.take() is not None
    assert _counts(ch.fd) == 2
    ch.close()


def test_get_waits_for_the_event_of_a_later_post():
    ch = R.EventChannel()
    a, b = SimpleNamespace(), SimpleNamespace()
    ch.post(_event(a))
    ch.purge(a)
    threading.Timer(0.05, lambda: ch.post(_event(b))).start()
    got = ch.get(timeout=5)
    assert got is not None and got.id is b
    ch.close()
