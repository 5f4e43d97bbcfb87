/* ibv_poll_cq's cases on one device, two RC QPs connected to each other on it (a
 * process with one device: a provider may answer an empty poll without its
 * slow path), or with "two" the second QP (and the channel) on a second device
 * of the same process.  Empty polls of a CQ with nothing on the way; completions
 * made while the program spins (a WRITE WITH IMM the other QP receives, an
 * error completion the retransmission timer makes) are found; an armed CQ's
 * empty poll leaves what arrives to the device's own progress (the program
 * then waits on the channel's fd, as UCX does); a CQ armed once and spun on after
 * (UCX's progress loop) is polled as any other, its event still raised; a
 * program that arms and then sleeps on the channel's fd without polling between
 * (UCX's wait) gets its event; an overflowed CQ reports it.
 * Plain libibverbs: runs against any provider. */
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "sn_common.h"

#define SIZE 512

static struct ibv_wc spin(struct ep *e, const char *what)
{
    struct ibv_wc wc;
    double end = now_s() + WAIT_SECONDS;
    for (;;) {
        int n = ibv_poll_cq(e->cq, 1, &wc);
        CHECK(n >= 0, what);
        if (n == 1)
            return wc;
        if (now_s() > end) {
            errno = ETIMEDOUT;
            die(what);
        }
    }
}

/* a receive of SIZE bytes at dst on e's QP */
static void post_recv_at(struct ep *e, uint64_t wr_id, void *dst, uint32_t lkey)
{
    struct ibv_sge rs = { .addr = (uintptr_t)dst, .length = SIZE, .lkey = lkey };
    struct ibv_recv_wr rwr = { .wr_id = wr_id, .sg_list = &rs, .num_sge = 1 }, *rbad;
    CHECK(ibv_post_recv(e->qp, &rwr, &rbad) == 0, "ibv_post_recv");
}

/* a signaled SEND of src's first 8 bytes on e's QP */
static void post_send8(struct ep *e, uint64_t wr_id, void *src, uint32_t lkey)
{
    struct ibv_sge ss = { .addr = (uintptr_t)src, .length = 8, .lkey = lkey };
    struct ibv_send_wr swr = { .wr_id = wr_id, .sg_list = &ss, .num_sge = 1,
                               .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
                       *sbad;
    CHECK(ibv_post_send(e->qp, &swr, &sbad) == 0, "ibv_post_send");
}

/* the channel's next event, cq's, within 0.5 s: taken and acknowledged */
static void take_event(struct ibv_comp_channel *ch, struct ibv_cq *cq, const char *what)
{
    struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
    CHECK(poll(&pfd, 1, 500) == 1, what);
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq, "ibv_get_cq_event");
    ibv_ack_cq_events(ev_cq, 1);
}

