/* A bad rkey, a bad lkey, an out-of-bounds remote address, a missing access right
 * (also after ibv_rereg_mr took it away) and a receive buffer too short each end in the
 * right work-completion status, and no byte of the memory involved changes.  Two
 * devices in this process; each case on a fresh pair of RC QPs (an error moves a QP to
 * the error state). */
#include "sn_common.h"

#define PAGE 4096

struct setup {
    struct ibv_context *c0, *c1;
    struct ibv_pd *p0, *p1;
    uint8_t *src, *dst;            /* 3 pages each; MRs cover the middle page only */
    uint8_t *src_copy, *dst_copy;
    struct ibv_mr *src_mr, *dst_mr, *dst_ro_mr;
};

static void snapshot(struct setup *s)
{
    memcpy(s->src_copy, s->src, 3 * PAGE);
    memcpy(s->dst_copy, s->dst, 3 * PAGE);
}

static void untouched(struct setup *s, const char *what)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "%s: target memory changed", what);
    same(s->dst, s->dst_copy, 3 * PAGE, msg);
    snprintf(msg, sizeof(msg), "%s: source memory changed", what);
    same(s->src, s->src_copy, 3 * PAGE, msg);
}

static void fresh_pair(struct setup *s, struct ep *a, struct ep *b)
{
    ep_init(a, s->c0, s->p0, IBV_QPT_RC, 0, NULL);
    ep_init(b, s->c1, s->p1, IBV_QPT_RC, 0, NULL);
    ep_connect(a, b->qp->qp_num, &b->gid);
    ep_connect(b, a->qp->qp_num, &a->gid);
}

static void rdma_case(struct setup *s, const char *what, enum ibv_wr_opcode op,
                      uint8_t *local, uint32_t len, uint32_t lkey, uint8_t *remote,
                      uint32_t rkey, enum ibv_wc_status want)
{
    struct ep a, b;
    fresh_pair(s, &a, &b);
    snapshot(s);
    post_rdma(&a, op, 9, local, len, lkey, (uintptr_t)remote, rkey);
    expect_wc(&a, 9, want, op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE,
              what);
    untouched(s, what);
    ep_destroy(&a);
    ep_destroy(&b);
    printf("%s: %s, memory untouched\n", what, ibv_wc_status_str(want));
}

