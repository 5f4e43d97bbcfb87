/* A post that the provider holds for the program's next call still leaves when that
 * call never comes.  The program polls its CQ (a spinner), has a 64 KiB WRITE
 * outstanding (every datagram is delayed, so its ACK is late), posts a second WRITE,
 * and then spins on the target memory alone, with no verbs call, until the second
 * WRITE's bytes land.  The test reads the device's counters afterwards: the bytes
 * must have come without a retransmission.  Two devices in this process, an RC pair
 * whose retransmission timeout (about 4 s) no delay here reaches. */
#include "sn_common.h"

#define BIG 65536
#define FLAG_AT BIG

static void connect_slow_timer(struct ep *e, uint32_t dqpn, const union ibv_gid *dgid)
{
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096,
                             .dest_qp_num = dqpn, .rq_psn = 0x4321, .max_dest_rd_atomic = 4,
                             .min_rnr_timer = 1 };
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *dgid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                        IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                        IBV_QP_MIN_RNR_TIMER) == 0, "modify QP to RTR");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0x4321;
    a.timeout = 20;                 /* 4.096 us * 2^20: about 4.3 s */
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                        IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
          "modify QP to RTS");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    (void)ep_connect;               /* (shared helpers this program does without) */
    (void)same;
    (void)post_rdma;
    struct ibv_context *c0 = open_dev(0), *c1 = open_dev(1);
    struct ibv_pd *p0 = ibv_alloc_pd(c0), *p1 = ibv_alloc_pd(c1);
    CHECK(p0 && p1, "ibv_alloc_pd");
    uint8_t *src = calloc(1, BIG + 64), *dst = calloc(1, BIG + 64);
    CHECK(src && dst, "calloc");
    fill(src, BIG, 3);
    src[FLAG_AT] = 0x5A;
    struct ibv_mr *smr = ibv_reg_mr(p0, src, BIG + 64, ACCESS_ALL);
    struct ibv_mr *dmr = ibv_reg_mr(p1, dst, BIG + 64, ACCESS_ALL);
    CHECK(smr && dmr, "ibv_reg_mr");
    struct ep a, b;
    ep_init(&a, c0, p0, IBV_QPT_RC, 0, NULL);
    ep_init(&b, c1, p1, IBV_QPT_RC, 0, NULL);
    connect_slow_timer(&a, b.qp->qp_num, &b.gid);
    connect_slow_timer(&b, a.qp->qp_num, &a.gid);

    struct ibv_sge s1 = { .addr = (uintptr_t)src, .length = BIG, .lkey = smr->lkey };
    struct ibv_send_wr w1 = { .wr_id = 1, .sg_list = &s1, .num_sge = 1,
                              .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED },
                       *bad;
    w1.wr.rdma.remote_addr = (uintptr_t)dst;
    w1.wr.rdma.rkey = dmr->rkey;
    CHECK(ibv_post_send(a.qp, &w1, &bad) == 0, "ibv_post_send (the first WRITE)");
    struct ibv_wc wc;
    int n = ibv_poll_cq(a.cq, 1, &wc);      /* a spinner's poll: its ACK is not back yet */
    CHECK(n == 0, "the first WRITE completed before its delayed ACK could come");

    struct ibv_sge s2 = { .addr = (uintptr_t)(src + FLAG_AT), .length = 1, .lkey = smr->lkey };
    struct ibv_send_wr w2 = { .wr_id = 2, .sg_list = &s2, .num_sge = 1,
                              .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
    w2.wr.rdma.remote_addr = (uintptr_t)(dst + FLAG_AT);
    w2.wr.rdma.rkey = dmr->rkey;
    CHECK(ibv_post_send(a.qp, &w2, &bad) == 0, "ibv_post_send (the second WRITE)");
    double t0 = now_s(), end = t0 + WAIT_SECONDS;
    while (((volatile uint8_t *)dst)[FLAG_AT] != 0x5A) {   /* no verbs call meanwhile */
        if (now_s() > end) {
            errno = ETIMEDOUT;
            die("the second WRITE never landed while the program spun on memory");
        }
    }
    printf("the held WRITE landed after %.1f ms without a verbs call\n", (now_s() - t0) * 1e3);
    expect_wc(&a, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the first WRITE");
    expect_wc(&a, 2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the second WRITE");
    for (int i = 0; i < BIG; i++)
        CHECK(dst[i] == src[i], "the first WRITE's bytes");
    ep_destroy(&a);
    ep_destroy(&b);
    ibv_dereg_mr(smr);
    ibv_dereg_mr(dmr);
    ibv_dealloc_pd(p0);
    ibv_dealloc_pd(p1);
    ibv_close_device(c0);
    ibv_close_device(c1);
    printf("all checks: ok\n");
    return 0;
}