int main(int argc, char **argv)
{
    int two = argc > 1 && strcmp(argv[1], "two") == 0;
    struct ibv_context *c = open_dev(0), *c2 = two ? open_dev(1) : c;
    struct ibv_pd *pd = ibv_alloc_pd(c), *pd2 = two ? ibv_alloc_pd(c2) : pd;
    CHECK(pd && pd2, "ibv_alloc_pd");
    struct ibv_comp_channel *ch = ibv_create_comp_channel(c2);
    CHECK(ch, "ibv_create_comp_channel");
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
    struct ep a, b;
    ep_init(&a, c, pd, IBV_QPT_RC, 0, NULL);
    next_cq_channel = ch;
    ep_init(&b, c2, pd2, IBV_QPT_RC, 0, NULL);
    ep_connect(&a, b.qp->qp_num, &b.gid);
    ep_connect(&b, a.qp->qp_num, &a.gid);
    uint8_t *src = calloc(1, SIZE), *dst = calloc(1, SIZE);
    CHECK(src && dst, "calloc");
    struct ibv_mr *ms = ibv_reg_mr(pd, src, SIZE, ACCESS_ALL);
    struct ibv_mr *md = ibv_reg_mr(pd2, dst, SIZE, ACCESS_ALL);
    CHECK(ms && md, "ibv_reg_mr");
    struct ibv_wc wc;

    /* empty polls, nothing on the way */
    for (int i = 0; i < 20000; i++)
        CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0 && ibv_poll_cq(b.cq, 1, &wc) == 0,
              "an empty CQ");
    printf("empty polls: ok\n");

    /* completions found by a program spinning on its CQ */
    for (int i = 0; i < 50; i++) {
        struct ibv_sge rs = { .addr = (uintptr_t)dst, .length = SIZE, .lkey = md->lkey };
        struct ibv_recv_wr rwr = { .wr_id = 100 + i, .sg_list = &rs, .num_sge = 1 }, *rbad;
        CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0, "ibv_post_recv");
        CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0, "an empty CQ");
        fill(src, SIZE, i + 1);
        struct ibv_sge ss = { .addr = (uintptr_t)src, .length = SIZE, .lkey = ms->lkey };
        struct ibv_send_wr swr = { .wr_id = i, .sg_list = &ss, .num_sge = 1,
                                   .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                                   .send_flags = IBV_SEND_SIGNALED,
                                   .imm_data = htobe32(i) }, *sbad;
        swr.wr.rdma.remote_addr = (uintptr_t)dst;
        swr.wr.rdma.rkey = md->rkey;
        CHECK(ibv_post_send(a.qp, &swr, &sbad) == 0, "ibv_post_send");
        wc = spin(&b, "the WRITE WITH IMM's receive completion");
        CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(100 + i) &&
              wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && be32toh(wc.imm_data) == (uint32_t)i,
              "the receive completion");
        same(dst, src, SIZE, "the WRITE WITH IMM's data");
        expect_wc(&a, i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the WRITE's completion");
    }
    fill(src, SIZE, 99);
    post_rdma(&a, IBV_WR_RDMA_WRITE, 60, src, SIZE, ms->lkey, (uintptr_t)dst, md->rkey);
    expect_wc(&a, 60, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "a WRITE's completion");
    same(dst, src, SIZE, "a WRITE's data");
    printf("completions found while spinning: ok\n");

    /* an armed CQ: its empty poll leaves the device to its own progress, and the
     * program waits on the channel's fd */
    for (int i = 0; i < 5; i++) {
        post_recv_at(&b, 200 + i, dst, md->lkey);
        CHECK(ibv_req_notify_cq(b.cq, 0) == 0, "ibv_req_notify_cq");
        CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0, "an empty armed CQ");
        post_send8(&a, 300 + i, src, ms->lkey);
        take_event(ch, b.cq, "the channel's event within 0.5 s, nobody polling");
        wc = spin(&b, "the SEND's receive completion");
        CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(200 + i), "the receive");
        expect_wc(&a, 300 + i, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND's completion");
    }
    printf("an armed CQ's empty poll: ok\n");

    /* a CQ armed once and then spun on (UCX's progress loop polls the CQs of its
     * wireup's UD transport, armed for its async thread): only the first poll
     * after the arm is a program about to sleep; the rest are empty polls like any
     * other (answered without the slow path where a provider has one), and the
     * event still comes when a completion does */
    post_recv_at(&b, 400, dst, md->lkey);
    CHECK(ibv_req_notify_cq(b.cq, 0) == 0, "ibv_req_notify_cq");
    for (int i = 0; i < 20000; i++)
        CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0, "an empty CQ armed once");
    post_send8(&a, 401, src, ms->lkey);
    wc = spin(&b, "the SEND's receive completion, spinning on the armed CQ");
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 400, "the receive");
    take_event(ch, b.cq, "the armed CQ's event");
    expect_wc(&a, 401, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND's completion");
    printf("a CQ armed once, spun on: ok\n");

    /* an arm and a sleep on the channel's fd with no poll between (UCX's
     * ucp_worker_wait: progress, arm, poll(2) on the fd): the lease the program's
     * poll just before renewed (a spinner's lease is 5 s here) must not keep what
     * arrives from the device's own progress while the program sleeps */
    for (int i = 0; i < 5; i++) {
        post_recv_at(&b, 600 + i, dst, md->lkey);
        CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0, "an empty CQ");
        post_send8(&a, 700 + i, src, ms->lkey);
        CHECK(ibv_req_notify_cq(b.cq, 0) == 0, "ibv_req_notify_cq");
        take_event(ch, b.cq, "the channel's event within 0.5 s of an arm, no poll since");
        wc = spin(&b, "the SEND's receive completion");
        CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(600 + i), "the receive");
        expect_wc(&a, 700 + i, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND's completion");
    }
    printf("an arm, then a sleep on the fd: ok\n");

    /* an error completion the retransmission timer makes while the program spins:
     * a QP whose peer is a QP number nobody has */
    struct ep d;
    ep_init(&d, c, pd, IBV_QPT_RC, 0, NULL);
    {
        struct ibv_qp_attr q = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
                                 .dest_qp_num = 0xABCDE, .rq_psn = 0,
                                 .max_dest_rd_atomic = 1, .min_rnr_timer = 1 };
        q.ah_attr.is_global = 1;
        q.ah_attr.grh.dgid = d.gid;
        q.ah_attr.grh.hop_limit = 64;
        q.ah_attr.port_num = 1;
        CHECK(ibv_modify_qp(d.qp, &q, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                            IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                            IBV_QP_MIN_RNR_TIMER) == 0, "RTR");
        memset(&q, 0, sizeof(q));
        q.qp_state = IBV_QPS_RTS;
        q.timeout = 4;                    /* 64 us */
        q.retry_cnt = 1;
        q.rnr_retry = 1;
        q.max_rd_atomic = 1;
        CHECK(ibv_modify_qp(d.qp, &q, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                            IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_MAX_QP_RD_ATOMIC) == 0, "RTS");
        struct ibv_sge ss = { .addr = (uintptr_t)src, .length = 8, .lkey = ms->lkey };
        struct ibv_send_wr swr = { .wr_id = 400, .sg_list = &ss, .num_sge = 1,
                                   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
                           *sbad;
        CHECK(ibv_post_send(d.qp, &swr, &sbad) == 0, "ibv_post_send");
        wc = spin(&d, "the error completion");
        CHECK(wc.wr_id == 400 && wc.status == IBV_WC_RETRY_EXC_ERR, "retries exhausted");
    }
    printf("an error completion from the timer: ok\n");

    /* an overflowed CQ says so */
    struct ibv_cq *small = ibv_create_cq(c, 2, NULL, NULL, 0);
    CHECK(small, "ibv_create_cq");
    struct ibv_qp_init_attr qa = { .send_cq = small, .recv_cq = small, .qp_type = IBV_QPT_RC,
                                   .cap = { .max_send_wr = 8, .max_recv_wr = 8,
                                            .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ep e = b;
    e.qp = ibv_create_qp(pd, &qa);
    CHECK(e.qp, "ibv_create_qp");
    e.cq = small;
    struct ibv_qp_attr ia = { .qp_state = IBV_QPS_INIT, .port_num = 1,
                              .qp_access_flags = ACCESS_ALL };
    CHECK(ibv_modify_qp(e.qp, &ia, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                        IBV_QP_ACCESS_FLAGS) == 0, "INIT");
    for (int i = 0; i < 3; i++) {      /* flushed when the QP fails: 3 completions, 2 slots */
        struct ibv_sge rs = { .addr = (uintptr_t)src, .length = 8, .lkey = ms->lkey };
        struct ibv_recv_wr rwr = { .wr_id = 500 + i, .sg_list = &rs, .num_sge = 1 }, *rbad;
        CHECK(ibv_post_recv(e.qp, &rwr, &rbad) == 0, "ibv_post_recv");
    }
    struct ibv_qp_attr ea = { .qp_state = IBV_QPS_ERR };
    CHECK(ibv_modify_qp(e.qp, &ea, IBV_QP_STATE) == 0, "to ERR");
    double end = now_s() + WAIT_SECONDS;
    int r;
    while ((r = ibv_poll_cq(small, 1, &wc)) >= 0) {
        CHECK(now_s() < end, "the overflow reported");
    }
    printf("an overflowed CQ: %d: ok\n", r);
    CHECK(ibv_destroy_qp(e.qp) == 0 && ibv_destroy_cq(small) == 0, "destroy");
    ep_destroy(&d);
    ep_destroy(&a);
    ep_destroy(&b);
    CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
    CHECK(ibv_dereg_mr(ms) == 0 && ibv_dereg_mr(md) == 0, "ibv_dereg_mr");
    CHECK(ibv_dealloc_pd(pd) == 0 && (!two || ibv_dealloc_pd(pd2) == 0), "ibv_dealloc_pd");
    /* (closed, each device publishes its final counters) */
    CHECK(ibv_close_device(c) == 0 && (!two || ibv_close_device(c2) == 0), "ibv_close_device");
    printf("all checks: ok\n");
    return 0;
}