int main(void)
{
    struct setup s;
    setvbuf(stdout, NULL, _IOLBF, 0);
    s.c0 = open_dev(0);
    s.c1 = open_dev(1);
    s.p0 = ibv_alloc_pd(s.c0);
    s.p1 = ibv_alloc_pd(s.c1);
    CHECK(s.p0 && s.p1, "ibv_alloc_pd");
    CHECK(posix_memalign((void **)&s.src, PAGE, 3 * PAGE) == 0, "posix_memalign");
    CHECK(posix_memalign((void **)&s.dst, PAGE, 3 * PAGE) == 0, "posix_memalign");
    s.src_copy = malloc(3 * PAGE);
    s.dst_copy = malloc(3 * PAGE);
    fill(s.src, 3 * PAGE, 1);
    memset(s.dst, 0xAB, 3 * PAGE);
    uint8_t *src = s.src + PAGE, *dst = s.dst + PAGE;
    s.src_mr = ibv_reg_mr(s.p0, src, PAGE, ACCESS_ALL);
    s.dst_mr = ibv_reg_mr(s.p1, dst, PAGE, ACCESS_ALL);
    s.dst_ro_mr = ibv_reg_mr(s.p1, dst, PAGE, IBV_ACCESS_REMOTE_READ);
    CHECK(s.src_mr && s.dst_mr && s.dst_ro_mr, "ibv_reg_mr");

    /* a correct WRITE first, so the failures below are not a broken setup */
    {
        struct ep a, b;
        fresh_pair(&s, &a, &b);
        post_rdma(&a, IBV_WR_RDMA_WRITE, 1, src, 100, s.src_mr->lkey, (uintptr_t)dst,
                  s.dst_mr->rkey);
        expect_wc(&a, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "good WRITE");
        same(dst, src, 100, "good WRITE");
        ep_destroy(&a);
        ep_destroy(&b);
        printf("good WRITE: success\n");
    }
    uint32_t bad_rkey = s.dst_mr->rkey ^ 0x5a5a00;
    uint32_t bad_lkey = s.src_mr->lkey ^ 0x5a5a00;
    rdma_case(&s, "WRITE with a bad rkey", IBV_WR_RDMA_WRITE, src, 64, s.src_mr->lkey,
              dst, bad_rkey, IBV_WC_REM_ACCESS_ERR);
    rdma_case(&s, "WRITE with a bad lkey", IBV_WR_RDMA_WRITE, src, 64, bad_lkey,
              dst, s.dst_mr->rkey, IBV_WC_LOC_PROT_ERR);
    rdma_case(&s, "WRITE past the end of the MR", IBV_WR_RDMA_WRITE, src, 64, s.src_mr->lkey,
              dst + PAGE - 16, s.dst_mr->rkey, IBV_WC_REM_ACCESS_ERR);
    rdma_case(&s, "WRITE before the start of the MR", IBV_WR_RDMA_WRITE, src, 64,
              s.src_mr->lkey, dst - 32, s.dst_mr->rkey, IBV_WC_REM_ACCESS_ERR);
    rdma_case(&s, "WRITE without REMOTE_WRITE access", IBV_WR_RDMA_WRITE, src, 64,
              s.src_mr->lkey, dst, s.dst_ro_mr->rkey, IBV_WC_REM_ACCESS_ERR);
    rdma_case(&s, "READ with a bad rkey", IBV_WR_RDMA_READ, src, 64, s.src_mr->lkey,
              dst, bad_rkey, IBV_WC_REM_ACCESS_ERR);
    rdma_case(&s, "READ into a local range past the MR", IBV_WR_RDMA_READ, src + PAGE - 8, 64,
              s.src_mr->lkey, dst, s.dst_mr->rkey, IBV_WC_LOC_PROT_ERR);

    /* a SEND longer than the receive buffer: LOC_LEN_ERR at the receiver, and the
     * bytes beyond the receive buffer stay as they were */
    {
        struct ep a, b;
        fresh_pair(&s, &a, &b);
        snapshot(&s);
        struct ibv_sge rs = { .addr = (uintptr_t)dst, .length = 32, .lkey = s.dst_mr->lkey };
        struct ibv_recv_wr rw = { .wr_id = 5, .sg_list = &rs, .num_sge = 1 }, *rbad;
        CHECK(ibv_post_recv(b.qp, &rw, &rbad) == 0, "ibv_post_recv");
        struct ibv_sge ss = { .addr = (uintptr_t)src, .length = 64, .lkey = s.src_mr->lkey };
        struct ibv_send_wr sw = { .wr_id = 6, .sg_list = &ss, .num_sge = 1,
                                  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
                           *sbad;
        CHECK(ibv_post_send(a.qp, &sw, &sbad) == 0, "ibv_post_send");
        expect_wc(&b, 5, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, "SEND longer than the receive");
        expect_wc(&a, 6, IBV_WC_REM_INV_REQ_ERR, IBV_WC_SEND, "SEND longer than the receive");
        same(dst + 32, s.dst_copy + PAGE + 32, 2 * PAGE - 32,
             "SEND longer than the receive: memory past the receive buffer changed");
        ep_destroy(&a);
        ep_destroy(&b);
        printf("SEND longer than the receive buffer: %s / %s, memory past it untouched\n",
               ibv_wc_status_str(IBV_WC_LOC_LEN_ERR), ibv_wc_status_str(IBV_WC_REM_INV_REQ_ERR));
    }

    /* ibv_rereg_mr taking REMOTE_WRITE away: the new rkey refuses a WRITE, the old is gone */
    uint32_t old_rkey = s.dst_mr->rkey;
    CHECK(ibv_rereg_mr(s.dst_mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) == 0, "ibv_rereg_mr");
    rdma_case(&s, "WRITE after rereg without REMOTE_WRITE", IBV_WR_RDMA_WRITE, src, 64,
              s.src_mr->lkey, dst, s.dst_mr->rkey, IBV_WC_REM_ACCESS_ERR);
    if (old_rkey != s.dst_mr->rkey)
        rdma_case(&s, "WRITE with the rkey from before rereg", IBV_WR_RDMA_WRITE, src, 64,
                  s.src_mr->lkey, dst, old_rkey, IBV_WC_REM_ACCESS_ERR);
    else
        printf("WRITE with the rkey from before rereg: rkey kept, memory untouched\n");

    CHECK(ibv_dereg_mr(s.src_mr) == 0 && ibv_dereg_mr(s.dst_mr) == 0 &&
          ibv_dereg_mr(s.dst_ro_mr) == 0, "ibv_dereg_mr");
    CHECK(ibv_dealloc_pd(s.p0) == 0 && ibv_dealloc_pd(s.p1) == 0, "ibv_dealloc_pd");
    CHECK(ibv_close_device(s.c0) == 0 && ibv_close_device(s.c1) == 0, "ibv_close_device");
    printf("wc_errors: all statuses as expected\n");
    return 0;
}
