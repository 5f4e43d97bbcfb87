/* libsoftnic_preload.so: what `softnic exec` preloads (LD_PRELOAD) into every program
 * of the process tree it starts, so that middleware which checks for the kernel's
 * verbs device files finds softnic's devices usable.
 *
 * UCX (src/uct/ib/base/ib_md.c, uct_ib_device_is_accessible) uses a device only if
 * "/dev/infiniband/" + ibv_device.dev_name is a character device that the process
 * may read and write (stat, S_ISCHR, access(R_OK|W_OK)); containers and machines
 * without RDMA hardware have no /dev/infiniband.  softnic's devices are named
 * uverbs0, uverbs1, ... as the kernel's; where such a path does not exist, stat
 * answers for it as for a character device (major 231, as the kernel's uverbs) and
 * access grants read and write.  Nothing else is touched: paths that exist are the
 * real ones, and no process opens them (softnic's libibverbs never does).
 *
 * No Python and no state: it costs a string compare per stat/access. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define SN_PREFIX "/dev/infiniband/uverbs"
#define SN_EXPORT __attribute__((visibility("default")))

/* the index N of "/dev/infiniband/uverbsN", or -1 */
static int sn_uverbs_index(const char *path)
{
    char *end;
    if (!path || strncmp(path, SN_PREFIX, sizeof(SN_PREFIX) - 1) != 0)
        return -1;
    const char *num = path + sizeof(SN_PREFIX) - 1;
    if (*num < '0' || *num > '9')
        return -1;
    long n = strtol(num, &end, 10);
    return (*end == 0 && n < 64) ? (int)n : -1;
}

static void sn_fake_stat(struct stat *st, int index)
{
    memset(st, 0, sizeof(*st));
    st->st_mode = S_IFCHR | 0666;
    st->st_rdev = makedev(231, 192 + index);
    st->st_nlink = 1;
    st->st_blksize = 4096;
}

typedef int (*sn_stat_fn)(const char *, struct stat *);
typedef int (*sn_access_fn)(const char *, int);

SN_EXPORT int stat(const char *path, struct stat *st)
{
    static sn_stat_fn real;
    if (!real)
        real = (sn_stat_fn)dlsym(RTLD_NEXT, "stat");
    int r = real ? real(path, st) : (errno = ENOSYS, -1);
    int idx;
    if (r != 0 && errno == ENOENT && (idx = sn_uverbs_index(path)) >= 0) {
        sn_fake_stat(st, idx);
        return 0;
    }
    return r;
}

SN_EXPORT int stat64(const char *path, struct stat64 *st)
{
    return stat(path, (struct stat *)st);       /* one layout on 64-bit Linux */
}

SN_EXPORT int access(const char *path, int mode)
{
    static sn_access_fn real;
    if (!real)
        real = (sn_access_fn)dlsym(RTLD_NEXT, "access");
    int r = real ? real(path, mode) : (errno = ENOSYS, -1);
    if (r != 0 && errno == ENOENT && sn_uverbs_index(path) >= 0 && !(mode & X_OK))
        return 0;
    return r;
}

/* ------------------------------------------------------------------ MPI from Python
 *
 * A Python MPI binding may call MPI_Init and MPI_Finalize holding the interpreter lock
 * (mpi4py does: MPI_Init_thread runs when mpi4py.MPI is imported).  Inside, UCX's
 * ucp_ep_create waits for UCX's async lock, which UCX's async thread holds while it
 * calls verbs; softnic's verbs run Python in that same process (the host's
 * interpreter), so they wait for the lock the first thread holds: neither moves.  The
 * MPI library runs no Python code, so these calls release the interpreter lock while
 * they run, as a binding that declared them "nogil" would.  In a process without
 * Python they only forward. */

typedef int (*sn_gilcheck_fn)(void);
typedef void *(*sn_save_fn)(void);
typedef void (*sn_restore_fn)(void *);

static void *sn_py_release(void)
{
    sn_gilcheck_fn check = (sn_gilcheck_fn)dlsym(RTLD_DEFAULT, "PyGILState_Check");
    sn_gilcheck_fn inited = (sn_gilcheck_fn)dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    sn_save_fn save = (sn_save_fn)dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
    if (check && inited && save && inited() && check())
        return save();
    return NULL;
}

