"""``pyverbs.providers.mlx5.dr_rule``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ...base import PyverbsObject
from .. import refuse


class DrRule(PyverbsObject):
    def __init__(self, matcher, value, actions=None):
        refuse('DrRule', 'MLX5')


__all__ = ['DrRule']
