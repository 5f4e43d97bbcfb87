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
 * The same way it answers for softnic's devices under /sys/class/infiniband/ (what the
 * kernel shows of an RDMA device; rdma-core's test suite finds a device's network
 * interface in /sys/class/infiniband/<dev>/device/net/): `softnic exec` writes those
 * entries into a directory named by SOFTNIC_SYSFS (sysfs.py), and a path under
 * /sys/class/infiniband that does not exist is looked up there instead (stat, lstat,
 * statx, fstatat, access, open, openat, opendir).  A host with real RDMA devices keeps
 * its own entries: only what is missing is answered.
 *
 * No Python and no state: it costs a string compare per stat/access/open. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
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

#define SN_SYSFS "/sys/class/infiniband"

/* The stand-in of a path under /sys/class/infiniband, in buf; NULL if there is none
 * (another path, no SOFTNIC_SYSFS, too long). */
static const char *sn_sysfs_path(const char *path, char *buf, size_t size)
{
    const size_t n = sizeof(SN_SYSFS) - 1;
    if (!path || strncmp(path, SN_SYSFS, n) != 0 || (path[n] != 0 && path[n] != '/'))
        return NULL;
    const char *root = getenv("SOFTNIC_SYSFS");
    if (!root || root[0] != '/')
        return NULL;
    int len = snprintf(buf, size, "%s%s", root, path + n);
    return (len > 0 && (size_t)len < size) ? buf : NULL;
}

/* Does a failed call on path deserve a second look at its stand-in? */
#define SN_RETRY(path, alt) \
    ((errno == ENOENT || errno == ENOTDIR) && \
     ((alt) = sn_sysfs_path((path), sn_alt, sizeof(sn_alt))) != NULL)

typedef int (*sn_stat_fn)(const char *, struct stat *);
typedef int (*sn_access_fn)(const char *, int);
typedef int (*sn_statx_fn)(int, const char *, int, unsigned int, struct statx *);
typedef int (*sn_fstatat_fn)(int, const char *, struct stat *, int);
typedef int (*sn_open_fn)(const char *, int, ...);
typedef int (*sn_openat_fn)(int, const char *, int, ...);
typedef DIR *(*sn_opendir_fn)(const char *);

#define SN_REAL(type, name) \
    static type real; \
    if (!real) \
        real = (type)dlsym(RTLD_NEXT, name); \
    if (!real) { \
        errno = ENOSYS; \
        return -1; \
    }

SN_EXPORT int stat(const char *path, struct stat *st)
{
    SN_REAL(sn_stat_fn, "stat");
    char sn_alt[PATH_MAX];
    const char *alt;
    int r = real(path, st);
    int idx;
    if (r != 0 && errno == ENOENT && (idx = sn_uverbs_index(path)) >= 0) {
        sn_fake_stat(st, idx);
        return 0;
    }
    if (r != 0 && SN_RETRY(path, alt))
        return real(alt, st);
    return r;
}

SN_EXPORT int stat64(const char *path, struct stat64 *st)
{
    return stat(path, (struct stat *)st);       /* one layout on 64-bit Linux */
}

SN_EXPORT int lstat(const char *path, struct stat *st)
{
    SN_REAL(sn_stat_fn, "lstat");
    char sn_alt[PATH_MAX];
    const char *alt;
    int r = real(path, st);
    if (r != 0 && SN_RETRY(path, alt))
        return real(alt, st);
    return r;
}

SN_EXPORT int lstat64(const char *path, struct stat64 *st)
{
    return lstat(path, (struct stat *)st);
}

SN_EXPORT int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
    SN_REAL(sn_fstatat_fn, "fstatat");
    char sn_alt[PATH_MAX];
    const char *alt;
    int r = real(dirfd, path, st, flags);
    if (r != 0 && SN_RETRY(path, alt))
        return real(dirfd, alt, st, flags);
    return r;
}

SN_EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
    return fstatat(dirfd, path, (struct stat *)st, flags);
}

SN_EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *st)
{
    SN_REAL(sn_statx_fn, "statx");
    char sn_alt[PATH_MAX];
    const char *alt;
    int r = real(dirfd, path, flags, mask, st);
    if (r != 0 && SN_RETRY(path, alt))
        return real(dirfd, alt, flags, mask, st);
    return r;
}

SN_EXPORT int access(const char *path, int mode)
{
    SN_REAL(sn_access_fn, "access");
    char sn_alt[PATH_MAX];
    const char *alt;
    int r = real(path, mode);
    if (r != 0 && errno == ENOENT && sn_uverbs_index(path) >= 0 && !(mode & X_OK))
        return 0;
    if (r != 0 && SN_RETRY(path, alt))
        return real(alt, mode);
    return r;
}

/* open/openat on path, then (not when creating) on its stand-in */
static int sn_open_retry(sn_open_fn op, sn_openat_fn opat, int dirfd, const char *path,
                         int flags, mode_t mode)
{
    char sn_alt[PATH_MAX];
    const char *alt;
    int r = op ? op(path, flags, mode) : opat(dirfd, path, flags, mode);
    if (r < 0 && !(flags & O_CREAT) && SN_RETRY(path, alt))
        r = op ? op(alt, flags, mode) : opat(dirfd, alt, flags, mode);
    return r;
}

static mode_t sn_mode(int flags, va_list ap)
{
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

#define SN_OPEN(name) \
SN_EXPORT int name(const char *path, int flags, ...) \
{ \
    SN_REAL(sn_open_fn, #name); \
    va_list ap; \
    va_start(ap, flags); \
    mode_t mode = sn_mode(flags, ap); \
    va_end(ap); \
    return sn_open_retry(real, NULL, 0, path, flags, mode); \
}

#define SN_OPENAT(name) \
SN_EXPORT int name(int dirfd, const char *path, int flags, ...) \
{ \
    SN_REAL(sn_openat_fn, #name); \
    va_list ap; \
    va_start(ap, flags); \
    mode_t mode = sn_mode(flags, ap); \
    va_end(ap); \
    return sn_open_retry(NULL, real, dirfd, path, flags, mode); \
}

SN_OPEN(open)
SN_OPEN(open64)
SN_OPENAT(openat)
SN_OPENAT(openat64)

SN_EXPORT DIR *opendir(const char *path)
{
    static sn_opendir_fn real;
    if (!real && !(real = (sn_opendir_fn)dlsym(RTLD_NEXT, "opendir")))
        return errno = ENOSYS, NULL;
    char sn_alt[PATH_MAX];
    const char *alt;
    DIR *d = real(path);
    if (!d && SN_RETRY(path, alt))
        d = real(alt);
    return d;
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
