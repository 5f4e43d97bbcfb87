"""Base classes and helpers shared by the API modules (``pyverbs.base``)."""

from __future__ import annotations

import ctypes
import errno as _errno
import logging

from softnic.core.errors import VerbsError

from .pyverbs_error import PyverbsError, PyverbsRDMAError

LOG_LEVEL = logging.INFO
LOG_FORMAT = '[%(levelname)s] %(asctime)s %(filename)s:%(lineno)s: %(message)s'


def inc_rkey(rkey):
    """ibv_inc_rkey: the next key with the same index (the low byte advances)."""
    return (rkey & 0xFFFFFF00) | ((rkey + 1) & 0xFF)


def PyverbsRDMAErrno(msg):
    return PyverbsRDMAError(msg, ctypes.get_errno() or -1)


def close_weakrefs(iterables):
    """Close every object held in each of ``iterables`` (WeakSets), emptying them."""
    for it in iterables:
        if it is None:
            continue
        items = list(it)
        it.clear()
        for item in items:
            if item is not None:
                item.close()


class PyverbsObject:
    def __init__(self):
        pass

    @property
    def logger(self):
        # made on first use: work requests and completions are made by the thousand
        lg = self.__dict__.get('_logger')
        if lg is None:
            lg = self.__dict__['_logger'] = logging.getLogger(self.__class__.__name__)
        return lg

    @logger.setter
    def logger(self, val):
        self.__dict__['_logger'] = val

    def set_log_level(self, val):
        self.logger.setLevel(val)


def kinds(obj) -> set[str]:
    """What ``obj`` is, as its classes say with ``_kind`` (``'PD'``, ``'CQ'``, ...).

    A parent's ``add_ref`` and a creator's argument check test these instead of
    ``isinstance`` against the child's class, so a lower module (``device``,
    ``pd``, ``cq``) never imports a higher one (``qp``, ``srq``, ``mr``): the
    modules layer as pyverbs' do, base < device < pd, cq < mr < srq < qp, where
    Cython's declaration files give the lower ones the higher ones' types.  A
    subclass is every kind of its bases, as ``isinstance`` would say.
    """
    return {c.__dict__['_kind'] for c in type(obj).__mro__ if '_kind' in c.__dict__}


def keep_ref(owner, obj, table):
    """Keep ``obj`` in the first of ``owner``'s WeakSets whose kind it is.

    ``table`` holds (kind, attribute) pairs in the order ``add_ref`` tests them.
    """
    have = kinds(obj)
    for kind, attr in table:
        if kind in have:
            getattr(owner, attr).add(obj)
            return
    raise PyverbsError('Unrecognized object type')


class PyverbsCM(PyverbsObject):
    """An object that owns a verbs resource: a context manager whose exit closes it.

    Like pyverbs' objects, it is also closed when it is garbage collected.
    """

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        return self.close()

    def close(self):
        pass

    def __del__(self):
        try:
            self.close()
        except Exception:           # interpreter shutdown, or a parent already gone
            pass


def engine_call(nic, msg, fn, *args, **kw):
    """Run an engine verbs call on ``nic``; a refusal becomes PyverbsRDMAError
    with the errno the engine (as the kernel would) gave."""
    try:
        return nic.call(fn, *args, **kw)
    except VerbsError as e:
        raise PyverbsRDMAError(f'{msg}: {e.message}', e.errno) from None
    except ValueError as e:          # an attribute the engine cannot even parse
        raise PyverbsRDMAError(f'{msg}: {e}', _errno.EINVAL) from None


def rdma_error(msg, err=_errno.EINVAL):
    return PyverbsRDMAError(msg, err)


def check_open(obj, what):
    if getattr(obj, '_closed', True):
        raise PyverbsError(f'{what} is closed')
