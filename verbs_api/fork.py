"""``pyverbs.fork``: ibv_fork_init and ibv_is_fork_initialized.

softnic never pins memory (the engine reaches an MR through the process's own mapping),
so a child of fork() cannot corrupt a registration: fork support is unneeded, as
libibverbs reports on kernels with copy-on-fork for pinned pages.
"""

from . import enums as e


def fork_init():
    """ibv_fork_init: nothing to set up (returns as libibverbs does when it is unneeded)."""
    return None


def is_fork_initialized():
    return e.IBV_FORK_UNNEEDED
