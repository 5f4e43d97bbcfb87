/* ibv_import_device and ibv_import_dm / ibv_unimport_dm (rdma-core's test_import_dm, and
 * what it does not try): a context imported from a dup of another's command fd reaches
 * the same device memory by handle; an fd that is no context's, or a handle that is no
 * DM's, is refused; the DM cannot be freed while an import of it lives. */
#include "sn_common.h"

#include <fcntl.h>
#include <unistd.h>

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    (void)ep_init;                  /* (shared helpers this program does without) */
    (void)ep_connect;
    (void)ep_destroy;
    (void)expect_wc;
    (void)fill;
    (void)post_rdma;
    struct ibv_context *ctx = open_dev(0);
    struct ibv_alloc_dm_attr da = { .length = 4096 };
    struct ibv_dm *dm = ibv_alloc_dm(ctx, &da);
    CHECK(dm, "ibv_alloc_dm");

    int fd = dup(ctx->cmd_fd);
    CHECK(fd >= 0, "dup");
    struct ibv_context *imp = ibv_import_device(fd);
    CHECK(imp, "ibv_import_device of a dup of a context's command fd");
    CHECK(imp->device == ctx->device, "the imported context is of the same device");
    struct ibv_dm *idm = ibv_import_dm(imp, dm->handle);
    CHECK(idm, "ibv_import_dm");
    uint8_t out[64], in[64];
    for (int i = 0; i < 64; i++)
        out[i] = (uint8_t)(i * 5 + 1);
    CHECK(ibv_memcpy_to_dm(dm, 128, out, 64) == 0, "ibv_memcpy_to_dm");
    CHECK(ibv_memcpy_from_dm(in, idm, 128, 64) == 0, "ibv_memcpy_from_dm (imported)");
    same(in, out, 64, "what the imported DM reads");
    printf("import_device, import_dm: the same memory\n");

    errno = 0;
    CHECK(!ibv_import_dm(imp, dm->handle + 1000) && errno == EINVAL, "unknown DM handle");
    int devnull = open("/dev/null", O_RDWR);
    errno = 0;
    CHECK(!ibv_import_device(devnull) && errno == EOPNOTSUPP, "an fd that is no context's");
    close(devnull);
    errno = 0;
    CHECK(!ibv_import_device(-1) && errno == EBADF, "fd -1");
    printf("bad handle: EINVAL; foreign fd: EOPNOTSUPP; fd -1: EBADF\n");

    CHECK(ibv_free_dm(dm) == EBUSY, "ibv_free_dm while imported");
    ibv_unimport_dm(idm);
    CHECK(ibv_free_dm(dm) == 0, "ibv_free_dm after unimport");
    CHECK(ibv_close_device(imp) == 0, "ibv_close_device (imported)");
    CHECK(fcntl(fd, F_GETFD) == -1, "the imported context closed its fd");
    CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
    printf("imports: all checks passed\n");
    return 0;
}
