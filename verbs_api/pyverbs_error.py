"""pyverbs' exception classes (``pyverbs.pyverbs_error``)."""

import os


class PyverbsError(Exception):
    """Base class: PyverbsRDMAError for errors of the verbs layer, PyverbsUserError
    for a misuse that pyverbs itself detects (a missing device name, ...)."""

    def __init__(self, msg, error_code=-1):
        if error_code != -1:
            msg = f"{msg}. Errno: {error_code}, {os.strerror(error_code)}"
        super().__init__(msg)


class PyverbsRDMAError(PyverbsError):
    """A verbs call failed; ``error_code`` is its errno (-1 if it gave none)."""

    def __init__(self, msg, error_code=-1):
        super().__init__(msg, error_code)
        self._error_code = error_code

    @property
    def error_code(self):
        return self._error_code


class PyverbsUserError(PyverbsError):
    """The caller passed something pyverbs cannot use."""

    def __init__(self, msg):
        super().__init__(msg)
