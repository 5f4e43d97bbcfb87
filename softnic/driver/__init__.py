"""Drivers and live NICs: the engine run in real time.

``nic`` (a device per name, its socket and progress thread), ``config`` (the
SOFTNIC_* environment), ``env`` (numbers from it: blank means the default),
``faults`` (seeded fault models on what a NIC sends), ``capture`` (pcap of a
NIC's traffic) and ``rdmacm`` (rdma_cm over the live NICs, shared by both
faces).  The fabrics and sockets they drive over are in
``softnic.transport``; the compiled per-packet loops in ``softnic.accel``.
"""
