"""The faces programs use, besides ``verbs_api`` (the pyverbs API).

``libibverbs`` and ``librdmacm`` are the drop-in C libraries (a C side and its
Python backend, built with cffi); ``pyverbs_shim`` is the hook that makes
``import pyverbs`` resolve to ``verbs_api`` under ``softnic exec``.
``availability.face_status()`` says which of them this machine can offer and what
to install for the others.
"""
