"""libibverbs constants in the old style (``import pyverbs.enums as e; e.IBV_QPT_RC``).

The same objects as ``libibverbs_enums``: module-level constants, and the
enum classes (``e.ibv_access_flags``) for code that iterates them.
"""

from .libibverbs_enums import *            # noqa: F401,F403
from .libibverbs_enums import __all__      # noqa: F401
