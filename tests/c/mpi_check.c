/* An ordinary MPI program that checks every element it receives: point-to-point
 * (a ring of MPI_Sendrecv), MPI_Allreduce, MPI_Bcast, MPI_Alltoall, MPI_Allgather and
 * one-sided MPI_Put in a fence epoch, for message sizes from 1 element to MAX bytes
 * (powers of STEP).  Nothing in it knows about softnic.
 *
 *   mpi_check [MAX_BYTES [STEP]]       (default 4 MiB, 16)
 *   mpi_check --time-allreduce MAX_BYTES ITERS [SECONDS]
 *                                      prints "allreduce BYTES SECONDS" per size (rank 0):
 *                                      the mean of ITERS calls, or of as many as SECONDS
 *                                      holds where ITERS take less (rank 0's estimate)
 *
 * Prints "<collective> ok up to N bytes" lines and "all checked" from rank 0; any
 * mismatch aborts the job with a message naming the element. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static uint32_t *alloc(size_t n)
{
    uint32_t *p = calloc(n ? n : 1, 4);
    if (!p) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

static uint32_t val(int who, size_t i, int salt)
{
    return (uint32_t)(who * 2654435761u) ^ (uint32_t)(i * 40503u) ^ (uint32_t)(salt * 97u);
}

static void bad(const char *what, size_t n, size_t i, uint32_t got, uint32_t want)
{
    fprintf(stderr, "rank %d: %s with %zu elements: element %zu is %u, expected %u\n", rank,
            what, n, i, got, want);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void ring(size_t n, int salt)
{
    uint32_t *out = alloc(n), *in = alloc(n);
    int to = (rank + 1) % size, from = (rank + size - 1) % size;
    for (size_t i = 0; i < n; i++)
        out[i] = val(rank, i, salt);
    MPI_Sendrecv(out, (int)n, MPI_UINT32_T, to, 7, in, (int)n, MPI_UINT32_T, from, 7,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (size_t i = 0; i < n; i++)
        if (in[i] != val(from, i, salt))
            bad("Sendrecv", n, i, in[i], val(from, i, salt));
    free(out);
    free(in);
}

static void allreduce(size_t n, int salt)
{
    uint32_t *out = alloc(n), *in = alloc(n);
    for (size_t i = 0; i < n; i++)
        out[i] = val(rank, i, salt) & 0xffff;
    MPI_Allreduce(out, in, (int)n, MPI_UINT32_T, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++) {
        uint32_t want = 0;
        for (int r = 0; r < size; r++)
            want += val(r, i, salt) & 0xffff;
        if (in[i] != want)
            bad("Allreduce", n, i, in[i], want);
    }
    free(out);
    free(in);
}

static void bcast(size_t n, int salt)
{
    uint32_t *buf = alloc(n);
    int root = salt % size;
    for (size_t i = 0; i < n; i++)
        buf[i] = rank == root ? val(root, i, salt) : 0;
    MPI_Bcast(buf, (int)n, MPI_UINT32_T, root, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != val(root, i, salt))
            bad("Bcast", n, i, buf[i], val(root, i, salt));
    free(buf);
}

/* n: elements per rank */
static void alltoall(size_t n, int salt)
{
    uint32_t *out = alloc(n * size), *in = alloc(n * size);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            out[r * n + i] = val(rank * 64 + r, i, salt);
    MPI_Alltoall(out, (int)n, MPI_UINT32_T, in, (int)n, MPI_UINT32_T, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            if (in[r * n + i] != val(r * 64 + rank, i, salt))
                bad("Alltoall", n, r * n + i, in[r * n + i], val(r * 64 + rank, i, salt));
    free(out);
    free(in);
}

static void allgather(size_t n, int salt)
{
    uint32_t *out = alloc(n), *in = alloc(n * size);
    for (size_t i = 0; i < n; i++)
        out[i] = val(rank, i, salt);
    MPI_Allgather(out, (int)n, MPI_UINT32_T, in, (int)n, MPI_UINT32_T, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            if (in[r * n + i] != val(r, i, salt))
                bad("Allgather", n, r * n + i, in[r * n + i], val(r, i, salt));
    free(out);
    free(in);
}

/* each rank puts n elements into the window of the next rank, in one fence epoch */
static void put(size_t n, int salt)
{
    uint32_t *win_buf, *src = alloc(n);
    MPI_Win win;
    MPI_Win_allocate((MPI_Aint)(n * 4), 4, MPI_INFO_NULL, MPI_COMM_WORLD, &win_buf, &win);
    memset(win_buf, 0, n * 4);
    for (size_t i = 0; i < n; i++)
        src[i] = val(rank, i, salt + 1000);
    int to = (rank + 1) % size, from = (rank + size - 1) % size;
    MPI_Win_fence(0, win);
    MPI_Put(src, (int)n, MPI_UINT32_T, to, 0, (int)n, MPI_UINT32_T, win);
    MPI_Win_fence(0, win);
    for (size_t i = 0; i < n; i++)
        if (win_buf[i] != val(from, i, salt + 1000))
            bad("Put", n, i, win_buf[i], val(from, i, salt + 1000));
    MPI_Win_free(&win);
    free(src);
}

/* the mean time of iters calls of MPI_Allreduce on n elements */
static double allreduce_mean(uint32_t *out, uint32_t *in, size_t n, int iters)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++)
        MPI_Allreduce(out, in, (int)n, MPI_UINT32_T, MPI_SUM, MPI_COMM_WORLD);
    return (MPI_Wtime() - t0) / iters;
}

