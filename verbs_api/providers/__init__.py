"""Provider direct-verbs modules (``pyverbs.providers``).

softnic is no mlx5 or EFA device.  These modules exist so that code importing them (as
rdma-core's test helpers do) loads; their constructors raise what pyverbs raises on a
device of another provider (``PyverbsUserError: This is not an MLX5 device``).
"""

from __future__ import annotations

from ..base import PyverbsObject
from ..pyverbs_error import PyverbsUserError


def not_this_device(name: str, provider: str, module: str):
    """A class ``name`` of a provider's pyverbs module, refusing on softnic's devices."""

    def __init__(self, *args, **kwargs):
        raise PyverbsUserError(f'This is not an {provider} device')

    return type(name, (PyverbsObject,), {'__init__': __init__, '__module__': module,
                                         '__doc__': f'{provider} only: refused on softnic.'})
