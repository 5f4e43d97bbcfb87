/* Moves data through libibverbs and checks every byte (perftest's tools check none).
 *
 *   datacheck            two devices in this process: RC WRITE / READ / SEND with
 *                        immediate / atomics, with classic and extended verbs (ibv_qp_ex
 *                        wr_* posting, ibv_cq_ex polling), UC WRITE, UD SEND, SRQ
 *   datacheck --lossy    for a lossy link: RC only (UC and UD do not recover from loss)
 *                        and messages up to 64 KiB
 *   datacheck --peer     one device; exchanges QP details with a peer program over
 *                        stdin/stdout (one line each way), then WRITEs a pattern into the
 *                        peer's buffer, READs it back, and SENDs it; prints DONE
 */
#include "sn_common.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#define BUF (1u << 20)

struct side {
    struct ep e;
    uint8_t *buf;
    struct ibv_mr *mr;
};

static void side_init(struct side *s, struct ibv_context *ctx, struct ibv_pd *pd,
                      enum ibv_qp_type type, int ex, struct ibv_srq *srq)
{
    ep_init(&s->e, ctx, pd, type, ex, srq);
    CHECK(posix_memalign((void **)&s->buf, 4096, BUF + 4096) == 0, "posix_memalign");
    memset(s->buf, 0, BUF + 4096);
    s->mr = ibv_reg_mr(pd, s->buf, BUF + 4096, ACCESS_ALL);
    CHECK(s->mr, "ibv_reg_mr");
}

static void side_free(struct side *s)
{
    CHECK(ibv_dereg_mr(s->mr) == 0, "ibv_dereg_mr");
    ep_destroy(&s->e);
    free(s->buf);
}

static void post_recv(struct ep *e, struct ibv_srq *srq, uint64_t wr_id, void *addr,
                      uint32_t len, uint32_t lkey)
{
    struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
    struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
    if (srq)
        CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0, "ibv_post_srq_recv");
    else
        CHECK(ibv_post_recv(e->qp, &wr, &bad) == 0, "ibv_post_recv");
}

/* WRITE a then READ back, for each size; a's buffer is the source, b's the target. */
static int lossy;

static void write_read(struct side *a, struct side *b, int use_wr_api, const char *tag)
{
    static const uint32_t sizes[] = {1, 7, 1024, 4097, 65536, BUF};
    char what[128];
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]) - (lossy ? 1 : 0); i++) {
        uint32_t n = sizes[i];
        fill(a->buf, n, n);
        memset(b->buf, 0, n + 64);
        if (use_wr_api) {
            struct ibv_qp_ex *q = a->e.qpx;
            ibv_wr_start(q);
            q->wr_id = 100 + i;
            q->wr_flags = IBV_SEND_SIGNALED;
            ibv_wr_rdma_write(q, b->mr->rkey, (uintptr_t)b->buf);
            ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, n);
            CHECK(ibv_wr_complete(q) == 0, "ibv_wr_complete (write)");
        } else {
            post_rdma(&a->e, IBV_WR_RDMA_WRITE, 100 + i, a->buf, n, a->mr->lkey,
                      (uintptr_t)b->buf, b->mr->rkey);
        }
        snprintf(what, sizeof(what), "%s WRITE %u bytes", tag, n);
        expect_wc(&a->e, 100 + i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, what);
        same(b->buf, a->buf, n, what);
        for (int k = 0; k < 64; k++)
            CHECK(b->buf[n + k] == 0, "WRITE went past its length");
        /* read it back into a zeroed area of a */
        uint8_t *dst = a->buf + BUF + 4096 - n;      /* the end of a's buffer */
        uint8_t *want = malloc(n);
        memcpy(want, b->buf, n);
        memset(dst, 0, n);
        if (use_wr_api) {
            struct ibv_qp_ex *q = a->e.qpx;
            ibv_wr_start(q);
            q->wr_id = 200 + i;
            q->wr_flags = IBV_SEND_SIGNALED;
            ibv_wr_rdma_read(q, b->mr->rkey, (uintptr_t)b->buf);
            ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)dst, n);
            CHECK(ibv_wr_complete(q) == 0, "ibv_wr_complete (read)");
        } else {
            post_rdma(&a->e, IBV_WR_RDMA_READ, 200 + i, dst, n, a->mr->lkey,
                      (uintptr_t)b->buf, b->mr->rkey);
        }
        snprintf(what, sizeof(what), "%s READ %u bytes", tag, n);
        expect_wc(&a->e, 200 + i, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, what);
        same(dst, want, n, what);
        free(want);
    }
}

