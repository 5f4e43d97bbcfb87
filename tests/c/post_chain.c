/* A chain of work requests with a bad one in it: ibv_post_send and ibv_post_recv (and
 * ibv_post_srq_recv) return the error, set *bad_wr to the first WR refused, and leave
 * the WRs before it posted and the ones after it not posted, as mlx5 does (it rings
 * its doorbell for the WQEs built before the bad one).  The chains are longer than
 * one call of the provider may take at a time, and the bad WR sits beyond the first
 * such call, so the rule holds across them.  Last, a WR whose num_sge is far beyond
 * what the queue takes, over a list of one SGE that ends where an unmapped page
 * begins: it is refused without the list being read past what the queue could take
 * (mlx5 checks the count first).  Two devices in this process, an RC pair. */
#include <sys/mman.h>
#include <unistd.h>

#include "sn_common.h"

#define CHAIN 40
#define BAD_RECV 35            /* one SGE too many */
#define BAD_SEND 33            /* one SGE too many */
#define MSG 64

static void recv_sge(struct ibv_sge *s, uint8_t *buf, struct ibv_mr *mr, int i)
{
    s->addr = (uintptr_t)(buf + i * MSG);
    s->length = MSG;
    s->lkey = mr->lkey;
}

/* CHAIN receives on QP or SRQ, the one at BAD_RECV with max_sge + 1 SGEs; returns
 * how many the call said it posted (the index of *bad) or dies. */
static void bad_recv_chain(struct ep *b, struct ibv_srq *srq, uint8_t *buf, struct ibv_mr *mr,
                           uint32_t max_sge, uint64_t first_id)
{
    struct ibv_recv_wr wr[CHAIN], *bad = NULL;
    struct ibv_sge sge[CHAIN];
    struct ibv_sge many[max_sge + 1];
    for (int i = 0; i < CHAIN; i++) {
        recv_sge(&sge[i], buf, mr, i);
        wr[i] = (struct ibv_recv_wr){ .wr_id = first_id + i, .sg_list = &sge[i], .num_sge = 1,
                                      .next = i + 1 < CHAIN ? &wr[i + 1] : NULL };
    }
    for (uint32_t k = 0; k <= max_sge; k++)
        recv_sge(&many[k], buf, mr, BAD_RECV);
    many[max_sge].length = 0;
    wr[BAD_RECV].sg_list = many;
    wr[BAD_RECV].num_sge = max_sge + 1;
    int rc = srq ? ibv_post_srq_recv(srq, wr, &bad) : ibv_post_recv(b->qp, wr, &bad);
    if (rc != EINVAL || bad != &wr[BAD_RECV]) {
        fprintf(stderr, "FAIL: %s: returned %d, bad_wr is WR %ld; expected EINVAL (%d) and "
                "WR %d\n", srq ? "ibv_post_srq_recv" : "ibv_post_recv", rc,
                bad ? (long)(bad - wr) : -1L, EINVAL, BAD_RECV);
        exit(1);
    }
}

/* n SENDs from a, each signaled, the i-th carrying byte first + i. */
static void sends(struct ep *a, uint8_t *src, struct ibv_mr *mr, int n, uint64_t first_id)
{
    for (int i = 0; i < n; i++) {
        memset(src + i * MSG, (int)(first_id + i), MSG);
        struct ibv_sge s = { .addr = (uintptr_t)(src + i * MSG), .length = MSG, .lkey = mr->lkey };
        struct ibv_send_wr wr = { .wr_id = first_id + i, .sg_list = &s, .num_sge = 1,
                                  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
        CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "ibv_post_send");
        expect_wc(a, first_id + i, IBV_WC_SUCCESS, IBV_WC_SEND, "a SEND");
    }
}

static void expect_recvs(struct ep *b, int n, uint64_t first_id, const char *what)
{
    for (int i = 0; i < n; i++)
        expect_wc(b, first_id + i, IBV_WC_SUCCESS, IBV_WC_RECV, what);
}

