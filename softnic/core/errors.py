"""Exceptions raised by the engine for local misuse.

A verbs call that is refused raises ``VerbsError`` carrying the errno the
kernel (and so pyverbs) would give.  Misbehaviour from the network never
raises: bad packets are counted and dropped, protocol errors become NAKs and
work-completion statuses.
"""

import errno as _errno


class VerbsError(Exception):
    def __init__(self, errno: int, message: str):
        super().__init__(f"{message} [errno {errno}: {_errno.errorcode.get(errno, '?')}]")
        self.errno = errno
        self.message = message


def einval(msg: str) -> VerbsError:
    return VerbsError(_errno.EINVAL, msg)


def enomem(msg: str) -> VerbsError:
    return VerbsError(_errno.ENOMEM, msg)


def ebusy(msg: str) -> VerbsError:
    return VerbsError(_errno.EBUSY, msg)
