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
