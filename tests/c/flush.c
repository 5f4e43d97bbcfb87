/* RDMA FLUSH through the extended post API, as a program built against rdma-core 45's
 * headers calls it (these are 44's, which do not declare it): ibv_wr_flush is the
 * builder right after wr_atomic_write in struct ibv_qp_ex, IBV_WR_FLUSH 14,
 * IBV_WC_FLUSH 8, IBV_QP_EX_WITH_FLUSH 1 << 11, IBV_ACCESS_FLUSH_GLOBAL 1 << 8 and
 * IBV_ACCESS_FLUSH_PERSISTENT 1 << 9.  Two devices, a WRITE then FLUSHes of its range
 * and of the whole region, an MR that asks for persistence (EINVAL: no persistent
 * memory), a QP that did not ask for the builder (EOPNOTSUPP at wr_complete), and a
 * persistent FLUSH of memory that does not grant it (remote access error). */
#include "sn_common.h"

#include <stddef.h>

#define WC_FLUSH 8
#define QP_EX_WITH_FLUSH (1 << 11)
#define ACCESS_FLUSH_GLOBAL (1 << 8)
#define ACCESS_FLUSH_PERSISTENT (1 << 9)
#define FLUSH_GLOBAL 1
#define FLUSH_PERSISTENT 2
#define FLUSH_RANGE 0
#define FLUSH_MR 1

typedef void (*wr_flush_fn)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
                            size_t len, uint8_t type, uint8_t level);

static wr_flush_fn wr_flush_of(struct ibv_qp_ex *q)
{
    wr_flush_fn f;
    memcpy(&f, (char *)q + offsetof(struct ibv_qp_ex, wr_atomic_write) + sizeof(void *),
           sizeof(f));
    return f;
}

/* an RC QP with its own CQ; flush_ops: its send_ops_flags ask for FLUSH */
static void rc_ep(struct ep *e, struct ibv_context *ctx, struct ibv_pd *pd, int flush_ops)
{
    memset(e, 0, sizeof(*e));
    e->ctx = ctx;
    e->pd = pd;
    e->type = IBV_QPT_RC;
    e->cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    CHECK(e->cq, "ibv_create_cq");
    struct ibv_qp_init_attr_ex qa = {
        .qp_type = IBV_QPT_RC, .send_cq = e->cq, .recv_cq = e->cq,
        .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
        .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | (flush_ops ? QP_EX_WITH_FLUSH : 0),
    };
    e->qp = ibv_create_qp_ex(ctx, &qa);
    CHECK(e->qp, "ibv_create_qp_ex");
    e->qpx = ibv_qp_to_qp_ex(e->qp);
    CHECK(ibv_query_gid(ctx, 1, 0, &e->gid) == 0, "ibv_query_gid");
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
                             .qp_access_flags = ACCESS_ALL | ACCESS_FLUSH_GLOBAL |
                                                ACCESS_FLUSH_PERSISTENT };
    CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                        IBV_QP_ACCESS_FLAGS) == 0, "modify QP to INIT");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    (void)ep_init;                  /* (shared helpers this program does without) */
    (void)post_rdma;
    struct ibv_context *c0 = open_dev(0), *c1 = open_dev(1);
    struct ibv_pd *p0 = ibv_alloc_pd(c0), *p1 = ibv_alloc_pd(c1);
    CHECK(p0 && p1, "ibv_alloc_pd");
    static uint8_t src[4096], dst[4096];
    fill(src, sizeof(src), 7);
    struct ibv_mr *smr = ibv_reg_mr(p0, src, sizeof(src), ACCESS_ALL);
    struct ibv_mr *dmr = ibv_reg_mr(p1, dst, sizeof(dst), ACCESS_ALL | ACCESS_FLUSH_GLOBAL);
    CHECK(smr && dmr, "ibv_reg_mr (FLUSH_GLOBAL)");
    errno = 0;
    CHECK(!ibv_reg_mr(p1, dst, sizeof(dst), ACCESS_ALL | ACCESS_FLUSH_PERSISTENT) &&
          errno == EINVAL, "ibv_reg_mr (FLUSH_PERSISTENT) must fail with EINVAL");
    printf("reg_mr FLUSH_PERSISTENT: EINVAL\n");

    struct ep a, b, plain;
    rc_ep(&a, c0, p0, 1);
    rc_ep(&b, c1, p1, 0);
    ep_connect(&a, b.qp->qp_num, &b.gid);
    ep_connect(&b, a.qp->qp_num, &a.gid);

    wr_flush_fn flush = wr_flush_of(a.qpx);
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 1;
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(a.qpx, dmr->rkey, (uintptr_t)dst);
    ibv_wr_set_sge(a.qpx, smr->lkey, (uintptr_t)src, 512);
    a.qpx->wr_id = 2;
    flush(a.qpx, dmr->rkey, (uintptr_t)dst, 512, FLUSH_GLOBAL, FLUSH_RANGE);
    a.qpx->wr_id = 3;
    flush(a.qpx, dmr->rkey, 0, 12345678, FLUSH_GLOBAL, FLUSH_MR);
    CHECK(ibv_wr_complete(a.qpx) == 0, "ibv_wr_complete");
    expect_wc(&a, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "WRITE");
    expect_wc(&a, 2, IBV_WC_SUCCESS, WC_FLUSH, "FLUSH of the range");
    expect_wc(&a, 3, IBV_WC_SUCCESS, WC_FLUSH, "FLUSH of the region");
    same(dst, src, 512, "WRITE before FLUSH");
    printf("WRITE, FLUSH range, FLUSH region: success\n");

    /* a QP that did not ask for the builder: the list fails, nothing is posted */
    rc_ep(&plain, c0, p0, 0);
    ibv_wr_start(plain.qpx);
    wr_flush_of(plain.qpx)(plain.qpx, dmr->rkey, (uintptr_t)dst, 8, FLUSH_GLOBAL, FLUSH_RANGE);
    CHECK(ibv_wr_complete(plain.qpx) == EOPNOTSUPP, "wr_flush without WITH_FLUSH");
    printf("wr_flush without IBV_QP_EX_WITH_FLUSH: EOPNOTSUPP\n");

    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 4;
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    flush(a.qpx, dmr->rkey, (uintptr_t)dst, 8, FLUSH_PERSISTENT, FLUSH_RANGE);
    CHECK(ibv_wr_complete(a.qpx) == 0, "ibv_wr_complete");
    expect_wc(&a, 4, IBV_WC_REM_ACCESS_ERR, WC_FLUSH, "persistent FLUSH");
    printf("FLUSH PERSISTENT of a FLUSH_GLOBAL region: remote access error\n");

    ep_destroy(&plain);
    ep_destroy(&a);
    ep_destroy(&b);
    ibv_dereg_mr(smr);
    ibv_dereg_mr(dmr);
    ibv_dealloc_pd(p0);
    ibv_dealloc_pd(p1);
    ibv_close_device(c0);
    ibv_close_device(c1);
    printf("flush: all checks passed\n");
    return 0;
}
