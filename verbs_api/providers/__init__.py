"""Provider direct-verbs modules (``pyverbs.providers``).

softnic is no mlx5 or EFA device.  These modules exist so that code importing them (as
rdma-core's test modules do) loads, with pyverbs' names and signatures; the provider's
context refuses as pyverbs does on a device of another provider (``PyverbsUserError: This
is not an MLX5 device``), the provider's objects as its direct-verbs calls do on another
vendor's context (EOPNOTSUPP), and attribute classes hold what they are given.
"""

from __future__ import annotations

import errno

from ..base import PyverbsObject
from ..pyverbs_error import PyverbsRDMAError, PyverbsUserError


def not_this_device(name: str, provider: str, module: str):
    """A class ``name`` of a provider's pyverbs module, refusing on softnic's devices."""

    def __init__(self, *args, **kwargs):
        raise PyverbsUserError(f'This is not an {provider} device')

    return type(name, (PyverbsObject,), {'__init__': __init__, '__module__': module,
                                         '__doc__': f'{provider} only: refused on softnic.'})


def refuse(name: str, provider: str):
    """What creating ``name`` of a provider's pyverbs module raises on softnic: its
    direct-verbs call fails with EOPNOTSUPP, as it does on another vendor's context."""
    raise PyverbsRDMAError(f'{name}: this is not an {provider} device', errno.EOPNOTSUPP)
