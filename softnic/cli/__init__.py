"""The tools people run: the ``softnic`` command and its subcommands.

``main`` (the command), ``demo``, ``devinfo``, ``perf`` and
``perf_collectives``, ``labs``, ``ladder`` (``softnic trace``), ``experiments``,
``cluster`` and ``experiment_cli`` (``softnic experiment``), ``launch`` and
``rig`` (connected QP pairs in one call).
"""

from .main import main

__all__ = ["main"]
