"""``pyverbs.providers.efa.efadv``, with the names and signatures of rdma-core's pyverbs.

softnic is no EFA device, and its answers are pyverbs' on another vendor's device:
``EfaContext`` opens the device (it is a Context) and its ``query_efa_device`` fails with
EOPNOTSUPP, as efadv's calls do on another vendor's context; ``EfaAH`` and ``EfaMR`` are
an AH and an MR whose EFA queries fail so; ``SRDQP``, ``SRDQPEx`` and ``EfaCQ`` (made by
efadv's create calls) fail with EOPNOTSUPP; the attribute classes hold their fields, and
``dev_cap_to_str`` names capability bits as pyverbs' does."""

from __future__ import annotations

import errno

from ...addr import AH
from ...base import PyverbsObject
from ...device import Context
from ...mr import MR
from ...pyverbs_error import PyverbsRDMAError
from .. import refuse
from . import efa_enums as dve


class EfaContext(Context):
    def __init__(self, name=''):
        super().__init__(name=name)

    def query_efa_device(self):
        raise PyverbsRDMAError(f'Failed to query efa device {self.name}', errno.EOPNOTSUPP)


class EfaDVDeviceAttr(PyverbsObject):
    def __init__(self):
        super().__init__()
        self.comp_mask = self.max_sq_wr = self.max_rq_wr = self.max_sq_sge = 0
        self.max_rq_sge = self.inline_buf_size = self.inline_buf_size_ex = 0
        self.device_caps = self.max_rdma_size = 0


class EfaDVAHAttr(PyverbsObject):
    def __init__(self):
        super().__init__()
        self.comp_mask = self.ahn = 0


class EfaAH(AH):
    def query_efa_ah(self):
        raise PyverbsRDMAError('Failed to query efa ah', errno.EOPNOTSUPP)


class SRDQP(PyverbsObject):
    def __init__(self, pd, init_attr):
        refuse('SRDQP', 'EFA')


class EfaQPInitAttr(PyverbsObject):
    def __init__(self):
        super().__init__()
        self.comp_mask = self.driver_qp_type = self.flags = self.sl = self.wr_flags = 0


class SRDQPEx(PyverbsObject):
    def __init__(self, ctx, attr_ex, efa_init_attr):
        refuse('SRDQPEx', 'EFA')


class EfaDVCQInitAttr(PyverbsObject):
    def __init__(self, wc_flags=0):
        super().__init__()
        self.comp_mask, self.wc_flags = 0, wc_flags


class EfaCQ(PyverbsObject):
    def __init__(self, ctx, attr_ex, efa_init_attr):
        refuse('EfaCQ', 'EFA')


class EfaDVMRAttr(PyverbsObject):
    def __init__(self):
        super().__init__()
        self.comp_mask = self.ic_id_validity = 0
        self.recv_ic_id = self.rdma_read_ic_id = self.rdma_recv_ic_id = 0


class EfaMR(MR):
    def query(self):
        raise PyverbsRDMAError('Failed to query EFA MR', errno.EOPNOTSUPP)


class EfaDVSQDepthAttr(PyverbsObject):
    def __init__(self):
        super().__init__()
        self.comp_mask = self.flags = self.max_send_wr = self.max_send_sge = 0
        self.max_inline_data = 0


class EfaDVRQDepthAttr(PyverbsObject):
    def __init__(self):
        super().__init__()
        self.comp_mask = self.max_recv_wr = self.max_recv_sge = 0


def bitmask_to_str(bits, values):
    """The names of ``bits``' known bits (``??(x)`` for the rest, ``None`` for none),
    then the number in hex."""
    names, rest = [], bits
    for bit, name in sorted(values.items()):
        if bits & bit:
            names.append(name)
            rest &= ~bit
    if rest:
        names.append(f'??({rest:x})')
    return ', '.join(names or ['None']) + f' ({bits:x})'


def dev_cap_to_str(flags):
    return bitmask_to_str(flags, {
        dve.EFADV_DEVICE_ATTR_CAPS_RDMA_READ: 'RDMA Read',
        dve.EFADV_DEVICE_ATTR_CAPS_RNR_RETRY: 'RNR Retry',
        dve.EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID: 'CQ entries with source GID',
        dve.EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE: 'RDMA Write',
        dve.EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV: 'Unsolicited RDMA Write receive'})


__all__ = ['EfaContext', 'EfaDVDeviceAttr', 'EfaDVAHAttr', 'EfaAH', 'SRDQP', 'EfaQPInitAttr',
           'SRDQPEx', 'EfaDVCQInitAttr', 'EfaCQ', 'EfaDVMRAttr', 'EfaMR', 'EfaDVSQDepthAttr',
           'EfaDVRQDepthAttr', 'bitmask_to_str', 'dev_cap_to_str']
