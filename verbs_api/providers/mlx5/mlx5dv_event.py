"""``pyverbs.providers.mlx5.mlx5dv_event``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ...base import PyverbsObject
from .. import refuse


class EventChannel(PyverbsObject):
    def __init__(self, context, flags=0):
        refuse('EventChannel', 'MLX5')


class EventHeader(PyverbsObject):
    def __init__(self, cookie, data):
        super().__init__()
        self.cookie = cookie
        self.data = data


class EventFD(PyverbsObject):
    def __init__(self, initval=0, flags=0):
        refuse('EventFD', 'MLX5')


__all__ = ['EventChannel',
           'EventHeader',
           'EventFD']
