"""Experiments over the engine, in virtual time, and the helper they share.

``rig``: connected QP pairs on two engine devices in one call.
``bottleneck``: incast through one switch (per-flow throughput, queues, the
controllers' rates) and one flow over a lossy link (go-back-N against selective
repeat).  ``cluster``: the collectives on a simulated leaf-spine (ECMP, PFC,
admission) and the PFC victim study.  Each experiment returns JSON-able results and
draws its plots; the ``softnic experiment`` command parses arguments and prints them.
"""
