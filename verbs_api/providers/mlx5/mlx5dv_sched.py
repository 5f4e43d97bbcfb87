"""``pyverbs.providers.mlx5.mlx5dv_sched``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ...base import PyverbsObject
from .. import refuse


class Mlx5dvSchedAttr(PyverbsObject):
    def __init__(self, parent_sched_node=None, bw_share=0, max_avg_bw=0, flags=0, comp_mask=0):
        super().__init__()
        self.parent_sched_node = parent_sched_node
        self.bw_share = bw_share
        self.max_avg_bw = max_avg_bw
        self.flags = flags
        self.comp_mask = comp_mask


class Mlx5dvSchedNode(PyverbsObject):
    def __init__(self, context, sched_attr):
        refuse('Mlx5dvSchedNode', 'MLX5')


class Mlx5dvSchedLeaf(PyverbsObject):
    def __init__(self, context, sched_attr):
        refuse('Mlx5dvSchedLeaf', 'MLX5')


__all__ = ['Mlx5dvSchedAttr',
           'Mlx5dvSchedNode',
           'Mlx5dvSchedLeaf']