/* SEND with immediate from a into a receive posted by b (or b's SRQ). */
static void send_imm(struct side *a, struct side *b, struct ibv_srq *srq, int use_wr_api,
                     int inline_data, uint32_t n, const char *tag)
{
    char what[128];
    snprintf(what, sizeof(what), "%s SEND %u bytes%s", tag, n, inline_data ? " inline" : "");
    fill(a->buf, n, n + 7);
    memset(b->buf, 0, n + 64);
    post_recv(&b->e, srq, 7, b->buf, n + 64, b->mr->lkey);
    if (use_wr_api) {
        struct ibv_qp_ex *q = a->e.qpx;
        ibv_wr_start(q);
        q->wr_id = 8;
        q->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send_imm(q, htonl(0x12345678));
        if (inline_data)
            ibv_wr_set_inline_data(q, a->buf, n);
        else
            ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, n);
        CHECK(ibv_wr_complete(q) == 0, "ibv_wr_complete (send)");
    } else {
        struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = n, .lkey = a->mr->lkey };
        struct ibv_send_wr wr = { .wr_id = 8, .sg_list = &sge, .num_sge = 1,
                                  .opcode = IBV_WR_SEND_WITH_IMM,
                                  .send_flags = IBV_SEND_SIGNALED |
                                                (inline_data ? IBV_SEND_INLINE : 0),
                                  .imm_data = htonl(0x12345678) }, *bad;
        CHECK(ibv_post_send(a->e.qp, &wr, &bad) == 0, "ibv_post_send (send)");
    }
    expect_wc(&a->e, 8, IBV_WC_SUCCESS, IBV_WC_SEND, what);
    struct ibv_wc wc = wait_wc(&b->e);
    CHECK(wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV,
          "receive completion");
    CHECK(wc.byte_len == n, "receive byte_len");
    CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0x12345678,
          "receive immediate");
    CHECK(wc.qp_num == b->e.qp->qp_num, "receive qp_num");
    same(b->buf, a->buf, n, what);
}

static void atomics(struct side *a, struct side *b, int use_wr_api)
{
    uint64_t *target = (uint64_t *)(b->buf + 64);
    uint64_t *orig = (uint64_t *)(a->buf + 128);
    *target = 100;
    *orig = 0;
    if (use_wr_api) {
        ibv_wr_start(a->e.qpx);
        a->e.qpx->wr_id = 31;
        a->e.qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_atomic_fetch_add(a->e.qpx, b->mr->rkey, (uintptr_t)target, 5);
        ibv_wr_set_sge(a->e.qpx, a->mr->lkey, (uintptr_t)orig, 8);
        CHECK(ibv_wr_complete(a->e.qpx) == 0, "ibv_wr_complete (atomic)");
    } else {
        struct ibv_sge sge = { .addr = (uintptr_t)orig, .length = 8, .lkey = a->mr->lkey };
        struct ibv_send_wr wr = { .wr_id = 31, .sg_list = &sge, .num_sge = 1,
                                  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
                                  .send_flags = IBV_SEND_SIGNALED }, *bad;
        wr.wr.atomic.remote_addr = (uintptr_t)target;
        wr.wr.atomic.rkey = b->mr->rkey;
        wr.wr.atomic.compare_add = 5;
        CHECK(ibv_post_send(a->e.qp, &wr, &bad) == 0, "ibv_post_send (fetch_add)");
    }
    expect_wc(&a->e, 31, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, "fetch and add");
    CHECK(*orig == 100 && *target == 105, "fetch and add values");
    struct ibv_sge sge = { .addr = (uintptr_t)orig, .length = 8, .lkey = a->mr->lkey };
    struct ibv_send_wr wr = { .wr_id = 32, .sg_list = &sge, .num_sge = 1,
                              .opcode = IBV_WR_ATOMIC_CMP_AND_SWP,
                              .send_flags = IBV_SEND_SIGNALED }, *bad;
    wr.wr.atomic.remote_addr = (uintptr_t)target;
    wr.wr.atomic.rkey = b->mr->rkey;
    wr.wr.atomic.compare_add = 105;
    wr.wr.atomic.swap = 7;
    CHECK(ibv_post_send(a->e.qp, &wr, &bad) == 0, "ibv_post_send (cmp_swap)");
    expect_wc(&a->e, 32, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, "compare and swap");
    CHECK(*orig == 105 && *target == 7, "compare and swap values");
}

static void pair(struct side *a, struct side *b, struct ibv_context *c0, struct ibv_pd *p0,
                 struct ibv_context *c1, struct ibv_pd *p1, enum ibv_qp_type t, int ex,
                 struct ibv_srq *srq)
{
    side_init(a, c0, p0, t, ex, NULL);
    side_init(b, c1, p1, t, ex, srq);
    ep_connect(&a->e, b->e.qp->qp_num, &b->e.gid);
    ep_connect(&b->e, a->e.qp->qp_num, &a->e.gid);
}

