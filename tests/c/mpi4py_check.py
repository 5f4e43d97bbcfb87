"""The collectives of mpi_check.c from Python with mpi4py (Debian's python3-mpi4py, run
by Debian's /usr/bin/python3): Sendrecv ring, Allreduce, Bcast, Alltoall, Allgather and
Put in a fence epoch, every element checked, sizes from 1 element to MAX bytes.
Standard library only (array), so it runs in an interpreter without numpy.

    mpirun -np N python3 mpi4py_check.py [MAX_BYTES [STEP]]
"""

import sys
from array import array

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def val(who, i, salt):
    return ((who * 2654435761) ^ (i * 40503) ^ (salt * 97)) & 0xFFFFFFFF


def check(what, got, want):
    if got != want:
        i = next(k for k in range(len(want)) if got[k] != want[k])
        sys.stderr.write(f"rank {rank}: {what} with {len(want)} elements: element {i} is "
                         f"{got[i]}, expected {want[i]}\n")
        comm.Abort(1)


def vec(who, n, salt, mask=0xFFFFFFFF):
    return array("I", (val(who, i, salt) & mask for i in range(n)))


def ring(n, salt):
    to, frm = (rank + 1) % size, (rank - 1) % size
    out, into = vec(rank, n, salt), array("I", bytes(4 * n))
    comm.Sendrecv([out, MPI.UINT32_T], to, 7, [into, MPI.UINT32_T], frm, 7)
    check("Sendrecv", into, vec(frm, n, salt))


def allreduce(n, salt):
    out, into = vec(rank, n, salt, 0xFFFF), array("I", bytes(4 * n))
    comm.Allreduce([out, MPI.UINT32_T], [into, MPI.UINT32_T], op=MPI.SUM)
    want = array("I", (sum(val(r, i, salt) & 0xFFFF for r in range(size)) for i in range(n)))
    check("Allreduce", into, want)


def bcast(n, salt):
    root = salt % size
    buf = vec(root, n, salt) if rank == root else array("I", bytes(4 * n))
    comm.Bcast([buf, MPI.UINT32_T], root=root)
    check("Bcast", buf, vec(root, n, salt))


def alltoall(n, salt):
    out = array("I")
    for r in range(size):
        out.extend(vec(rank * 64 + r, n, salt))
    into = array("I", bytes(4 * n * size))
    comm.Alltoall([out, MPI.UINT32_T], [into, MPI.UINT32_T])
    want = array("I")
    for r in range(size):
        want.extend(vec(r * 64 + rank, n, salt))
    check("Alltoall", into, want)


def allgather(n, salt):
    out, into = vec(rank, n, salt), array("I", bytes(4 * n * size))
    comm.Allgather([out, MPI.UINT32_T], [into, MPI.UINT32_T])
    want = array("I")
    for r in range(size):
        want.extend(vec(r, n, salt))
    check("Allgather", into, want)


def put(n, salt):
    win = MPI.Win.Allocate(4 * n, 4, comm=comm)
    mem = memoryview(win.tomemory()).cast("B")
    mem[:] = bytes(len(mem))
    src = vec(rank, n, salt + 1000)
    to, frm = (rank + 1) % size, (rank - 1) % size
    win.Fence()
    win.Put([src, MPI.UINT32_T], to)
    win.Fence()
    check("Put", array("I", mem.tobytes()), vec(frm, n, salt + 1000))
    win.Free()


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
    step = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    sizes = []
    b = 4
    while b <= top:
        sizes.append(b)
        b *= step
    if sizes[-1] != top:
        sizes.append(top)
    for name, fn, per_rank in (("Sendrecv ring", ring, False), ("Allreduce", allreduce, False),
                               ("Bcast", bcast, False), ("Alltoall", alltoall, True),
                               ("Allgather", allgather, True), ("Put (fence epoch)", put, False)):
        for salt, nbytes in enumerate(sizes, 1):
            n = nbytes // 4
            if per_rank:
                n = max(1, n // size)
            fn(n, salt)
        comm.Barrier()
        if rank == 0:
            print(f"{name} ok up to {sizes[-1]} bytes, {size} ranks", flush=True)
    if rank == 0:
        print(f"all checked (mpi4py {__import__('mpi4py').__version__}, Python "
              f"{sys.version.split()[0]} at {sys.executable})", flush=True)


main()
