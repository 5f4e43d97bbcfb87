"""``pyverbs.providers.mlx5.dr_action``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ...base import PyverbsObject
from .. import refuse
from . import mlx5_enums as dve


class DrAction(PyverbsObject):
    def __init__(self):
        super().__init__()


class DrActionQp(PyverbsObject):
    def __init__(self, qp):
        refuse('DrActionQp', 'MLX5')


class DrActionFlowCounter(PyverbsObject):
    def __init__(self, devx_obj, offset=0):
        refuse('DrActionFlowCounter', 'MLX5')


class DrActionDrop(PyverbsObject):
    def __init__(self):
        refuse('DrActionDrop', 'MLX5')


class DrActionModify(PyverbsObject):
    def __init__(self, domain, flags=0, actions=None):
        refuse('DrActionModify', 'MLX5')


class DrActionTag(PyverbsObject):
    def __init__(self, tag):
        refuse('DrActionTag', 'MLX5')


class DrActionDestTable(PyverbsObject):
    def __init__(self, table):
        refuse('DrActionDestTable', 'MLX5')


class DrActionPopVLan(PyverbsObject):
    def __init__(self):
        refuse('DrActionPopVLan', 'MLX5')


class DrActionPushVLan(PyverbsObject):
    def __init__(self, domain, vlan_hdr):
        refuse('DrActionPushVLan', 'MLX5')


class DrActionDestAttr(PyverbsObject):
    def __init__(self, action_type, dest, reformat=None):
        refuse('DrActionDestAttr', 'MLX5')


class DrActionDestArray(PyverbsObject):
    def __init__(self, domain, actions_num, dest_actions):
        refuse('DrActionDestArray', 'MLX5')


class DrActionDefMiss(PyverbsObject):
    def __init__(self):
        refuse('DrActionDefMiss', 'MLX5')


class DrActionVPort(PyverbsObject):
    def __init__(self, domain, vport):
        refuse('DrActionVPort', 'MLX5')


class DrActionIBPort(PyverbsObject):
    def __init__(self, domain, ib_port):
        refuse('DrActionIBPort', 'MLX5')


class DrActionDestTir(PyverbsObject):
    def __init__(self, devx_tir):
        refuse('DrActionDestTir', 'MLX5')


class DrActionPacketReformat(PyverbsObject):
    def __init__(self, domain, flags=0,
                 reformat_type=dve.MLX5DV_FLOW_ACTION_PACKET_REFORMAT_TYPE_L2_TUNNEL_TO_L2_,
                 data=None):
        refuse('DrActionPacketReformat', 'MLX5')


class DrFlowSamplerAttr(PyverbsObject):
    def __init__(self, sample_ratio, default_next_table, sample_actions, action=None):
        super().__init__()
        self.sample_ratio = sample_ratio
        self.default_next_table = default_next_table
        self.sample_actions = sample_actions
        self.action = action


class DrActionFlowSample(PyverbsObject):
    def __init__(self, attr):
        refuse('DrActionFlowSample', 'MLX5')


class DrFlowMeterAttr(PyverbsObject):
    def __init__(self, next_table, active=1, reg_c_index=0, flow_meter_parameter=None):
        super().__init__()
        self.next_table = next_table
        self.active = active
        self.reg_c_index = reg_c_index
        self.flow_meter_parameter = flow_meter_parameter


class DrActionFlowMeter(PyverbsObject):
    def __init__(self, attr):
        refuse('DrActionFlowMeter', 'MLX5')


__all__ = ['DrAction',
           'DrActionQp',
           'DrActionFlowCounter',
           'DrActionDrop',
           'DrActionModify',
           'DrActionTag',
           'DrActionDestTable',
           'DrActionPopVLan',
           'DrActionPushVLan',
           'DrActionDestAttr',
           'DrActionDestArray',
           'DrActionDefMiss',
           'DrActionVPort',
           'DrActionIBPort',
           'DrActionDestTir',
           'DrActionPacketReformat',
           'DrFlowSamplerAttr',
           'DrActionFlowSample',
           'DrFlowMeterAttr',
           'DrActionFlowMeter']
