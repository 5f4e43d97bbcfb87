/* A thread blocked in ibv_get_cq_event on a completion channel (blocking fd, as
 * ibv_rc_pingpong -e and rping use it): its events, a signal while it waits (with
 * and without SA_RESTART, as the kernel's read() of the channel answers), and
 * pthread_cancel while it waits (rping's CQ thread), after which the device still
 * makes progress with nobody calling it.  Plain libibverbs: runs against any
 * provider.  Devices 0 (a) and 1 (b) of this process, RC. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include "sn_common.h"

#define ROUNDS 40
#define SIZE 256

static struct ep a, b;
static struct ibv_comp_channel *ch;          /* b's CQ's */
static struct ibv_mr *ma, *mb;
static uint8_t *bufa, *bufb;
static pthread_t main_thread;
static volatile sig_atomic_t got_signal;

static void post_recv_b(uint64_t wr_id)
{
    struct ibv_sge sge = { .addr = (uintptr_t)bufb, .length = SIZE, .lkey = mb->lkey };
    struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
    CHECK(ibv_post_recv(b.qp, &wr, &bad) == 0, "ibv_post_recv");
}

static void send_a(uint64_t wr_id)
{
    struct ibv_sge sge = { .addr = (uintptr_t)bufa, .length = SIZE, .lkey = ma->lkey };
    struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
                              .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
    CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "ibv_post_send");
}

/* b's next event, its completion polled: the RECV of wr_id */
static void event_then_recv(uint64_t wr_id, const char *what)
{
    struct ibv_cq *cq;
    void *cq_ctx;
    if (ibv_get_cq_event(ch, &cq, &cq_ctx) != 0)
        die(what);
    CHECK(cq == b.cq, "the event names b's CQ");
    ibv_ack_cq_events(cq, 1);
    expect_wc(&b, wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, what);
    same(bufb, bufa, SIZE, what);
}

static void on_signal(int sig)
{
    (void)sig;
    got_signal = 1;
}

static void *signal_then_send(void *arg)
{
    (void)arg;
    usleep(100 * 1000);
    pthread_kill(main_thread, SIGUSR1);
    usleep(100 * 1000);
    send_a(900);
    return NULL;
}

static int turn;                            /* the round b waits for */

static void *sender(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        double end = now_s() + WAIT_SECONDS;
        while (__atomic_load_n(&turn, __ATOMIC_ACQUIRE) != i + 1) {
            CHECK(now_s() < end, "b's turn");
            usleep(100);
        }
        usleep(2000);                       /* b is asleep in ibv_get_cq_event by now */
        fill(bufa, SIZE, i + 1);
        send_a(i);
        expect_wc(&a, i, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND's completion");
    }
    return NULL;
}

static volatile int waiting;

static void *wait_for_ever(void *arg)
{
    struct ibv_cq *cq;
    void *cq_ctx;
    (void)arg;
    waiting = 1;
    ibv_get_cq_event(ch, &cq, &cq_ctx);      /* no event comes: cancelled here */
    fprintf(stderr, "FAIL: ibv_get_cq_event returned without an event\n");
    exit(1);
    return NULL;
}

