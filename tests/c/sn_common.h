/* Shared helpers of the C verbs test programs: plain libibverbs, nothing softnic-specific,
 * so the same programs run against any verbs provider. */
#ifndef SN_COMMON_H
#define SN_COMMON_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ACCESS_ALL (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
                    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)
#define WAIT_SECONDS 20

static void die(const char *what)
{
    fprintf(stderr, "FAIL: %s (errno %d: %s)\n", what, errno, strerror(errno));
    exit(1);
}

#define CHECK(cond, what) do { if (!(cond)) die(what); } while (0)

struct ep {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_cq_ex *cqx;       /* set when made with ibv_create_cq_ex */
    struct ibv_qp *qp;
    struct ibv_qp_ex *qpx;       /* set when made with ibv_create_qp_ex */
    struct ibv_srq *srq;
    union ibv_gid gid;
    enum ibv_qp_type type;
};

/* the completion channel of the next CQ ep_init makes (classic verbs), then NULL again */
static struct ibv_comp_channel *next_cq_channel;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct ibv_context *open_dev(int index)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n > index, "ibv_get_device_list: not enough devices");
    struct ibv_context *ctx = ibv_open_device(list[index]);
    CHECK(ctx, "ibv_open_device");
    ibv_free_device_list(list);
    return ctx;
}

/* A QP (RC, UC or UD) with its own CQ, on ctx/pd; ex=1 uses the extended verbs. */
static void ep_init(struct ep *e, struct ibv_context *ctx, struct ibv_pd *pd,
                    enum ibv_qp_type type, int ex, struct ibv_srq *srq)
{
    memset(e, 0, sizeof(*e));
    e->ctx = ctx;
    e->pd = pd;
    e->type = type;
    e->srq = srq;
    if (ex) {
        struct ibv_cq_init_attr_ex ca = { .cqe = 256, .wc_flags = IBV_WC_STANDARD_FLAGS };
        e->cqx = ibv_create_cq_ex(ctx, &ca);
        CHECK(e->cqx, "ibv_create_cq_ex");
        e->cq = ibv_cq_ex_to_cq(e->cqx);
        struct ibv_qp_init_attr_ex qa = {
            .qp_type = type, .send_cq = e->cq, .recv_cq = e->cq, .srq = srq,
            .cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 4,
                     .max_recv_sge = 4, .max_inline_data = 256 },
            .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
            .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                              IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                              IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                              IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        };
        e->qp = ibv_create_qp_ex(ctx, &qa);
        CHECK(e->qp, "ibv_create_qp_ex");
        e->qpx = ibv_qp_to_qp_ex(e->qp);
        CHECK(e->qpx, "ibv_qp_to_qp_ex");
    } else {
        e->cq = ibv_create_cq(ctx, 256, NULL, next_cq_channel, 0);
        next_cq_channel = NULL;
        CHECK(e->cq, "ibv_create_cq");
        struct ibv_qp_init_attr qa = {
            .qp_type = type, .send_cq = e->cq, .recv_cq = e->cq, .srq = srq,
            .cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 4,
                     .max_recv_sge = 4, .max_inline_data = 256 },
        };
        e->qp = ibv_create_qp(pd, &qa);
        CHECK(e->qp, "ibv_create_qp");
    }
    CHECK(ibv_query_gid(ctx, 1, 0, &e->gid) == 0, "ibv_query_gid");
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                             .qp_access_flags = ACCESS_ALL, .qkey = 0x11111111 };
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
               (type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
    CHECK(ibv_modify_qp(e->qp, &a, mask) == 0, "modify QP to INIT");
}

