"""Provider direct-verbs modules (``pyverbs.providers``).

softnic is no mlx5 or EFA device.  These modules exist so that code importing them (as
rdma-core's test modules do) loads, with pyverbs' names and signatures; the provider's
context refuses as pyverbs does on a device of another provider (mlx5's with
``PyverbsUserError: This is not an MLX5 device``; EFA's opens, and its queries fail), the
provider's objects as its direct-verbs calls do on another vendor's context
(EOPNOTSUPP), and attribute classes hold what they are given.
"""

from __future__ import annotations

import errno

from ..pyverbs_error import PyverbsRDMAError


def refuse(name: str, provider: str):
    """What creating ``name`` of a provider's pyverbs module raises on softnic: its
    direct-verbs call fails with EOPNOTSUPP, as it does on another vendor's context."""
    raise PyverbsRDMAError(f'{name}: this is not an {provider} device', errno.EOPNOTSUPP)