int main(void)
{
    struct ibv_context *c0 = open_dev(0), *c1 = open_dev(1);
    struct ibv_pd *p0 = ibv_alloc_pd(c0), *p1 = ibv_alloc_pd(c1);
    CHECK(p0 && p1, "ibv_alloc_pd");
    main_thread = pthread_self();
    ch = ibv_create_comp_channel(c1);
    CHECK(ch, "ibv_create_comp_channel");
    ep_init(&a, c0, p0, IBV_QPT_RC, 0, NULL);
    next_cq_channel = ch;
    ep_init(&b, c1, p1, IBV_QPT_RC, 0, NULL);
    ep_connect(&a, b.qp->qp_num, &b.gid);
    ep_connect(&b, a.qp->qp_num, &a.gid);
    bufa = calloc(1, SIZE);
    bufb = calloc(1, SIZE);
    CHECK(bufa && bufb, "calloc");
    ma = ibv_reg_mr(p0, bufa, SIZE, ACCESS_ALL);
    mb = ibv_reg_mr(p1, bufb, SIZE, ACCESS_ALL);
    CHECK(ma && mb, "ibv_reg_mr");

    /* events: b arms and sleeps in ibv_get_cq_event, a's SEND comes (from another
     * thread, a moment after b went to sleep) */
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sender, NULL) == 0, "pthread_create");
    for (int i = 0; i < ROUNDS; i++) {
        post_recv_b(100 + i);
        CHECK(ibv_req_notify_cq(b.cq, 0) == 0, "ibv_req_notify_cq");
        __atomic_store_n(&turn, i + 1, __ATOMIC_RELEASE);
        event_then_recv(100 + i, "a SEND's event on a blocking channel");
    }
    pthread_join(t, NULL);
    printf("events on a blocking channel: ok\n");

    /* a signal whose handler is installed without SA_RESTART ends the wait: EINTR,
     * as the kernel's read() of the channel gives (qperf ends its tests so) */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0, "sigaction SIGALRM");
    struct itimerval it = { .it_value = { .tv_usec = 100 * 1000 } };
    CHECK(ibv_req_notify_cq(b.cq, 0) == 0, "ibv_req_notify_cq");
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0, "setitimer");
    struct ibv_cq *cq;
    void *cq_ctx;
    errno = 0;
    int r = ibv_get_cq_event(ch, &cq, &cq_ctx);
    CHECK(r == -1 && errno == EINTR && got_signal, "ibv_get_cq_event ended by SIGALRM: EINTR");
    signal(SIGALRM, SIG_DFL);
    printf("a signal without SA_RESTART: EINTR: ok\n");

    /* one with SA_RESTART does not: the wait goes on to the event */
    got_signal = 0;
    sa.sa_flags = SA_RESTART;
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction SIGUSR1");
    fill(bufa, SIZE, 77);
    post_recv_b(901);
    CHECK(pthread_create(&t, NULL, signal_then_send, NULL) == 0, "pthread_create");
    event_then_recv(901, "the event after a SA_RESTART signal");
    CHECK(got_signal, "the SIGUSR1 handler ran during the wait");
    pthread_join(t, NULL);
    expect_wc(&a, 900, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND's completion");
    printf("a signal with SA_RESTART: the wait goes on: ok\n");

    /* a thread cancelled while it waits (rping stops its CQ thread so), twice: the
     * second starts just after the first WRITE landed */
    for (int k = 0; k < 2; k++) {
        waiting = 0;
        CHECK(ibv_req_notify_cq(b.cq, 0) == 0, "ibv_req_notify_cq");
        CHECK(pthread_create(&t, NULL, wait_for_ever, NULL) == 0, "pthread_create");
        while (!waiting)
            usleep(1000);
        usleep(100 * 1000);
        void *res;
        CHECK(pthread_cancel(t) == 0, "pthread_cancel");
        CHECK(pthread_join(t, &res) == 0 && res == PTHREAD_CANCELED, "the thread was cancelled");
        /* b must still make progress with nobody calling it: a WRITE lands in its memory */
        fill(bufa, SIZE, 99 + k);
        post_rdma(&a, IBV_WR_RDMA_WRITE, 950 + k, bufa, SIZE, ma->lkey, (uintptr_t)bufb,
                  mb->rkey);
        double t0 = now_s(), end = t0 + WAIT_SECONDS;
        while (memcmp((void *)bufb, bufa, SIZE) != 0) {
            if (now_s() > end) {
                errno = ETIMEDOUT;
                die("a WRITE to b after its waiter was cancelled");
            }
            usleep(100);
        }
        printf("the WRITE landed after %.1f ms\n", (now_s() - t0) * 1e3);
        expect_wc(&a, 950 + k, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the WRITE's completion");
    }
    /* and the channel still works: the event the cancelled wait never took is there */
    fill(bufa, SIZE, 5);
    post_recv_b(960);
    send_a(961);
    event_then_recv(960, "an event after the cancelled wait");
    expect_wc(&a, 961, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND's completion");
    printf("a waiter cancelled: the device goes on: ok\n");

    ibv_dereg_mr(ma);
    ibv_dereg_mr(mb);
    ep_destroy(&a);
    ep_destroy(&b);
    CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
    ibv_dealloc_pd(p0);
    ibv_dealloc_pd(p1);
    ibv_close_device(c0);
    ibv_close_device(c1);
    printf("all checks: ok\n");
    return 0;
}
