/* One process, two devices: N messages of SIZE bytes from device 0 to device 1
 * through the C face, one at a time (post, then poll both CQs until the message
 * has completed on both sides), and the CPU time (all of the process's threads:
 * the program's, the interpreter's, the progress threads') and wall time per
 * message.  OP is "send" (a receive posted first) or "write".  Driven by
 * tools/cface_loop.py, under `softnic exec`. */
#include "../tests/c/sn_common.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: cface_loop send|write N SIZE\n");
        return 2;
    }
    int send = !strcmp(argv[1], "send");
    int n = atoi(argv[2]);
    size_t size = strtoul(argv[3], NULL, 0);
    struct ibv_context *c0 = open_dev(0), *c1 = open_dev(1);
    struct ibv_pd *p0 = ibv_alloc_pd(c0), *p1 = ibv_alloc_pd(c1);
    CHECK(p0 && p1, "ibv_alloc_pd");
    struct ep a, b;
    ep_rc_pair(&a, c0, p0, &b, c1, p1);
    uint8_t *sb = malloc(size), *rb = calloc(1, size);
    CHECK(sb && rb, "malloc");
    fill(sb, size, 1);
    struct ibv_mr *ms = ibv_reg_mr(p0, sb, size, ACCESS_ALL);
    struct ibv_mr *mr = ibv_reg_mr(p1, rb, size, ACCESS_ALL);
    CHECK(ms && mr, "ibv_reg_mr");
    struct timespec c0t = {0, 0}, c1t;
    double w0 = 0;
    for (int i = -200; i < n; i++) {          /* 200 first, not timed */
        if (i == 0) {
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0t);
            w0 = now_s();
        }
        if (send) {
            struct ibv_sge rs = {(uintptr_t)rb, (uint32_t)size, mr->lkey};
            struct ibv_recv_wr rw = {.wr_id = (uint64_t)i, .sg_list = &rs, .num_sge = 1}, *rbad;
            CHECK(ibv_post_recv(b.qp, &rw, &rbad) == 0, "ibv_post_recv");
        }
        struct ibv_sge ss = {(uintptr_t)sb, (uint32_t)size, ms->lkey};
        struct ibv_send_wr sw = {.wr_id = (uint64_t)i, .sg_list = &ss, .num_sge = 1,
                                 .opcode = send ? IBV_WR_SEND : IBV_WR_RDMA_WRITE,
                                 .send_flags = IBV_SEND_SIGNALED}, *sbad;
        sw.wr.rdma.remote_addr = (uintptr_t)rb;
        sw.wr.rdma.rkey = mr->rkey;
        CHECK(ibv_post_send(a.qp, &sw, &sbad) == 0, "ibv_post_send");
        int got_a = 0, got_b = !send;
        double end = now_s() + WAIT_SECONDS;
        while (!got_a || !got_b) {
            struct ibv_wc wc;
            if (!got_b && ibv_poll_cq(b.cq, 1, &wc) == 1) {
                CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == size,
                      "the receive's completion");
                got_b = 1;
            }
            if (!got_a && ibv_poll_cq(a.cq, 1, &wc) == 1) {
                CHECK(wc.status == IBV_WC_SUCCESS, "the send's completion");
                got_a = 1;
            }
            CHECK(now_s() < end, "no completion");
        }
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1t);
    double w1 = now_s();
    same(rb, sb, size, "the bytes that landed");
    double cpu = (c1t.tv_sec - c0t.tv_sec) + (c1t.tv_nsec - c0t.tv_nsec) * 1e-9;
    printf("cface_loop %s %zu: %d messages, cpu_us %.2f wall_us %.2f\n", argv[1], size, n,
           cpu / n * 1e6, (w1 - w0) / n * 1e6);
    return 0;
}