static void recv_case(struct ibv_context *c0, struct ibv_context *c1, struct ibv_pd *p0,
                      struct ibv_pd *p1, uint8_t *src, struct ibv_mr *smr, uint8_t *dst,
                      struct ibv_mr *dmr, int use_srq)
{
    struct ep a, b;
    struct ibv_srq *srq = NULL;
    uint32_t max_sge;
    if (use_srq) {
        struct ibv_srq_init_attr sa = { .attr = { .max_wr = 128, .max_sge = 2 } };
        srq = ibv_create_srq(p1, &sa);
        CHECK(srq, "ibv_create_srq");
        struct ibv_srq_attr q;
        CHECK(ibv_query_srq(srq, &q) == 0, "ibv_query_srq");
        max_sge = q.max_sge;
    }
    ep_init(&a, c0, p0, IBV_QPT_RC, 0, NULL);
    ep_init(&b, c1, p1, IBV_QPT_RC, 0, srq);
    if (!use_srq) {
        struct ibv_qp_attr qa;
        struct ibv_qp_init_attr qi;
        CHECK(ibv_query_qp(b.qp, &qa, IBV_QP_CAP, &qi) == 0, "ibv_query_qp");
        max_sge = qi.cap.max_recv_sge;
    }
    ep_connect(&a, b.qp->qp_num, &b.gid);
    ep_connect(&b, a.qp->qp_num, &a.gid);
    bad_recv_chain(&b, srq, dst, dmr, max_sge, 100);
    /* the WRs before the bad one take the first BAD_RECV SENDs, in order; the next
     * SEND finds a receive posted after the chain, not one of the chain's last WRs */
    struct ibv_sge s;
    recv_sge(&s, dst, dmr, CHAIN);
    struct ibv_recv_wr after = { .wr_id = 999, .sg_list = &s, .num_sge = 1 }, *bad;
    CHECK((srq ? ibv_post_srq_recv(srq, &after, &bad) : ibv_post_recv(b.qp, &after, &bad)) == 0,
          "posting a receive after the chain");
    sends(&a, src, smr, BAD_RECV + 1, 0);
    expect_recvs(&b, BAD_RECV, 100, "a receive of the chain");
    expect_wc(&b, 999, IBV_WC_SUCCESS, IBV_WC_RECV, "the receive posted after the chain");
    for (int i = 0; i < BAD_RECV; i++)
        CHECK(dst[i * MSG] == (uint8_t)i, "a receive's bytes");
    CHECK(dst[CHAIN * MSG] == (uint8_t)BAD_RECV, "the last receive's bytes");
    ep_destroy(&a);
    ep_destroy(&b);
    if (srq)
        CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
    printf("%s: a bad WR at %d of %d refused with EINVAL, the %d before it posted, none "
           "after: ok\n", use_srq ? "ibv_post_srq_recv" : "ibv_post_recv", BAD_RECV, CHAIN,
           BAD_RECV);
}

static void send_case(struct ibv_context *c0, struct ibv_context *c1, struct ibv_pd *p0,
                      struct ibv_pd *p1, uint8_t *src, struct ibv_mr *smr, uint8_t *dst,
                      struct ibv_mr *dmr)
{
    struct ep a, b;
    ep_rc_pair(&a, c0, p0, &b, c1, p1);
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;
    CHECK(ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &qi) == 0, "ibv_query_qp");
    uint32_t max_sge = qi.cap.max_send_sge;
    /* receives for every SEND of the chain and one more */
    for (int i = 0; i <= CHAIN; i++) {
        struct ibv_sge s;
        recv_sge(&s, dst, dmr, i);
        struct ibv_recv_wr r = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *rb;
        CHECK(ibv_post_recv(b.qp, &r, &rb) == 0, "ibv_post_recv");
    }
    struct ibv_send_wr wr[CHAIN], *bad = NULL;
    struct ibv_sge sge[CHAIN];
    struct ibv_sge many[max_sge + 1];
    for (int i = 0; i < CHAIN; i++) {
        memset(src + i * MSG, i, MSG);
        sge[i] = (struct ibv_sge){ .addr = (uintptr_t)(src + i * MSG), .length = MSG,
                                   .lkey = smr->lkey };
        wr[i] = (struct ibv_send_wr){ .wr_id = i, .sg_list = &sge[i], .num_sge = 1,
                                      .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
                                      .next = i + 1 < CHAIN ? &wr[i + 1] : NULL };
    }
    for (uint32_t k = 0; k <= max_sge; k++)
        many[k] = (struct ibv_sge){ .addr = (uintptr_t)src, .length = 1, .lkey = smr->lkey };
    wr[BAD_SEND].sg_list = many;
    wr[BAD_SEND].num_sge = max_sge + 1;
    int rc = ibv_post_send(a.qp, wr, &bad);
    if (rc != ENOMEM || bad != &wr[BAD_SEND]) {      /* mlx5: "max gs exceeded", ENOMEM */
        fprintf(stderr, "FAIL: ibv_post_send: returned %d, bad_wr is WR %ld; expected ENOMEM "
                "(%d) and WR %d\n", rc, bad ? (long)(bad - wr) : -1L, ENOMEM, BAD_SEND);
        exit(1);
    }
    for (int i = 0; i < BAD_SEND; i++)
        expect_wc(&a, i, IBV_WC_SUCCESS, IBV_WC_SEND, "a SEND of the chain");
    expect_recvs(&b, BAD_SEND, 100, "a receive of a SEND of the chain");
    /* the next SEND is the next message: none of the chain's last WRs went */
    memset(src + CHAIN * MSG, 0xEE, MSG);
    struct ibv_sge s = { .addr = (uintptr_t)(src + CHAIN * MSG), .length = MSG,
                         .lkey = smr->lkey };
    struct ibv_send_wr one = { .wr_id = 999, .sg_list = &s, .num_sge = 1,
                               .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *ob;
    CHECK(ibv_post_send(a.qp, &one, &ob) == 0, "ibv_post_send after the chain");
    expect_wc(&a, 999, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND after the chain");
    expect_wc(&b, 100 + BAD_SEND, IBV_WC_SUCCESS, IBV_WC_RECV, "the SEND after the chain");
    for (int i = 0; i < BAD_SEND; i++)
        CHECK(dst[i * MSG] == (uint8_t)i, "a SEND's bytes");
    CHECK(dst[BAD_SEND * MSG] == 0xEE, "the SEND after the chain's bytes");
    ep_destroy(&a);
    ep_destroy(&b);
    printf("ibv_post_send: a bad WR at %d of %d refused with ENOMEM, the %d before it posted, "
           "none after: ok\n", BAD_SEND, CHAIN, BAD_SEND);
}

/* One SGE at the very end of a page whose next page is unmapped: reading a second
 * entry faults. */
static struct ibv_sge *guarded_sge(uint8_t *buf, struct ibv_mr *mr)
{
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *p = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap");
    CHECK(mprotect(p + pg, pg, PROT_NONE) == 0, "mprotect");
    struct ibv_sge *s = (struct ibv_sge *)(p + pg) - 1;
    *s = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = MSG, .lkey = mr->lkey };
    return s;
}

