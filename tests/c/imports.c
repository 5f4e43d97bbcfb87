/* ibv_import_device and ibv_import_dm / ibv_unimport_dm (rdma-core's test_import_dm, and
 * what it does not try): a context imported from a dup of another's command fd reaches
 * the same device memory by handle; an fd that is no context's, or a handle that is no
 * DM's, is refused; the DM cannot be freed while an import of it lives.
 * ibv_import_pd / ibv_import_mr (rdma-core's test_shared_pd): the imported PD and MR are
 * the ones created (a QP of the imported context on the imported PD writes into the
 * original MR, sourcing from the imported MR's lkey); a handle of a context that does not
 * share the command file is ENOENT, a handle of another kind EINVAL; the objects outlive
 * their imports. */
#include "sn_common.h"

#include <fcntl.h>
#include <unistd.h>

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
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

    /* PD and MR: shared between the two contexts by handle */
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    enum { LEN = 8192 };
    uint8_t *src = aligned_alloc(4096, LEN), *dst = aligned_alloc(4096, LEN);
    CHECK(src && dst, "aligned_alloc");
    fill(src, LEN, 36);
    memset(dst, 0, LEN);
    struct ibv_mr *smr = ibv_reg_mr(pd, src, LEN, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *dmr = ibv_reg_mr(pd, dst, LEN, ACCESS_ALL);
    CHECK(smr && dmr, "ibv_reg_mr");
    struct ibv_pd *ipd = ibv_import_pd(imp, pd->handle);
    CHECK(ipd, "ibv_import_pd");
    CHECK(ipd->context == imp && ipd->handle == pd->handle, "the imported PD");
    struct ibv_mr *imr = ibv_import_mr(ipd, smr->handle);
    CHECK(imr, "ibv_import_mr");
    CHECK(imr->lkey == smr->lkey && imr->rkey == smr->rkey && imr->length == LEN &&
          imr->addr == NULL && imr->pd == ipd && imr->context == imp, "the imported MR");
    struct ep a, b;
    ep_rc_pair(&a, imp, ipd, &b, ctx, pd);
    post_rdma(&a, IBV_WR_RDMA_WRITE, 7, src, LEN, imr->lkey, (uintptr_t)dst, dmr->rkey);
    expect_wc(&a, 7, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "WRITE from the imported PD's QP");
    same(dst, src, LEN, "what the imported MR's WRITE placed");
    ep_destroy(&a);
    ep_destroy(&b);
    printf("import_pd, import_mr: a WRITE through the imported PD and MR\n");

    struct ibv_context *other = open_dev(0);     /* its own command file */
    struct ibv_pd *opd = ibv_alloc_pd(other);
    CHECK(opd, "ibv_alloc_pd (another context)");
    errno = 0;
    CHECK(!ibv_import_pd(imp, opd->handle) && errno == ENOENT,
          "a PD of a context that does not share the command file");
    errno = 0;
    CHECK(!ibv_import_pd(imp, smr->handle) && errno == EINVAL, "an MR's handle as a PD's");
    errno = 0;
    CHECK(!ibv_import_mr(ipd, pd->handle) && errno == EINVAL, "a PD's handle as an MR's");
    errno = 0;
    CHECK(!ibv_import_mr(ipd, smr->handle + 100000) && errno == ENOENT, "unknown MR handle");
    CHECK(ibv_dealloc_pd(opd) == 0 && ibv_close_device(other) == 0, "the other context");
    printf("foreign handle: ENOENT; another kind: EINVAL\n");

    ibv_unimport_mr(imr);
    ibv_unimport_pd(ipd);
    imr = ibv_import_mr(pd, smr->handle);
    CHECK(imr && imr->lkey == smr->lkey, "the MR outlives its import");
    ibv_unimport_mr(imr);
    CHECK(ibv_dereg_mr(smr) == 0 && ibv_dereg_mr(dmr) == 0, "ibv_dereg_mr after unimport");
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd after unimport");
    free(src);
    free(dst);

    CHECK(ibv_free_dm(dm) == EBUSY, "ibv_free_dm while imported");
    ibv_unimport_dm(idm);
    CHECK(ibv_free_dm(dm) == 0, "ibv_free_dm after unimport");
    CHECK(ibv_close_device(imp) == 0, "ibv_close_device (imported)");
    CHECK(fcntl(fd, F_GETFD) == -1, "the imported context closed its fd");
    CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
    printf("imports: all checks passed\n");
    return 0;
}
