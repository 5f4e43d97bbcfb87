"""What a Python program sees of its own environment, as one line of JSON: its sys.path,
the cffi and numpy it imports (version and file) and whether cffi works with its
``_cffi_backend``, and which of softnic's dependencies it can import.  test_program_env.py
runs it with Debian's /usr/bin/python3, with and without ``softnic exec``:

    python3 host_modules.py probe            nothing else: the reference
    python3 host_modules.py ibverbs          libibverbs.so.1 (ctypes) lists and opens a
                                             device, then registers a numpy array
    mpirun -np N python3 host_modules.py mpi MPI_Init loads libibverbs through UCX; then
                                             mpi4py 3.1.4's test_cffi checks, a Sendrecv
                                             ring and rank 0's line

In the last two, softnic's engine starts in this interpreter before cffi and numpy are
imported.
"""

import ctypes
import importlib.util
import json
import sys

mode = sys.argv[1]
out = {}
if mode == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
elif mode == "ibverbs":
    ibv = ctypes.CDLL("libibverbs.so.1")
    ibv.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    ibv.ibv_get_device_name.restype = ctypes.c_char_p
    ibv.ibv_get_device_name.argtypes = [ctypes.c_void_p]
    n = ctypes.c_int()
    devices = ibv.ibv_get_device_list(ctypes.byref(n))
    out["devices"] = [ibv.ibv_get_device_name(devices[i]).decode() for i in range(n.value)]

import cffi  # noqa: E402
import numpy  # noqa: E402

out["cffi"] = [cffi.__version__, cffi.__file__]
out["numpy"] = [numpy.__version__, numpy.__file__]
out["ffi_works"] = cffi.FFI().cast("int", 7) == 7          # fails on a mismatched backend
out["path"] = sys.path
out["importable"] = sorted(m for m in ("crc32c", "isal", "scapy", "greenlet", "hypothesis",
                                       "softnic", "verbs_api", "congestion")
                           if m not in sys.modules and importlib.util.find_spec(m))
out["loaded"] = sorted(m for m in ("crc32c", "isal", "scapy", "softnic") if m in sys.modules)

if mode == "ibverbs":
    class MR(ctypes.Structure):
        _fields_ = [("context", ctypes.c_void_p), ("pd", ctypes.c_void_p),
                    ("addr", ctypes.c_void_p), ("length", ctypes.c_size_t),
                    ("handle", ctypes.c_uint32), ("lkey", ctypes.c_uint32),
                    ("rkey", ctypes.c_uint32)]
    for name, res, args in (("ibv_open_device", ctypes.c_void_p, [ctypes.c_void_p]),
                            ("ibv_alloc_pd", ctypes.c_void_p, [ctypes.c_void_p]),
                            ("ibv_reg_mr", ctypes.POINTER(MR), [ctypes.c_void_p, ctypes.c_void_p,
                                                                ctypes.c_size_t, ctypes.c_int]),
                            ("ibv_dereg_mr", ctypes.c_int, [ctypes.c_void_p]),
                            ("ibv_dealloc_pd", ctypes.c_int, [ctypes.c_void_p]),
                            ("ibv_close_device", ctypes.c_int, [ctypes.c_void_p])):
        getattr(ibv, name).restype, getattr(ibv, name).argtypes = res, args
    ctx = ibv.ibv_open_device(devices[0])
    pd = ibv.ibv_alloc_pd(ctx)
    buf = numpy.arange(4096, dtype=numpy.uint32)
    mr = ibv.ibv_reg_mr(pd, buf.ctypes.data, buf.nbytes, 7)    # local write, remote w/r
    out["mr"] = [mr.contents.addr == buf.ctypes.data, mr.contents.length == buf.nbytes]
    out["closed"] = [ibv.ibv_dereg_mr(ctypes.cast(mr, ctypes.c_void_p)),
                     ibv.ibv_dealloc_pd(pd), ibv.ibv_close_device(ctx)]
elif mode == "mpi":
    # mpi4py 3.1.4, test/test_cffi.py: testHandleAddress and testHandleValue
    mpitypes = [MPI.Datatype, MPI.Request, MPI.Info, MPI.Errhandler, MPI.Group, MPI.Win,
                MPI.Op, MPI.File, MPI.Message, MPI.Comm]
    objects = [MPI.DATATYPE_NULL, MPI.INT, MPI.DOUBLE, MPI.REQUEST_NULL, MPI.INFO_NULL,
               MPI.INFO_ENV, MPI.ERRHANDLER_NULL, MPI.ERRORS_RETURN, MPI.ERRORS_ARE_FATAL,
               MPI.GROUP_NULL, MPI.GROUP_EMPTY, MPI.WIN_NULL, MPI.OP_NULL, MPI.SUM, MPI.MIN,
               MPI.MAX, MPI.FILE_NULL, MPI.MESSAGE_NULL, MPI.MESSAGE_NO_PROC, MPI.COMM_NULL,
               MPI.COMM_SELF, MPI.COMM_WORLD]
    ffi = cffi.FFI()
    typemap = {ffi.sizeof("int"): "int", ffi.sizeof("void*"): "void*"}
    for tp in mpitypes:
        ffi.cdef(f"typedef {typemap[MPI._sizeof(tp)]} MPI_{tp.__name__.rsplit('.', 1)[-1]};")
    same = []
    for obj in objects:
        mpi_t = "MPI_Comm" if isinstance(obj, MPI.Comm) else \
            "MPI_" + type(obj).__name__.rsplit(".", 1)[-1]
        new = type(obj)()
        ffi.cast(mpi_t + "*", MPI._addressof(new))[0] = \
            ffi.cast(mpi_t + "*", MPI._addressof(obj))[0]
        same.append(new == obj)
    ffi = cffi.FFI()
    uint = {ffi.sizeof("uint32_t"): "uint32_t", ffi.sizeof("uint64_t"): "uint64_t"}
    values = [ffi.cast(uint[MPI._sizeof(obj)] + "*", MPI._addressof(obj))[0]
              == MPI._handleof(obj) for obj in objects]
    out["test_cffi"] = [all(same), all(values), len(objects)]
    rank, size = comm.Get_rank(), comm.Get_size()
    got = comm.sendrecv(numpy.full(1024, rank), dest=(rank + 1) % size,
                        source=(rank - 1) % size)
    out["ring"] = bool((got == (rank - 1) % size).all())
    if rank:
        sys.exit(0)
print(json.dumps(out), flush=True)
