"""Flow steering (``pyverbs.flow``): ``FlowAttr`` collects specs (``pyverbs.spec``);
``Flow`` would attach them to a raw packet QP.  softnic has no raw packet QPs and steers
no Ethernet traffic: ``Flow`` fails with EOPNOTSUPP, what libibverbs answers for a
provider without ``create_flow`` (rxe)."""

from __future__ import annotations

import errno

from . import enums as e
from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError


class FlowAttr(PyverbsObject):
    def __init__(self, num_of_specs=0, flow_type=e.IBV_FLOW_ATTR_NORMAL, priority=0, port=1,
                 flags=0):
        super().__init__()
        self.num_of_specs, self.type, self.priority = num_of_specs, flow_type, priority
        self.port, self.flags = port, flags
        self.specs = []


class FlowAction(PyverbsObject):
    """A flow's action (providers' direct-verbs actions derive from it)."""


class Flow(PyverbsCM):
    def __init__(self, qp, flow_attr):
        super().__init__()
        raise PyverbsRDMAError('Flow creation failed', errno.EOPNOTSUPP)


__all__ = ['FlowAttr', 'FlowAction', 'Flow']
