"""The verbs module the collectives run on.

The collectives use the pyverbs API and nothing else.  By default that is
softnic's implementation (``verbs_api``, what ``import pyverbs`` gives under
``softnic exec``); ``SOFTNIC_VERBS=pyverbs`` takes the machine's own rdma-core
pyverbs instead, so the same code drives a real RDMA device.
"""

from __future__ import annotations

import importlib
import os

_WANT = os.environ.get("SOFTNIC_VERBS", "softnic").lower()
if _WANT not in ("softnic", "pyverbs"):
    raise ValueError(f"SOFTNIC_VERBS must be 'softnic' or 'pyverbs', not {_WANT!r}")
#: the package the collectives run on: "verbs_api" (softnic's) or "pyverbs" (rdma-core's)
PKG = "pyverbs" if _WANT == "pyverbs" else "verbs_api"


def _m(name: str):
    return importlib.import_module(f"{PKG}.{name}")


e = _m("enums")
AHAttr = _m("addr").AHAttr
GID = _m("addr").GID
GlobalRoute = _m("addr").GlobalRoute
CQ = _m("cq").CQ
Context = _m("device").Context
get_device_list = _m("device").get_device_list
MR = _m("mr").MR
PD = _m("pd").PD
QP = _m("qp").QP
QPAttr = _m("qp").QPAttr
QPCap = _m("qp").QPCap
QPInitAttr = _m("qp").QPInitAttr
SGE = _m("wr").SGE
RecvWR = _m("wr").RecvWR
SendWR = _m("wr").SendWR
PyverbsError = _m("pyverbs_error").PyverbsError
