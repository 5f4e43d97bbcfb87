"""Tools for testing RDMA code on softnic.

``softnic.testing.strategies`` holds Hypothesis strategies (fault models,
exact drop patterns, work requests, QP attributes) and ``DropList``, a link
injector that drops the datagrams a test names.  The names are re-exported
here and imported on first use, so importing this package (or a module in
it) does not need Hypothesis; only the strategies do.
"""

from __future__ import annotations

import importlib

__all__ = [
    "fault_models", "loss_patterns", "work_requests", "qp_attrs",
    "DropList", "describe_datagram", "WorkRequest", "QPAttrs", "RC_OPCODES",
]

_HOME = {
    "DropList": "softnic.testing.droplist",
    "describe_datagram": "softnic.testing.droplist",
}


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_HOME.get(name, "softnic.testing.strategies"))
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