static int loopback(void)
{
    struct ibv_context *c0 = open_dev(0), *c1 = open_dev(1);
    struct ibv_pd *p0 = ibv_alloc_pd(c0), *p1 = ibv_alloc_pd(c1);
    struct side a, b;
    CHECK(p0 && p1, "ibv_alloc_pd");

    pair(&a, &b, c0, p0, c1, p1, IBV_QPT_RC, 0, NULL);
    write_read(&a, &b, 0, "RC");
    send_imm(&a, &b, NULL, 0, 0, 4097, "RC");
    send_imm(&a, &b, NULL, 0, 1, 200, "RC");
    atomics(&a, &b, 0);
    side_free(&a);
    side_free(&b);
    printf("RC classic verbs: ok\n");

    /* a completion channel whose fd a program poll()s, non-blocking, as the kernel's */
    struct ibv_comp_channel *ch = ibv_create_comp_channel(c0);     /* for a's CQ */
    CHECK(ch, "ibv_create_comp_channel");
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
    next_cq_channel = ch;
    pair(&a, &b, c0, p0, c1, p1, IBV_QPT_RC, 0, NULL);
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    errno = 0;
    CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
          "ibv_get_cq_event before any event: EAGAIN");
    CHECK(ibv_req_notify_cq(a.e.cq, 0) == 0, "ibv_req_notify_cq");
    fill(a.buf, 300, 5);
    post_recv(&b.e, NULL, 61, b.buf, 300, b.mr->lkey);
    struct ibv_sge esge = { .addr = (uintptr_t)a.buf, .length = 300, .lkey = a.mr->lkey };
    struct ibv_send_wr ewr = { .wr_id = 62, .sg_list = &esge, .num_sge = 1,
                               .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *ebad;
    CHECK(ibv_post_send(a.e.qp, &ewr, &ebad) == 0, "ibv_post_send (event)");
    struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
    CHECK(poll(&pfd, 1, WAIT_SECONDS * 1000) == 1 && (pfd.revents & POLLIN),
          "poll() on the completion channel's fd");
    CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == a.e.cq, "ibv_get_cq_event");
    ibv_ack_cq_events(ev_cq, 1);
    expect_wc(&a.e, 62, IBV_WC_SUCCESS, IBV_WC_SEND, "SEND completion after its event");
    expect_wc(&b.e, 61, IBV_WC_SUCCESS, IBV_WC_RECV, "RECV of the SEND");
    same(b.buf, a.buf, 300, "SEND with a completion event");
    side_free(&a);
    side_free(&b);
    CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
    printf("completion channel (poll()ed fd): ok\n");

    pair(&a, &b, c0, p0, c1, p1, IBV_QPT_RC, 1, NULL);
    write_read(&a, &b, 1, "RC wr_*");
    send_imm(&a, &b, NULL, 1, 0, 5000, "RC wr_*");
    send_imm(&a, &b, NULL, 1, 1, 100, "RC wr_*");
    atomics(&a, &b, 1);
    side_free(&a);
    side_free(&b);
    printf("RC extended verbs (ibv_qp_ex, ibv_cq_ex): ok\n");

    if (lossy)            /* UC and UD do not recover from loss: leave them out */
        goto srq;
    pair(&a, &b, c0, p0, c1, p1, IBV_QPT_UC, 0, NULL);
    fill(a.buf, 10000, 3);
    post_rdma(&a.e, IBV_WR_RDMA_WRITE, 41, a.buf, 10000, a.mr->lkey, (uintptr_t)b.buf,
              b.mr->rkey);
    expect_wc(&a.e, 41, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "UC WRITE");
    double end = now_s() + WAIT_SECONDS;     /* UC: no ACK, wait for the bytes to land */
    while (memcmp(b.buf, a.buf, 10000) && now_s() < end)
        ibv_poll_cq(b.e.cq, 0, NULL), usleep(1000);
    same(b.buf, a.buf, 10000, "UC WRITE");
    send_imm(&a, &b, NULL, 0, 0, 3000, "UC");
    side_free(&a);
    side_free(&b);
    printf("UC: ok\n");