static void time_allreduce(size_t max, int iters, double seconds)
{
    for (size_t bytes = 4; bytes <= max; bytes *= 4) {
        size_t n = bytes / 4;
        uint32_t *out = alloc(n), *in = alloc(n);
        MPI_Allreduce(out, in, (int)n, MPI_UINT32_T, MPI_SUM, MPI_COMM_WORLD);   /* warm-up */
        double t = allreduce_mean(out, in, n, iters);
        /* ITERS calls as the warm-up, then as many as SECONDS holds, if more: the
           same count on every rank (rank 0's) */
        int more = seconds > 0 && t > 0 && seconds / t > iters ? (int)(seconds / t) : 0;
        MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (more)
            t = allreduce_mean(out, in, n, more);
        if (rank == 0)
            printf("allreduce %zu %.6f\n", bytes, t);
        free(out);
        free(in);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc >= 2 && !strcmp(argv[1], "--time-allreduce")) {
        time_allreduce(argc > 2 ? strtoul(argv[2], NULL, 0) : 1 << 20,
                       argc > 3 ? atoi(argv[3]) : 5, argc > 4 ? atof(argv[4]) : 0);
        MPI_Finalize();
        return 0;
    }
    size_t max = argc > 1 ? strtoul(argv[1], NULL, 0) : (4u << 20);
    size_t step = argc > 2 ? strtoul(argv[2], NULL, 0) : 16;
    struct { const char *name; void (*fn)(size_t, int); } tests[] = {
        {"Sendrecv ring", ring}, {"Allreduce", allreduce}, {"Bcast", bcast},
        {"Alltoall", alltoall}, {"Allgather", allgather}, {"Put (fence epoch)", put},
    };
    for (size_t t = 0; t < sizeof(tests) / sizeof(tests[0]); t++) {
        size_t last = 0;
        int salt = 1;
        for (size_t bytes = 4; bytes <= max; bytes *= step, salt++) {
            /* collectives that move size times the buffer get a per-rank share */
            size_t n = bytes / 4;
            if (tests[t].fn == alltoall || tests[t].fn == allgather)
                n = n / size ? n / size : 1;
            tests[t].fn(n, salt);
            last = bytes;
        }
        if (last != max) {                  /* the largest size itself, too */
            size_t n = max / 4;
            if (tests[t].fn == alltoall || tests[t].fn == allgather)
                n = n / size ? n / size : 1;
            tests[t].fn(n, salt);
            last = max;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            printf("%s ok up to %zu bytes, %d ranks\n", tests[t].name, last, size);
            fflush(stdout);
        }
    }
    if (rank == 0)
        printf("all checked\n");
    MPI_Finalize();
    return 0;
}
