"""softnic's drop-in librdmacm.so.1: the C side (shim.c), the Python side
(backend.py), and how it is built (build.py) beside libibverbs.so.1 (launch.py)."""
