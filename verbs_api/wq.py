"""Work queues and RSS indirection tables (``pyverbs.wq``).  The attribute classes hold
what they are given; ``WQ`` and ``RwqIndTable`` fail with EOPNOTSUPP, what libibverbs
answers for a provider without ``create_wq`` / ``create_rwq_ind_table`` (rxe): softnic's
receive queues are its QPs' and SRQs', with no receive-side scaling across them."""

from __future__ import annotations

import errno

from . import enums as e
from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError


class WQInitAttr(PyverbsObject):
    def __init__(self, wq_context=None, wq_pd=None, wq_cq=None, wq_type=e.IBV_WQT_RQ,
                 max_wr=100, max_sge=1, comp_mask=0, create_flags=0):
        super().__init__()
        self.wq_context, self.pd, self.cq, self.wq_type = wq_context, wq_pd, wq_cq, wq_type
        self.max_wr, self.max_sge = max_wr, max_sge
        self.comp_mask, self.create_flags = comp_mask, create_flags


class WQAttr(PyverbsObject):
    def __init__(self, attr_mask=0, wq_state=0, curr_wq_state=0, flags=0, flags_mask=0):
        super().__init__()
        self.attr_mask, self.wq_state, self.curr_wq_state = attr_mask, wq_state, curr_wq_state
        self.flags, self.flags_mask = flags, flags_mask


class WQ(PyverbsCM):
    def __init__(self, ctx, attr):
        super().__init__()
        raise PyverbsRDMAError('Failed to create WQ', errno.EOPNOTSUPP)


class RwqIndTableInitAttr(PyverbsObject):
    def __init__(self, log_ind_tbl_size=5, wqs_list=None, comp_mask=0):
        super().__init__()
        self.log_ind_tbl_size, self.comp_mask = log_ind_tbl_size, comp_mask
        self.wqs_list = list(wqs_list or [])


class RwqIndTable(PyverbsCM):
    def __init__(self, ctx, attr):
        super().__init__()
        raise PyverbsRDMAError('Failed to create RwqIndTable', errno.EOPNOTSUPP)


class RxHashConf(PyverbsObject):
    def __init__(self, rx_hash_function=0, rx_hash_key_len=0, rx_hash_key=None,
                 rx_hash_fields_mask=0):
        super().__init__()
        self.rx_hash_function, self.rx_hash_key_len = rx_hash_function, rx_hash_key_len
        self.rx_hash_key = list(rx_hash_key or [])
        self.rx_hash_fields_mask = rx_hash_fields_mask


__all__ = ['WQInitAttr', 'WQAttr', 'WQ', 'RwqIndTableInitAttr', 'RwqIndTable', 'RxHashConf']