srq:;

    struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
    struct ibv_srq *srq = ibv_create_srq(p1, &sa);
    CHECK(srq, "ibv_create_srq");
    pair(&a, &b, c0, p0, c1, p1, IBV_QPT_RC, 0, srq);
    send_imm(&a, &b, srq, 0, 0, 2048, "RC with SRQ");
    side_free(&a);
    side_free(&b);
    CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
    printf("SRQ: ok\n");

    if (lossy)
        goto done;
    side_init(&a, c0, p0, IBV_QPT_UD, 0, NULL);
    side_init(&b, c1, p1, IBV_QPT_UD, 0, NULL);
    ep_connect(&a.e, 0, NULL);
    ep_connect(&b.e, 0, NULL);
    struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
                              .grh = { .dgid = b.e.gid, .hop_limit = 64 } };
    struct ibv_ah *ah = ibv_create_ah(p0, &aa);
    CHECK(ah, "ibv_create_ah");
    fill(a.buf, 1000, 9);
    post_recv(&b.e, NULL, 51, b.buf, 1000 + 40, b.mr->lkey);
    struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 1000, .lkey = a.mr->lkey };
    struct ibv_send_wr wr = { .wr_id = 52, .sg_list = &sge, .num_sge = 1,
                              .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = b.e.qp->qp_num;
    wr.wr.ud.remote_qkey = 0x11111111;
    CHECK(ibv_post_send(a.e.qp, &wr, &bad) == 0, "ibv_post_send (UD)");
    expect_wc(&a.e, 52, IBV_WC_SUCCESS, IBV_WC_SEND, "UD SEND");
    struct ibv_wc wc = wait_wc(&b.e);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 51 && wc.byte_len == 1040,
          "UD receive completion");
    CHECK(wc.src_qp == a.e.qp->qp_num && (wc.wc_flags & IBV_WC_GRH), "UD source QP and GRH");
    same(b.buf + 40, a.buf, 1000, "UD SEND");
    CHECK(ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
    side_free(&a);
    side_free(&b);
    printf("UD: ok\n");
done:

    CHECK(ibv_dealloc_pd(p0) == 0 && ibv_dealloc_pd(p1) == 0, "ibv_dealloc_pd");
    CHECK(ibv_close_device(c0) == 0 && ibv_close_device(c1) == 0, "ibv_close_device");
    printf("datacheck: all bytes checked\n");
    return 0;
}

/* One line each way: "qpn gid(32 hex) rkey addr". */
static void put_line(struct side *s)
{
    printf("%u ", s->e.qp->qp_num);
    for (int i = 0; i < 16; i++)
        printf("%02x", s->e.gid.raw[i]);
    printf(" %u %" PRIu64 "\n", s->mr->rkey, (uint64_t)(uintptr_t)s->buf);
    fflush(stdout);
}

static int peer(void)
{
    struct ibv_context *c = open_dev(0);
    struct ibv_pd *pd = ibv_alloc_pd(c);
    struct side a;
    char gid[33];
    unsigned qpn, rkey;
    uint64_t addr;
    union ibv_gid dgid;
    CHECK(pd, "ibv_alloc_pd");
    side_init(&a, c, pd, IBV_QPT_RC, 0, NULL);
    put_line(&a);
    CHECK(scanf("%u %32s %u %" SCNu64, &qpn, gid, &rkey, &addr) == 4, "reading the peer");
    for (int i = 0; i < 16; i++)
        CHECK(sscanf(gid + 2 * i, "%2hhx", &dgid.raw[i]) == 1, "peer GID");
    ep_connect(&a.e, qpn, &dgid);
    /* WRITE 100000 bytes of pattern into the peer's buffer, READ them back, SEND them */
    const uint32_t n = 100000;
    fill(a.buf, n, 42);
    post_rdma(&a.e, IBV_WR_RDMA_WRITE, 1, a.buf, n, a.mr->lkey, addr, rkey);
    expect_wc(&a.e, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "WRITE to the peer");
    memset(a.buf + n, 0, n);
    post_rdma(&a.e, IBV_WR_RDMA_READ, 2, a.buf + n, n, a.mr->lkey, addr, rkey);
    expect_wc(&a.e, 2, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "READ from the peer");
    same(a.buf + n, a.buf, n, "READ back from the peer");
    struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = n, .lkey = a.mr->lkey };
    struct ibv_send_wr wr = { .wr_id = 3, .sg_list = &sge, .num_sge = 1,
                              .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
                              .imm_data = htonl(0xC0FFEE) }, *bad;
    CHECK(ibv_post_send(a.e.qp, &wr, &bad) == 0, "ibv_post_send");
    expect_wc(&a.e, 3, IBV_WC_SUCCESS, IBV_WC_SEND, "SEND to the peer");
    printf("DONE\n");
    fflush(stdout);
    char bye[8];
    CHECK(scanf("%7s", bye) == 1, "waiting for the peer's BYE");
    side_free(&a);
    ibv_dealloc_pd(pd);
    ibv_close_device(c);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && !strcmp(argv[1], "--peer"))
        return peer();
    lossy = argc > 1 && !strcmp(argv[1], "--lossy");
    return loopback();
}