static void sn_py_restore(void *state)
{
    if (state) {
        sn_restore_fn restore = (sn_restore_fn)dlsym(RTLD_DEFAULT, "PyEval_RestoreThread");
        restore(state);
    }
}

/* The MPI library's own definition of name (not this file's).  RTLD_NEXT does not find
 * it when the binding was loaded RTLD_LOCAL (Python loads extension modules so, and
 * libmpi with them): look through every loaded object instead. */
struct sn_find { const char *name; void *self; void *found; };

static int sn_find_in(struct dl_phdr_info *info, size_t size, void *data)
{
    struct sn_find *f = data;
    (void)size;
    if (f->found || !info->dlpi_name || !info->dlpi_name[0])
        return f->found != NULL;
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return 0;
    void *sym = dlsym(h, f->name);
    if (sym && sym != f->self)
        f->found = sym;
    dlclose(h);
    return f->found != NULL;
}

static void *sn_real(const char *name, void *self)
{
    void *sym = dlsym(RTLD_NEXT, name);
    if (sym && sym != self)
        return sym;
    struct sn_find f = { name, self, NULL };
    dl_iterate_phdr(sn_find_in, &f);
    return f.found;
}

typedef int (*sn_init_fn)(int *, char ***);
typedef int (*sn_init_thread_fn)(int *, char ***, int, int *);
typedef int (*sn_finalize_fn)(void);

typedef int (*sn_finalized_fn)(int *);
SN_EXPORT int MPI_Finalize(void);
typedef int (*sn_run_fn)(const char *);

/* Called from Python at exit (below): MPI_Finalize while the interpreter still runs,
 * since a binding's own exit handler (mpi4py's is a C one, Py_AtExit) comes after the
 * interpreter is gone, and so is softnic. */
SN_EXPORT int softnic_mpi_finalize_early(void)
{
    sn_finalized_fn finalized = (sn_finalized_fn)sn_real("MPI_Finalized", NULL);
    int flag = 1;
    if (!finalized || finalized(&flag) != 0 || flag)
        return 0;
    return MPI_Finalize();
}

static const char sn_atexit_py[] =
    "import atexit as _a, ctypes as _c\n"
    "_a.register(_c.CDLL(None).softnic_mpi_finalize_early)\n"
    "del _a, _c\n";

/* After MPI_Init in a Python process (interpreter lock held again): have MPI finalized
 * by a Python exit handler. */
static void sn_py_finalize_at_exit(void)
{
    sn_gilcheck_fn check = (sn_gilcheck_fn)dlsym(RTLD_DEFAULT, "PyGILState_Check");
    sn_gilcheck_fn inited = (sn_gilcheck_fn)dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    sn_run_fn run = (sn_run_fn)dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (check && inited && run && inited() && check())
        run(sn_atexit_py);
}

SN_EXPORT int MPI_Init(int *argc, char ***argv)
{
    sn_init_fn real = (sn_init_fn)sn_real("MPI_Init", (void *)MPI_Init);
    if (!real)
        return 1;                                /* MPI_ERR_OTHER-like: no MPI here */
    void *gil = sn_py_release();
    int r = real(argc, argv);
    sn_py_restore(gil);
    if (r == 0 && gil)
        sn_py_finalize_at_exit();
    return r;
}

SN_EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    sn_init_thread_fn real = (sn_init_thread_fn)sn_real("MPI_Init_thread", (void *)MPI_Init_thread);
    if (!real)
        return 1;
    void *gil = sn_py_release();
    int r = real(argc, argv, required, provided);
    sn_py_restore(gil);
    if (r == 0 && gil)
        sn_py_finalize_at_exit();
    return r;
}

SN_EXPORT int MPI_Finalize(void)
{
    sn_finalize_fn real = (sn_finalize_fn)sn_real("MPI_Finalize", (void *)MPI_Finalize);
    if (!real)
        return 1;
    void *gil = sn_py_release();
    int r = real();
    sn_py_restore(gil);
    return r;
}