static void overlong_case(struct ibv_context *c0, struct ibv_context *c1, struct ibv_pd *p0,
                          struct ibv_pd *p1, uint8_t *src, struct ibv_mr *smr, uint8_t *dst,
                          struct ibv_mr *dmr)
{
    struct ep a, b;
    struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 2 } };
    struct ibv_srq *srq = ibv_create_srq(p1, &sa);
    CHECK(srq, "ibv_create_srq");
    ep_rc_pair(&a, c0, p0, &b, c1, p1);
    const int many = 1 << 20;
    struct ibv_recv_wr r = { .wr_id = 7, .sg_list = guarded_sge(dst, dmr), .num_sge = many };
    struct ibv_recv_wr *rbad = NULL;
    int rc = ibv_post_recv(b.qp, &r, &rbad);
    CHECK(rc == EINVAL && rbad == &r, "ibv_post_recv of 2^20 SGEs: EINVAL, bad_wr the WR");
    rbad = NULL;
    rc = ibv_post_srq_recv(srq, &r, &rbad);
    CHECK(rc == EINVAL && rbad == &r, "ibv_post_srq_recv of 2^20 SGEs: EINVAL, bad_wr the WR");
    struct ibv_send_wr w = { .wr_id = 8, .sg_list = guarded_sge(src, smr), .num_sge = many,
                             .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
    struct ibv_send_wr *sbad = NULL;
    rc = ibv_post_send(a.qp, &w, &sbad);
    CHECK(rc == ENOMEM && sbad == &w, "ibv_post_send of 2^20 SGEs: ENOMEM, bad_wr the WR");
    /* nothing was posted: a SEND of one SGE takes the receive posted next */
    struct ibv_sge s = { .addr = (uintptr_t)dst, .length = MSG, .lkey = dmr->lkey };
    struct ibv_recv_wr r1 = { .wr_id = 9, .sg_list = &s, .num_sge = 1 };
    CHECK(ibv_post_recv(b.qp, &r1, &rbad) == 0, "ibv_post_recv");
    w.sg_list = &(struct ibv_sge){ .addr = (uintptr_t)src, .length = MSG, .lkey = smr->lkey };
    w.num_sge = 1;
    CHECK(ibv_post_send(a.qp, &w, &sbad) == 0, "ibv_post_send");
    expect_wc(&a, 8, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND after the refused ones");
    expect_wc(&b, 9, IBV_WC_SUCCESS, IBV_WC_RECV, "the receive after the refused ones");
    ep_destroy(&a);
    ep_destroy(&b);
    CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
    printf("2^20 SGEs over a list of one: refused unread (recv EINVAL, srq EINVAL, send ENOMEM): "
           "ok\n");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    (void)fill;                     /* (shared helpers this program does without) */
    (void)same;
    (void)post_rdma;
    struct ibv_context *c0 = open_dev(0), *c1 = open_dev(1);
    struct ibv_pd *p0 = ibv_alloc_pd(c0), *p1 = ibv_alloc_pd(c1);
    CHECK(p0 && p1, "ibv_alloc_pd");
    size_t len = (CHAIN + 1) * MSG;
    uint8_t *src = calloc(1, len), *dst = calloc(1, len);
    CHECK(src && dst, "calloc");
    struct ibv_mr *smr = ibv_reg_mr(p0, src, len, ACCESS_ALL);
    struct ibv_mr *dmr = ibv_reg_mr(p1, dst, len, ACCESS_ALL);
    CHECK(smr && dmr, "ibv_reg_mr");
    recv_case(c0, c1, p0, p1, src, smr, dst, dmr, 0);
    memset(dst, 0, len);
    recv_case(c0, c1, p0, p1, src, smr, dst, dmr, 1);
    memset(dst, 0, len);
    send_case(c0, c1, p0, p1, src, smr, dst, dmr);
    memset(dst, 0, len);
    overlong_case(c0, c1, p0, p1, src, smr, dst, dmr);
    ibv_dereg_mr(smr);
    ibv_dereg_mr(dmr);
    ibv_dealloc_pd(p0);
    ibv_dealloc_pd(p1);
    ibv_close_device(c0);
    ibv_close_device(c1);
    printf("all chains: ok\n");
    return 0;
}