/* INIT -> RTR -> RTS towards a peer QP (for UD the peer is given per send). */
static void ep_connect(struct ep *e, uint32_t dqpn, const union ibv_gid *dgid)
{
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
    int mask = IBV_QP_STATE;
    if (e->type != IBV_QPT_UD) {
        a.path_mtu = IBV_MTU_4096;
        a.dest_qp_num = dqpn;
        a.rq_psn = 0x1234;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = *dgid;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.port_num = 1;
        mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
        if (e->type == IBV_QPT_RC) {
            a.max_dest_rd_atomic = 4;
            a.min_rnr_timer = 1;
            mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        }
    }
    CHECK(ibv_modify_qp(e->qp, &a, mask) == 0, "modify QP to RTR");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0x1234;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (e->type == IBV_QPT_RC) {
        a.timeout = 10;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 4;
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    CHECK(ibv_modify_qp(e->qp, &a, mask) == 0, "modify QP to RTS");
}

/* Two RC QPs, a on ctx0/pd0 and b on ctx1/pd1, each connected to the other
 * (classic verbs, no SRQ). */
static inline void ep_rc_pair(struct ep *a, struct ibv_context *ctx0, struct ibv_pd *pd0,
                              struct ep *b, struct ibv_context *ctx1, struct ibv_pd *pd1)
{
    ep_init(a, ctx0, pd0, IBV_QPT_RC, 0, NULL);
    ep_init(b, ctx1, pd1, IBV_QPT_RC, 0, NULL);
    ep_connect(a, b->qp->qp_num, &b->gid);
    ep_connect(b, a->qp->qp_num, &a->gid);
}

static void ep_destroy(struct ep *e)
{
    CHECK(ibv_destroy_qp(e->qp) == 0, "ibv_destroy_qp");
    CHECK(ibv_destroy_cq(e->cq) == 0, "ibv_destroy_cq");
}

/* One completion from the CQ (classic or extended polling), or die after WAIT_SECONDS. */
static struct ibv_wc wait_wc(struct ep *e)
{
    struct ibv_wc wc;
    double end = now_s() + WAIT_SECONDS;
    memset(&wc, 0, sizeof(wc));
    while (now_s() < end) {
        if (e->cqx) {
            struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
            int rc = ibv_start_poll(e->cqx, &pa);
            if (rc == ENOENT)
                continue;
            CHECK(rc == 0, "ibv_start_poll");
            wc.wr_id = e->cqx->wr_id;
            wc.status = e->cqx->status;
            wc.opcode = ibv_wc_read_opcode(e->cqx);
            wc.byte_len = ibv_wc_read_byte_len(e->cqx);
            wc.wc_flags = ibv_wc_read_wc_flags(e->cqx);
            wc.imm_data = ibv_wc_read_imm_data(e->cqx);
            wc.qp_num = ibv_wc_read_qp_num(e->cqx);
            wc.src_qp = ibv_wc_read_src_qp(e->cqx);
            ibv_end_poll(e->cqx);
            return wc;
        }
        int n = ibv_poll_cq(e->cq, 1, &wc);
        CHECK(n >= 0, "ibv_poll_cq");
        if (n == 1)
            return wc;
    }
    errno = ETIMEDOUT;
    die("no completion");
    return wc;
}

static void expect_wc(struct ep *e, uint64_t wr_id, enum ibv_wc_status status,
                      enum ibv_wc_opcode opcode, const char *what)
{
    struct ibv_wc wc = wait_wc(e);
    if (wc.wr_id != wr_id || wc.status != status ||
        (status == IBV_WC_SUCCESS && wc.opcode != opcode)) {
        fprintf(stderr, "FAIL: %s: got wr_id %" PRIu64 " status %s (%d) opcode %d, "
                "expected wr_id %" PRIu64 " status %s opcode %d\n", what, wc.wr_id,
                ibv_wc_status_str(wc.status), wc.status, wc.opcode, wr_id,
                ibv_wc_status_str(status), opcode);
        exit(1);
    }
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

static void same(const uint8_t *got, const uint8_t *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "FAIL: %s: byte %zu of %zu is %#x, expected %#x\n", what, i, n,
                    got[i], want[i]);
            exit(1);
        }
}

static void post_rdma(struct ep *e, enum ibv_wr_opcode op, uint64_t wr_id, void *local,
                      uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
    struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
    struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
                              .send_flags = IBV_SEND_SIGNALED }, *bad;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    CHECK(ibv_post_send(e->qp, &wr, &bad) == 0, "ibv_post_send (RDMA)");
}

#endif
