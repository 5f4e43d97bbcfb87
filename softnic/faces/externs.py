"""The calls a C face makes into Python: each ``sn_X`` module function is the
``sn_py_X`` extern of callbacks.h, registered with the embedded module's ffi.

Both C libraries (``libibverbs``, ``librdmacm``) share this rule: a call returns
0 or a positive errno, as libibverbs does; an engine refusal (``VerbsError``)
gives its errno, an OSError its own, and an unexpected exception is printed and
becomes the call's ``error`` value, so no bug in Python can kill the program.
"""

from __future__ import annotations

import errno
import sys
import traceback

from softnic.core.errors import VerbsError
from softnic.driver import timeline


class Externs:
    """A backend's table of externs: ``@externs()`` marks a function, ``install(ffi)``
    registers them all.  ``missing_device``: a KeyError (a device name nobody
    configured) is said on stderr under this name and becomes ENODEV."""

    def __init__(self, *, missing_device: str | None = None):
        self.missing_device = missing_device
        self.calls: list = []
        self.ffi = None          # the embedded module's ffi, once install() has run

    def __call__(self, error: int = errno.EIO):
        def mark(fn):
            self.calls.append((fn, error))
            return fn
        return mark

    def install(self, ffi) -> None:
        self.ffi = ffi
        for fn, error in self.calls:
            ffi.def_extern(name="sn_py_" + fn.__name__[3:], error=error)(
                timeline.guard_call(self._guarded(fn, error)))

    def _guarded(self, fn, error):
        missing_device = self.missing_device

        def call(*args):
            try:
                r = fn(*args)
                return 0 if r is None else r
            except VerbsError as e:
                return e.errno or errno.EINVAL
            except OSError as e:
                return e.errno or errno.EIO
            except KeyError as e:
                if missing_device is None:
                    traceback.print_exc(file=sys.stderr)
                    return error
                print(f"{missing_device}: {e}", file=sys.stderr)
                return errno.ENODEV
            except Exception:                    # a bug here must not kill the program
                traceback.print_exc(file=sys.stderr)
                return error
        call.__name__ = fn.__name__
        return call
