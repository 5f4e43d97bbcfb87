"""``pyverbs.providers.mlx5.mlx5dv_flow``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ... import libibverbs_enums as e
from ...base import PyverbsObject
from .. import refuse
from . import mlx5_enums as dve


class Mlx5FlowMatchParameters(PyverbsObject):
    def __init__(self, size, values):
        super().__init__()
        self.size = size
        self.values = values


class Mlx5FlowMatcherAttr(PyverbsObject):
    def __init__(self, match_mask, attr_type=e.IBV_FLOW_ATTR_NORMAL, flags=0, priority=0,
                 match_criteria_enable=0, comp_mask=0, ft_type=0, ib_port=0):
        super().__init__()
        self.match_mask = match_mask
        self.attr_type = attr_type
        self.flags = flags
        self.priority = priority
        self.match_criteria_enable = match_criteria_enable
        self.comp_mask = comp_mask
        self.ft_type = ft_type
        self.ib_port = ib_port


class Mlx5FlowMatcher(PyverbsObject):
    def __init__(self, context, attr):
        refuse('Mlx5FlowMatcher', 'MLX5')


class Mlx5PacketReformatFlowAction(PyverbsObject):
    def __init__(self, context, data=None,
                 reformat_type=dve.MLX5DV_FLOW_ACTION_PACKET_REFORMAT_TYPE_L2_TUNNEL_TO_L2_,
                 ft_type=dve.MLX5DV_FLOW_TABLE_TYPE_NIC_RX_):
        refuse('Mlx5PacketReformatFlowAction', 'MLX5')


class Mlx5ModifyFlowAction(PyverbsObject):
    def __init__(self, ctx, ft_type=dve.MLX5DV_FLOW_TABLE_TYPE_NIC_RX_, actions=None):
        refuse('Mlx5ModifyFlowAction', 'MLX5')


class Mlx5FlowActionAttr(PyverbsObject):
    def __init__(self, action_type=None, qp=None, flow_action=None, obj=None, offset=0):
        super().__init__()
        self.action_type = action_type
        self.qp = qp
        self.flow_action = flow_action
        self.obj = obj
        self.offset = offset


class Mlx5Flow(PyverbsObject):
    def __init__(self, matcher, match_value, action_attrs=None, num_actions=0):
        refuse('Mlx5Flow', 'MLX5')


__all__ = ['Mlx5FlowMatchParameters',
           'Mlx5FlowMatcherAttr',
           'Mlx5FlowMatcher',
           'Mlx5PacketReformatFlowAction',
           'Mlx5ModifyFlowAction',
           'Mlx5FlowActionAttr',
           'Mlx5Flow']
