"""The tools people run: the ``softnic`` command and its subcommands.

``main`` (the command), ``demo``, ``devinfo``, ``perf`` and
``perf_collectives``, ``labs``, ``ladder`` (``softnic trace``; the ladder itself
is ``softnic.trace``), ``experiment_cli`` (``softnic experiment``; the
experiments are ``softnic.experiments``), ``sweep``, ``launch``.  Nothing below
this layer imports it (``tools/import_graph.py``).
"""

from .main import main

__all__ = ["main"]
