"""``pyverbs.providers.efa.efadv``: its classes, each refusing on softnic (not an EFA device)."""

from .. import not_this_device

_NAMES = ['EfaAH', 'EfaCQ', 'EfaContext', 'EfaDVAHAttr', 'EfaDVCQInitAttr', 'EfaDVDeviceAttr', 'EfaQPInitAttr', 'SRDQP', 'SRDQPEx']

for _n in _NAMES:
    globals()[_n] = not_this_device(_n, 'EFA', __name__)

__all__ = list(_NAMES)
