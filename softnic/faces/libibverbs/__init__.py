"""softnic's drop-in libibverbs.so.1: the C side (shim.c, embed.c, preload.c), the
Python side (backend.py), and how it is built (build.py) and put in front of a
program (launch.py)."""
