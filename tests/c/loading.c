/* How middleware loads libibverbs, and what a fork does to it.
 *
 *   loading dlopen   libibverbs.so.1 opened with dlopen(RTLD_NOW | RTLD_LOCAL) by a
 *                    program that does not link it (as UCX's libuct_ib plugin is
 *                    opened); the verbs are found with dlsym; a device is opened, a
 *                    PD allocated and an MR registered.
 *   loading fork     linked; after the first verbs call the program forks: the child
 *                    opens a device again and must get a clear error (NULL with an
 *                    errno) at once, never hang; the parent goes on working.
 *
 * Built twice: without -libverbs for "dlopen" (so the program does not link it), with
 * -DLINKED -libverbs for "fork".  Prints one "ok" line per check; exits 1 at the first
 * failure. */
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what)
{
    fprintf(stderr, "FAIL: %s (errno %d: %s)\n", what, errno, strerror(errno));
    exit(1);
}

#define CHECK(cond, what) do { if (!(cond)) die(what); } while (0)

static int by_dlopen(void)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "FAIL: dlopen: %s\n", dlerror());
        return 1;
    }
    struct ibv_device **(*get_list)(int *) = dlsym(h, "ibv_get_device_list");
    struct ibv_context *(*open_dev)(struct ibv_device *) = dlsym(h, "ibv_open_device");
    struct ibv_pd *(*alloc_pd)(struct ibv_context *) = dlsym(h, "ibv_alloc_pd");
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, uint64_t, unsigned int) =
        dlsym(h, "ibv_reg_mr_iova2");
    int (*dereg_mr)(struct ibv_mr *) = dlsym(h, "ibv_dereg_mr");
    int (*dealloc_pd)(struct ibv_pd *) = dlsym(h, "ibv_dealloc_pd");
    int (*close_dev)(struct ibv_context *) = dlsym(h, "ibv_close_device");
    CHECK(get_list && open_dev && alloc_pd && reg_mr && dereg_mr && dealloc_pd && close_dev,
          "dlsym");
    int n = 0;
    struct ibv_device **list = get_list(&n);
    CHECK(list && n > 0, "ibv_get_device_list after dlopen(RTLD_LOCAL): no devices");
    printf("dlopen(RTLD_LOCAL): %d devices, first %s: ok\n", n, list[0]->name);
    struct ibv_context *ctx = open_dev(list[0]);
    CHECK(ctx, "ibv_open_device");
    struct ibv_pd *pd = alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    static char buf[4096];
    struct ibv_mr *mr = reg_mr(pd, buf, sizeof(buf), (uintptr_t)buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "ibv_reg_mr_iova2");
    CHECK(dereg_mr(mr) == 0 && dealloc_pd(pd) == 0 && close_dev(ctx) == 0, "teardown");
    printf("dlopen(RTLD_LOCAL): open, PD, MR: ok\n");
    return 0;
}

#ifdef LINKED
static int fork_after_use(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n > 0, "ibv_get_device_list");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "ibv_open_device");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        alarm(20);                             /* a hang is a failure, not a stuck test */
        struct ibv_context *c2 = ibv_open_device(list[0]);
        if (c2) {
            /* working in the child is the other allowed answer: then it must work */
            struct ibv_pd *p2 = ibv_alloc_pd(c2);
            if (!p2)
                _exit(3);
            printf("child: verbs work after fork: ok\n");
            fflush(stdout);
            _exit(0);
        }
        int e = errno;
        struct ibv_pd *p2 = ibv_alloc_pd(ctx);   /* the parent's context, in the child */
        if (p2 || errno == 0)
            _exit(4);
        printf("child: clear error after fork (ibv_open_device errno %d: %s): ok\n", e,
               strerror(e));
        fflush(stdout);
        _exit(e ? 0 : 5);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "FAIL: child %s %d\n", WIFSIGNALED(status) ? "killed by signal" : "exit",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        return 1;
    }
    struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
    CHECK(pd2, "parent: ibv_alloc_pd after the child");
    CHECK(ibv_dealloc_pd(pd2) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0,
          "parent: teardown");
    ibv_free_device_list(list);
    printf("parent: verbs still work after fork: ok\n");
    return 0;
}
#endif

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "dlopen"))
        return by_dlopen();
#ifdef LINKED
    if (argc == 2 && !strcmp(argv[1], "fork"))
        return fork_after_use();
#endif
    fprintf(stderr, "usage: loading dlopen|fork\n");
    return 2;
}
