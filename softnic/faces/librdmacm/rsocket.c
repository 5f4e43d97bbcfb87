/* softnic's librdmacm.so.1: the rsocket API (rsocket(7)), compiled after shim.c.
 *
 * A stream socket over an RC QP that softnic's own rdma_cm connects, carried by
 * the engine like any other QP (lossy wires included).  An rsocket's number is
 * the fd of its own rdma_cm event channel, as in rdma-core: a real descriptor no
 * other open file has, which librspreload.so maps a program's socket fds to, and
 * which rpoll waits on, beside the socket's completion channel and the program's
 * ordinary fds.
 *
 * The protocol between two rsockets (softnic's own: the shape of rdma-core's,
 * not its bytes, so softnic talks to softnic only):
 *   - REQ and REP carry struct rs_conn: the receive ring (address, size, rkey),
 *     the iomap table (address, rkey, entries) and the message window.
 *   - data: RDMA WRITE WITH IMMEDIATE into the peer's receive ring, at the next
 *     byte of the stream (a write stops at the ring's end, the next starts at
 *     its beginning); the immediate is op DATA and the length.
 *   - credit: SEND WITH IMMEDIATE without payload, op CREDIT and the number of
 *     messages the reader has consumed whole since its last credit; the writer
 *     keeps where each of its messages ends, so the count frees ring bytes.  A
 *     credit leaves when half the window or half the ring is consumed: a writer
 *     that is stopped has a full ring or window, so a reader that takes all
 *     there is always frees it.
 *   - shutdown: SEND WITH IMMEDIATE, op SHUTDOWN: the stream ends (a read
 *     returns 0 once the data before it is taken).
 *   - iomap: RDMA WRITE WITH IMMEDIATE of an entry (offset, address, length,
 *     rkey; big-endian) into slot n of the peer's iomap table, op IOMAP and n;
 *     riowrite is an RDMA WRITE into the region an entry names, ordered with
 *     the stream.
 * Each message takes one zero-length receive WQE at the peer, reposted as its
 * completion is taken; the window (data messages not yet credited) keeps the
 * receive queue from running dry; control messages have a reserve beyond it,
 * and rnr_retry 7 waits for a repost if ever they outrun it.
 *
 * One lock serializes the rsocket calls; a call that waits drops it. */

#include <limits.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sched.h>
#include <time.h>

#define RS_MAX_FD 65536
#define RS_RECV_WR_ID UINT64_MAX    /* a receive WQE's wr_id; a send's is a staging position */
#define RS_VERSION 1
#define RS_OP_DATA 0
#define RS_OP_CREDIT 1
#define RS_OP_SHUTDOWN 2
#define RS_OP_IOMAP 3
#define RS_IMM(op, v) ((uint32_t)(op) << 29 | ((uint32_t)(v) & 0x1fffffff))
#define RS_IMM_OP(imm) ((imm) >> 29)
#define RS_IMM_VAL(imm) ((imm) & 0x1fffffff)
#define RS_CTRL_RESERVE 16        /* receive WQEs beyond the window: credits, shutdown, iomap */
#define RS_SQ_RESERVE 4           /* send WQEs kept for control messages */
#define RS_IOMAP_MAX 16
#define RS_BACKLOG_MAX 64
#define RS_DEF_BUF (256 * 1024)
#define RS_MIN_BUF 4096
#define RS_MAX_BUF (64 * 1024 * 1024)
#define RS_MAX_MSG (128 * 1024)
#define RS_DEF_QSIZE 128
#define RS_MAX_QSIZE 1024
#define RS_WAIT_MS 100            /* a wait's longest sleep before it looks again */
#define RS_CLOSE_MS 10000         /* how long a close waits for its data to be acknowledged */

/* REQ and REP private data (rdma_cm leaves 56 bytes of a REQ to the program) */
struct rs_conn {
    uint8_t version;
    uint8_t flags;
    uint16_t window;              /* data messages the peer may have in flight */
    uint32_t ring_size;
    uint64_t ring_addr;
    uint32_t ring_rkey;
    uint32_t iomap_rkey;
    uint64_t iomap_addr;
    uint32_t iomap_count;
    uint32_t reserved;
} __attribute__((packed));

struct rs_iomap_entry {           /* big-endian, as the peer writes it */
    uint64_t offset;
    uint64_t addr;
    uint32_t length;
    uint32_t rkey;
} __attribute__((packed));

struct rs_local_map {             /* a region this side mapped with riomap */
    void *buf;
    size_t len;
    off_t offset;
    struct ibv_mr *mr;
};

enum rs_state {
    RS_IDLE, RS_BOUND, RS_LISTENING, RS_RESOLVING_ADDR, RS_RESOLVING_ROUTE,
    RS_CONNECTING, RS_CONNECTED, RS_DISCONNECTED, RS_FAILED,
};

struct rsock {
    int fd;                       /* the rsocket: the event channel's fd */
    enum rs_state state;
    int nonblock;
    int err;                      /* SO_ERROR: why a connect or the connection failed */
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_comp_channel *cc;
    struct ibv_cq *cq;
    struct ibv_mr *ring_mr, *sbuf_mr, *rmap_mr, *lmap_wire_mr;
    /* options */
    int sndbuf, rcvbuf, sq_size, rq_size, inline_size, iomap_size;
    int nodelay, keepalive, keepidle, reuseaddr, linger_on, linger_s;
    /* a listener's connect requests, not yet accepted */
    struct rdma_cm_event *pending[RS_BACKLOG_MAX];
    int npending, backlog;
    /* receiving: this side's ring, the peer writes it */
    uint8_t *ring;
    uint32_t ring_size, window;
    uint64_t rcvd, consumed;      /* stream bytes arrived, taken by the program */
    uint64_t *msg_end;            /* [window]: where each arrived message ends */
    uint64_t msgs_rcvd, msgs_done, msgs_credited;
    int rd_eof;                   /* the peer's SHUTDOWN arrived, or SHUT_RD */
    /* sending: the staging buffer, and the peer's ring */
    uint8_t *sbuf;
    uint32_t sbuf_size;
    uint64_t s_head, s_tail;      /* staging bytes taken, freed (by send completions) */
    int sq_out, rq_posted;
    uint64_t peer_ring_addr;
    uint32_t peer_ring_rkey, peer_ring_size, peer_window, max_msg;
    uint64_t tgt_head, peer_freed;
    uint64_t *sent_end;           /* [peer_window]: where each message sent ends */
    uint64_t msgs_sent, msgs_acked;
    int wr_shut;                  /* SHUTDOWN sent */
    int credit_due;               /* a credit could not leave yet (send queue full) */
    /* iomap */
    struct rs_iomap_entry *rmap;  /* [RS_IOMAP_MAX], the peer's entries (it writes them) */
    struct rs_iomap_entry *lmap_wire;   /* [RS_IOMAP_MAX], ours, as sent */
    struct rs_local_map lmap[RS_IOMAP_MAX];
    uint64_t peer_iomap_addr;
    uint32_t peer_iomap_rkey, peer_iomap_count;
};

static pthread_mutex_t rs_mut = PTHREAD_MUTEX_INITIALIZER;
static struct rsock *rs_tab[RS_MAX_FD];

/* Takes the lock; a caller holding the interpreter lock (a Python host) lets it go
 * while it waits, so that the holder, which may be waiting for the interpreter in
 * a verbs call, goes on.  Never the other way round: no thread waits for the lock
 * holding the interpreter's. */
static void rs_lock(void)
{
    if (!pthread_mutex_trylock(&rs_mut))
        return;
    void *gil = sn_gil_release();
    pthread_mutex_lock(&rs_mut);
    sn_gil_restore(gil);
}

static struct rsock *rs_get(int fd)
{
    return fd >= 0 && fd < RS_MAX_FD ? rs_tab[fd] : NULL;
}

/* Looks an rsocket up and takes the lock; NULL (EBADF, unlocked) if there is none. */
static struct rsock *rs_enter(int fd)
{
    rs_lock();
    struct rsock *rs = rs_get(fd);
    if (!rs) {
        pthread_mutex_unlock(&rs_mut);
        errno = EBADF;
    }
    return rs;
}

static int rs_leave(int ret)
{
    int e = errno;
    pthread_mutex_unlock(&rs_mut);
    errno = e;
    return ret;
}

static ssize_t rs_leave_n(ssize_t ret)
{
    int e = errno;
    pthread_mutex_unlock(&rs_mut);
    errno = e;
    return ret;
}

static uint64_t rs_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A non-blocking call with nothing to do: EAGAIN, after giving the CPU away.  The
 * program will call again at once; on a machine with more runnable threads than
 * CPUs, its spinning would otherwise keep the peer (or this process's progress
 * thread) from running for a whole scheduler slice per turn. */
static int rs_again(void)
{
    sched_yield();
    return sn_err(EAGAIN);
}

static void rs_fail(struct rsock *rs, int err)
{
    if (rs->state != RS_FAILED) {
        rs->state = RS_FAILED;
        rs->err = err;
    }
}

/* ------------------------------------------------------------------ resources */

static uint32_t rs_clamp(int v, uint32_t def, uint32_t lo, uint32_t hi)
{
    if (v <= 0)
        return def;
    return (uint32_t)v < lo ? lo : (uint32_t)v > hi ? hi : (uint32_t)v;
}

static void *rs_alloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n ? n : 1))
        return NULL;
    memset(p, 0, n);
    return p;
}

static int rs_post_recv(struct rsock *rs)
{
    struct ibv_recv_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = RS_RECV_WR_ID;
    int r = ibv_post_recv(rs->id->qp, &wr, &bad);
    if (r)
        return r;
    rs->rq_posted++;
    return 0;
}

/* The QP, its CQ and completion channel, the ring, the staging buffer and the
 * iomap tables, on the device the id resolved to; the receive WQEs posted. */
static int rs_create_res(struct rsock *rs, struct rdma_cm_id *id)
{
    struct ibv_context *verbs = id->verbs;
    if (!verbs || !id->pd)
        return ENODEV;
    rs->ring_size = rs_clamp(rs->rcvbuf, RS_DEF_BUF, RS_MIN_BUF, RS_MAX_BUF);
    rs->sbuf_size = rs_clamp(rs->sndbuf, RS_DEF_BUF, RS_MIN_BUF, RS_MAX_BUF);
    rs->window = rs_clamp(rs->rq_size, RS_DEF_QSIZE, 8, RS_MAX_QSIZE);
    uint32_t sq = rs_clamp(rs->sq_size, RS_DEF_QSIZE, 2 * RS_SQ_RESERVE, RS_MAX_QSIZE);
    rs->sq_size = (int)sq;
    uint32_t rq = rs->window + RS_CTRL_RESERVE;
    rs->cc = ibv_create_comp_channel(verbs);
    if (!rs->cc)
        return errno ? errno : ENOMEM;
    int fl = fcntl(rs->cc->fd, F_GETFL);
    fcntl(rs->cc->fd, F_SETFL, (fl < 0 ? 0 : fl) | O_NONBLOCK);
    rs->cq = ibv_create_cq(verbs, (int)(sq + rq), rs, rs->cc, 0);
    if (!rs->cq)
        return errno ? errno : ENOMEM;
    struct ibv_qp_init_attr a;
    memset(&a, 0, sizeof a);
    a.send_cq = a.recv_cq = rs->cq;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = 1;
    a.cap.max_send_wr = sq;
    a.cap.max_recv_wr = rq;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, id->pd, &a))
        return errno ? errno : ENOMEM;
    rs->ring = rs_alloc(rs->ring_size);
    rs->sbuf = rs_alloc(rs->sbuf_size);
    rs->msg_end = calloc(rs->window, sizeof *rs->msg_end);
    rs->rmap = rs_alloc(RS_IOMAP_MAX * sizeof *rs->rmap);
    rs->lmap_wire = rs_alloc(RS_IOMAP_MAX * sizeof *rs->lmap_wire);
    if (!rs->ring || !rs->sbuf || !rs->msg_end || !rs->rmap || !rs->lmap_wire)
        return ENOMEM;
    int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    rs->ring_mr = ibv_reg_mr(id->pd, rs->ring, rs->ring_size, remote);
    rs->sbuf_mr = ibv_reg_mr(id->pd, rs->sbuf, rs->sbuf_size, IBV_ACCESS_LOCAL_WRITE);
    rs->rmap_mr = ibv_reg_mr(id->pd, rs->rmap, RS_IOMAP_MAX * sizeof *rs->rmap, remote);
    rs->lmap_wire_mr = ibv_reg_mr(id->pd, rs->lmap_wire, RS_IOMAP_MAX * sizeof *rs->lmap_wire,
                                  IBV_ACCESS_LOCAL_WRITE);
    if (!rs->ring_mr || !rs->sbuf_mr || !rs->rmap_mr || !rs->lmap_wire_mr)
        return errno ? errno : ENOMEM;
    for (uint32_t i = 0; i < rq; i++) {
        int r = rs_post_recv(rs);
        if (r)
            return r;
    }
    return 0;
}

static void rs_conn_data(struct rsock *rs, struct rs_conn *c)
{
    memset(c, 0, sizeof *c);
    c->version = RS_VERSION;
    c->window = htons((uint16_t)rs->window);
    c->ring_size = htonl(rs->ring_size);
    c->ring_addr = htobe64((uint64_t)(uintptr_t)rs->ring);
    c->ring_rkey = htonl(rs->ring_mr->rkey);
    c->iomap_addr = htobe64((uint64_t)(uintptr_t)rs->rmap);
    c->iomap_rkey = htonl(rs->rmap_mr->rkey);
    c->iomap_count = htonl(RS_IOMAP_MAX);
}

/* The peer's half of the connection, from its REQ or REP. */
static int rs_peer_data(struct rsock *rs, const void *pd, int len)
{
    struct rs_conn c;
    if (!pd || len < (int)sizeof c)
        return EPROTO;
    memcpy(&c, pd, sizeof c);
    if (c.version != RS_VERSION || !ntohs(c.window) || ntohl(c.ring_size) < RS_MIN_BUF)
        return EPROTO;
    rs->peer_window = ntohs(c.window);
    rs->peer_ring_size = ntohl(c.ring_size);
    rs->peer_ring_addr = be64toh(c.ring_addr);
    rs->peer_ring_rkey = ntohl(c.ring_rkey);
    rs->peer_iomap_addr = be64toh(c.iomap_addr);
    rs->peer_iomap_rkey = ntohl(c.iomap_rkey);
    rs->peer_iomap_count = ntohl(c.iomap_count);
    rs->max_msg = rs->peer_ring_size / 4 < RS_MAX_MSG ? rs->peer_ring_size / 4 : RS_MAX_MSG;
    rs->sent_end = calloc(rs->peer_window, sizeof *rs->sent_end);
    return rs->sent_end ? 0 : ENOMEM;
}

static void rs_conn_param(struct rsock *rs, struct rdma_conn_param *p, struct rs_conn *c)
{
    rs_conn_data(rs, c);
    memset(p, 0, sizeof *p);
    p->private_data = c;
    p->private_data_len = sizeof *c;
    p->responder_resources = 1;
    p->initiator_depth = 1;
    p->retry_count = 6;           /* finite: a peer gone for good ends the connection */
    p->rnr_retry_count = 7;
}

static void rs_free_res(struct rsock *rs)
{
    for (int i = 0; i < RS_IOMAP_MAX; i++)
        if (rs->lmap[i].mr)
            ibv_dereg_mr(rs->lmap[i].mr);
    if (rs->id && rs->id->qp)
        rdma_destroy_qp(rs->id);
    if (rs->ring_mr)
        ibv_dereg_mr(rs->ring_mr);
    if (rs->sbuf_mr)
        ibv_dereg_mr(rs->sbuf_mr);
    if (rs->rmap_mr)
        ibv_dereg_mr(rs->rmap_mr);
    if (rs->lmap_wire_mr)
        ibv_dereg_mr(rs->lmap_wire_mr);
    if (rs->cq)
        ibv_destroy_cq(rs->cq);
    if (rs->cc)
        ibv_destroy_comp_channel(rs->cc);
    free(rs->ring);
    free(rs->sbuf);
    free(rs->msg_end);
    free(rs->sent_end);
    free(rs->rmap);
    free(rs->lmap_wire);
}

/* ------------------------------------------------------------------ messages */

static int rs_post_send(struct rsock *rs, enum ibv_wr_opcode op, uint32_t imm, void *addr,
                        uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
    struct ibv_sge sge = {(uint64_t)(uintptr_t)addr, len, lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = rs->s_head;        /* the staging bytes freed when it completes */
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    if (len) {
        wr.sg_list = &sge;
        wr.num_sge = 1;
    }
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    int r = ibv_post_send(rs->id->qp, &wr, &bad);
    if (r)
        return r;
    rs->sq_out++;
    return 0;
}

static int rs_post_ctrl(struct rsock *rs, int op, uint32_t v)
{
    if (rs->sq_out >= rs->sq_size)
        return EAGAIN;
    return rs_post_send(rs, IBV_WR_SEND_WITH_IMM, RS_IMM(op, v), NULL, 0, 0, 0, 0);
}

/* The reader's credit: messages consumed whole since the last one, when half
 * the window or half the ring's bytes are (or ``force``, for a last one). */
static void rs_credit(struct rsock *rs, int force)
{
    uint64_t n = rs->msgs_done - rs->msgs_credited;
    if (!n || rs->state != RS_CONNECTED)
        return;
    uint64_t done_end = rs->msg_end[(rs->msgs_done - 1) % rs->window];
    uint64_t credited_end = rs->msgs_credited
        ? rs->msg_end[(rs->msgs_credited - 1) % rs->window] : 0;
    if (!force && n < rs->window / 2 && done_end - credited_end < rs->ring_size / 2)
        return;
    if (rs_post_ctrl(rs, RS_OP_CREDIT, (uint32_t)n)) {
        rs->credit_due = 1;
        return;
    }
    rs->credit_due = 0;
    rs->msgs_credited = rs->msgs_done;
}

static void rs_recv_wc(struct rsock *rs, struct ibv_wc *wc)
{
    rs->rq_posted--;
    if (wc->status != IBV_WC_SUCCESS) {
        if (wc->status != IBV_WC_WR_FLUSH_ERR)
            rs_fail(rs, ECONNRESET);
        return;
    }
    uint32_t imm = ntohl(wc->imm_data);
    uint32_t v = RS_IMM_VAL(imm);
    switch (RS_IMM_OP(imm)) {
    case RS_OP_DATA:
        if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || rs->msgs_rcvd - rs->msgs_done >= rs->window
                || rs->rcvd - rs->consumed + v > rs->ring_size) {
            rs_fail(rs, EPROTO);  /* the peer broke the window or the ring */
            return;
        }
        rs->rcvd += v;
        rs->msg_end[rs->msgs_rcvd++ % rs->window] = rs->rcvd;
        break;
    case RS_OP_CREDIT:
        if (v > rs->msgs_sent - rs->msgs_acked) {
            rs_fail(rs, EPROTO);
            return;
        }
        rs->msgs_acked += v;
        rs->peer_freed = rs->sent_end[(rs->msgs_acked - 1) % rs->peer_window];
        break;
    case RS_OP_SHUTDOWN:
        rs->rd_eof = 1;
        break;
    case RS_OP_IOMAP:             /* the entry is in rmap[v] already */
        break;
    default:
        break;
    }
    if (rs->state == RS_CONNECTED && rs_post_recv(rs))
        rs_fail(rs, ENOMEM);
}

/* Takes every completion there is; returns how many. */
static int rs_poll_cq(struct rsock *rs)
{
    if (!rs->cq)
        return 0;
    struct ibv_wc wc[32];
    int total = 0, n;
    while ((n = ibv_poll_cq(rs->cq, 32, wc)) > 0) {
        for (int i = 0; i < n; i++) {
            if (wc[i].wr_id == RS_RECV_WR_ID) {
                rs_recv_wc(rs, &wc[i]);
                continue;
            }
            rs->sq_out--;
            if (wc[i].wr_id > rs->s_tail)
                rs->s_tail = wc[i].wr_id;
            if (wc[i].status != IBV_WC_SUCCESS && wc[i].status != IBV_WC_WR_FLUSH_ERR)
                rs_fail(rs, wc[i].status == IBV_WC_RETRY_EXC_ERR ? ETIMEDOUT : ECONNRESET);
        }
        total += n;
    }
    if (rs->credit_due)
        rs_credit(rs, 1);
    return total;
}

/* ------------------------------------------------------------------ connection events */

static void rs_drop_request(struct rdma_cm_event *ev)
{
    struct rdma_cm_id *id = ev->id;
    rdma_reject(id, NULL, 0);
    rdma_ack_cm_event(ev);
    rdma_destroy_id(id);
}

static int rs_readable_fd(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

static int rs_start_connect(struct rsock *rs)
{
    int r = rs_create_res(rs, rs->id);
    if (r)
        return r;
    struct rdma_conn_param p;
    struct rs_conn c;
    rs_conn_param(rs, &p, &c);
    if (rdma_connect(rs->id, &p))
        return errno ? errno : EIO;
    rs->state = RS_CONNECTING;
    return 0;
}

static int rs_event_errno(struct rdma_cm_event *ev, int dflt)
{
    if (ev->event == RDMA_CM_EVENT_REJECTED)
        return ECONNREFUSED;
    if (ev->status < 0)
        return -ev->status;
    return ev->status ? ev->status : dflt;
}

/* Takes the channel's events and moves the socket's state on. */
static void rs_cm_events(struct rsock *rs)
{
    struct rdma_cm_event *ev;
    while (rs_readable_fd(rs->ch->fd) && !rdma_get_cm_event(rs->ch, &ev)) {
        int r = 0;
        switch (ev->event) {
        case RDMA_CM_EVENT_CONNECT_REQUEST:
            if (rs->state == RS_LISTENING && rs->npending < rs->backlog) {
                rs->pending[rs->npending++] = ev;
                continue;         /* acknowledged when accepted */
            }
            rs_drop_request(ev);
            continue;
        case RDMA_CM_EVENT_ADDR_RESOLVED:
            if (rs->state == RS_RESOLVING_ADDR) {
                if (rdma_resolve_route(rs->id, 2000))
                    rs_fail(rs, errno ? errno : EHOSTUNREACH);
                else
                    rs->state = RS_RESOLVING_ROUTE;
            }
            break;
        case RDMA_CM_EVENT_ROUTE_RESOLVED:
            if (rs->state == RS_RESOLVING_ROUTE && (r = rs_start_connect(rs)) != 0)
                rs_fail(rs, r);
            break;
        case RDMA_CM_EVENT_ESTABLISHED:
            if (rs->state == RS_CONNECTING) {
                r = rs_peer_data(rs, ev->param.conn.private_data,
                                 ev->param.conn.private_data_len);
                if (r) {
                    rs_fail(rs, r);
                    rdma_disconnect(rs->id);
                } else {
                    rs->state = RS_CONNECTED;
                }
            }
            break;
        case RDMA_CM_EVENT_ADDR_ERROR:
        case RDMA_CM_EVENT_ROUTE_ERROR:
            rs_fail(rs, rs_event_errno(ev, EHOSTUNREACH));
            break;
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_CONNECT_ERROR:
            rs_fail(rs, rs_event_errno(ev, ETIMEDOUT));
            break;
        case RDMA_CM_EVENT_REJECTED:
            rs_fail(rs, ECONNREFUSED);
            break;
        case RDMA_CM_EVENT_DISCONNECTED:
            if (rs->state == RS_CONNECTED)
                rs->state = RS_DISCONNECTED;
            break;
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
            rs_fail(rs, ENODEV);
            break;
        default:
            break;
        }
        rdma_ack_cm_event(ev);
    }
}

/* Everything that happened: connection events first, so that a disconnection is
 * only seen with the completions that came before it taken too. */
static void rs_progress(struct rsock *rs)
{
    rs_cm_events(rs);
    rs_poll_cq(rs);
}

/* One wait for something to happen on the socket (lock dropped meanwhile). */
static void rs_block(struct rsock *rs, int timeout_ms)
{
    struct pollfd p[2] = {{rs->ch->fd, POLLIN, 0}, {-1, POLLIN, 0}};
    if (rs->cq) {
        ibv_req_notify_cq(rs->cq, 0);
        if (rs_poll_cq(rs) > 0)
            return;               /* came before the notification was armed */
        p[1].fd = rs->cc->fd;
    }
    if (timeout_ms < 0 || timeout_ms > RS_WAIT_MS)
        timeout_ms = RS_WAIT_MS;
    pthread_mutex_unlock(&rs_mut);
    void *gil = sn_gil_release();
    poll(p, 2, timeout_ms);
    pthread_mutex_lock(&rs_mut);
    sn_gil_restore(gil);
    if (rs->cq && (p[1].revents & POLLIN)) {
        struct ibv_cq *cq;
        void *ctx;
        while (!ibv_get_cq_event(rs->cc, &cq, &ctx))
            ibv_ack_cq_events(cq, 1);
    }
}

static int rs_connected(struct rsock *rs)
{
    return rs->state == RS_CONNECTED || rs->state == RS_DISCONNECTED;
}

static int rs_connecting(struct rsock *rs)
{
    return rs->state == RS_RESOLVING_ADDR || rs->state == RS_RESOLVING_ROUTE
        || rs->state == RS_CONNECTING;
}

/* ------------------------------------------------------------------ sockets */

static struct rsock *rs_new(struct rdma_event_channel *ch)
{
    struct rsock *rs = calloc(1, sizeof *rs);
    if (!rs)
        return NULL;
    int fl = fcntl(ch->fd, F_GETFL);
    fcntl(ch->fd, F_SETFL, (fl < 0 ? 0 : fl) | O_NONBLOCK);
    rs->ch = ch;
    rs->fd = ch->fd;
    return rs;
}

static void rs_inherit(struct rsock *rs, const struct rsock *l)
{
    rs->sndbuf = l->sndbuf;
    rs->rcvbuf = l->rcvbuf;
    rs->sq_size = l->sq_size;
    rs->rq_size = l->rq_size;
    rs->inline_size = l->inline_size;
    rs->iomap_size = l->iomap_size;
    rs->nodelay = l->nodelay;
    rs->keepalive = l->keepalive;
    rs->keepidle = l->keepidle;
}

SN_EXPORT int rsocket(int domain, int type, int protocol)
{
    if (domain != AF_INET && domain != AF_INET6)
        return sn_err(EAFNOSUPPORT);
    int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (base != SOCK_STREAM)
        return sn_err(EPROTONOSUPPORT);     /* datagram rsockets are not provided */
    if (protocol && protocol != IPPROTO_TCP)
        return sn_err(EPROTONOSUPPORT);
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch)
        return -1;
    if (ch->fd >= RS_MAX_FD) {
        rdma_destroy_event_channel(ch);
        return sn_err(EMFILE);
    }
    struct rsock *rs = rs_new(ch);
    if (!rs) {
        rdma_destroy_event_channel(ch);
        return sn_err(ENOMEM);
    }
    if (rdma_create_id(ch, &rs->id, rs, RDMA_PS_TCP)) {
        int e = errno;
        rdma_destroy_event_channel(ch);
        free(rs);
        return sn_err(e);
    }
    rs->nonblock = (type & SOCK_NONBLOCK) != 0;
    rs_lock();
    rs_tab[rs->fd] = rs;
    pthread_mutex_unlock(&rs_mut);
    return rs->fd;
}

SN_EXPORT int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (!addr || addrlen < sizeof(struct sockaddr_in))
        return rs_leave(sn_err(EINVAL));
    if (rs->state != RS_IDLE)
        return rs_leave(sn_err(EINVAL));
    if (rdma_bind_addr(rs->id, (struct sockaddr *)addr))
        return rs_leave(-1);
    rs->state = RS_BOUND;
    return rs_leave(0);
}

SN_EXPORT int rlisten(int socket, int backlog)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (rs->state == RS_LISTENING)
        return rs_leave(0);
    if (rs->state != RS_BOUND && rs->state != RS_IDLE)
        return rs_leave(sn_err(EINVAL));
    if (rdma_listen(rs->id, backlog))
        return rs_leave(-1);
    rs->backlog = backlog <= 0 ? 1 : backlog > RS_BACKLOG_MAX ? RS_BACKLOG_MAX : backlog;
    rs->state = RS_LISTENING;
    return rs_leave(0);
}

static void rs_copy_addr(struct sockaddr *to, socklen_t *len, const struct sockaddr *from)
{
    if (!to || !len)
        return;
    socklen_t n = from->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                              : sizeof(struct sockaddr_in);
    memcpy(to, from, *len < n ? *len : n);
    *len = n;
}

/* A new connected rsocket for a connect request: its own channel, its QP, the REP. */
static int rs_accept_one(struct rsock *l, struct rdma_cm_event *ev)
{
    struct rdma_cm_id *id = ev->id;
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rsock *rs = ch && ch->fd < RS_MAX_FD ? rs_new(ch) : NULL;
    int e = ch ? (ch->fd < RS_MAX_FD ? ENOMEM : EMFILE) : errno;
    if (!rs) {
        if (ch)
            rdma_destroy_event_channel(ch);
        rs_drop_request(ev);
        return sn_err(e);
    }
    rs_inherit(rs, l);
    rs->id = id;
    id->context = rs;
    int r = rdma_migrate_id(id, ch) ? errno : 0;
    if (!r)
        r = rs_create_res(rs, id);
    if (!r)
        r = rs_peer_data(rs, ev->param.conn.private_data, ev->param.conn.private_data_len);
    if (!r) {
        struct rdma_conn_param p;
        struct rs_conn c;
        rs_conn_param(rs, &p, &c);
        if (rdma_accept(id, &p))
            r = errno ? errno : EIO;
    }
    if (r) {
        rs_free_res(rs);          /* the QP first: it is the id's */
        rs->id = NULL;
        rs_drop_request(ev);
        rdma_destroy_event_channel(ch);
        free(rs);
        return sn_err(r == EPROTO ? ECONNABORTED : r);
    }
    rdma_ack_cm_event(ev);
    rs->state = RS_CONNECTED;     /* the QP is in RTS; ESTABLISHED follows on the channel */
    rs_tab[rs->fd] = rs;
    return rs->fd;
}

SN_EXPORT int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
    struct rsock *l = rs_enter(socket);
    if (!l)
        return -1;
    if (l->state != RS_LISTENING)
        return rs_leave(sn_err(EINVAL));
    for (;;) {
        rs_cm_events(l);
        if (l->npending) {
            struct rdma_cm_event *ev = l->pending[0];
            memmove(l->pending, l->pending + 1, --l->npending * sizeof l->pending[0]);
            struct rdma_cm_id *id = ev->id;
            int fd = rs_accept_one(l, ev);
            if (fd < 0)
                return rs_leave(-1);
            rs_copy_addr(addr, addrlen, rdma_get_peer_addr(id));
            return rs_leave(fd);
        }
        if (l->nonblock)
            return rs_leave(sn_err(EAGAIN));
        rs_block(l, -1);
        if (rs_get(socket) != l)
            return rs_leave(sn_err(EBADF));
    }
}

/* Waits, if the socket blocks, until a connect in progress ends; 0 or -1 with errno. */
static int rs_finish_connect(struct rsock *rs)
{
    for (;;) {
        rs_progress(rs);
        if (rs_connected(rs))
            return 0;
        if (rs->state == RS_FAILED) {
            int e = rs->err;
            rs->err = 0;
            return sn_err(e ? e : ECONNREFUSED);
        }
        if (rs->nonblock)
            return sn_err(EINPROGRESS);
        rs_block(rs, -1);
    }
}

SN_EXPORT int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (rs_connecting(rs)) {
        int r = rs_finish_connect(rs);
        return rs_leave(r && errno == EINPROGRESS ? sn_err(EALREADY) : r);
    }
    if (rs_connected(rs))
        return rs_leave(sn_err(EISCONN));
    if (rs->state != RS_IDLE && rs->state != RS_BOUND)
        return rs_leave(sn_err(EINVAL));
    if (!addr || addrlen < sizeof(struct sockaddr_in))
        return rs_leave(sn_err(EINVAL));
    struct sockaddr *src = rs->state == RS_BOUND ? rdma_get_local_addr(rs->id) : NULL;
    if (rdma_resolve_addr(rs->id, src, (struct sockaddr *)addr, 2000))
        return rs_leave(-1);
    rs->state = RS_RESOLVING_ADDR;
    return rs_leave(rs_finish_connect(rs));
}

/* ------------------------------------------------------------------ data */

static int rs_can_send(struct rsock *rs)
{
    return rs->state == RS_CONNECTED && !rs->wr_shut
        && rs->tgt_head - rs->peer_freed < rs->peer_ring_size
        && rs->msgs_sent - rs->msgs_acked < rs->peer_window
        && rs->sq_out < rs->sq_size - RS_SQ_RESERVE
        && rs->s_head - rs->s_tail < rs->sbuf_size;
}

/* Stages up to ``len`` bytes in the staging buffer; returns where they are (NULL
 * when there is no room) and how many in ``*n``. */
static uint8_t *rs_stage(struct rsock *rs, const void *buf, size_t len, uint32_t *n)
{
    uint64_t sfree = rs->sbuf_size - (rs->s_head - rs->s_tail);
    uint32_t soff = (uint32_t)(rs->s_head % rs->sbuf_size);
    uint64_t contig = rs->sbuf_size - soff < sfree ? rs->sbuf_size - soff : sfree;
    if (contig < len && contig < 4096 && sfree > contig) {
        rs->s_head += contig;     /* the staging buffer's tail end: start again at 0 */
        sfree -= contig;
        soff = 0;
        contig = rs->sbuf_size < sfree ? rs->sbuf_size : sfree;
    }
    if (!contig) {
        *n = 0;
        return NULL;
    }
    *n = (uint32_t)(len < contig ? len : contig);
    memcpy(rs->sbuf + soff, buf, *n);
    rs->s_head += *n;
    return rs->sbuf + soff;
}

/* Writes what room allows of ``buf`` into the peer's ring; returns the bytes taken. */
static size_t rs_send_some(struct rsock *rs, const uint8_t *buf, size_t len)
{
    size_t done = 0;
    while (done < len && rs_can_send(rs)) {
        uint64_t avail = rs->peer_ring_size - (rs->tgt_head - rs->peer_freed);
        uint64_t toff = rs->tgt_head % rs->peer_ring_size;
        uint64_t n = len - done;
        if (n > avail)
            n = avail;
        if (n > rs->peer_ring_size - toff)
            n = rs->peer_ring_size - toff;
        if (n > rs->max_msg)
            n = rs->max_msg;
        uint32_t got;
        uint8_t *src = rs_stage(rs, buf + done, n, &got);
        if (!src)
            break;
        int r = rs_post_send(rs, IBV_WR_RDMA_WRITE_WITH_IMM, RS_IMM(RS_OP_DATA, got), src, got,
                             rs->sbuf_mr->lkey, rs->peer_ring_addr + toff, rs->peer_ring_rkey);
        if (r) {
            rs_fail(rs, r);
            break;
        }
        rs->tgt_head += got;
        rs->sent_end[rs->msgs_sent++ % rs->peer_window] = rs->tgt_head;
        done += got;
    }
    return done;
}

static int rs_nonblocking(struct rsock *rs, int flags)
{
    return rs->nonblock || (flags & MSG_DONTWAIT);
}

/* Waits (if it may) until the socket is connected for a data call; 0, or -1 with errno. */
static int rs_ready_for_data(struct rsock *rs, int flags)
{
    if (rs_connecting(rs)) {
        if (rs_nonblocking(rs, flags)) {
            rs_progress(rs);
            if (rs_connecting(rs))
                return sn_err(EAGAIN);
        } else {
            int save = rs->nonblock;
            rs->nonblock = 0;
            int r = rs_finish_connect(rs);
            rs->nonblock = save;
            if (r)
                return r;
        }
    }
    if (rs->state == RS_FAILED && !rs->sent_end)
        return sn_err(ENOTCONN);  /* a connect that failed (SO_ERROR tells why) */
    if (rs->state == RS_FAILED)
        return sn_err(rs->err ? rs->err : ECONNRESET);
    if (!rs_connected(rs))
        return sn_err(ENOTCONN);
    return 0;
}

/* 0, or the errno of a bad iovec: EINVAL for a bad count, EFAULT for a buffer at NULL. */
static int rs_iov_check(const struct iovec *iov, int iovcnt)
{
    if (iovcnt < 0 || iovcnt > IOV_MAX)
        return EINVAL;
    if (iovcnt && !iov)
        return EFAULT;
    for (int i = 0; i < iovcnt; i++)
        if (iov[i].iov_len && !iov[i].iov_base)
            return EFAULT;
    return 0;
}

static ssize_t rs_sendv(int socket, const struct iovec *iov, int iovcnt, int flags)
{
    int bad = rs_iov_check(iov, iovcnt);
    if (bad)
        return sn_err(bad);
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (rs_ready_for_data(rs, flags))
        return rs_leave_n(-1);
    size_t total = 0, want = 0;
    for (int i = 0; i < iovcnt; i++)
        want += iov[i].iov_len;
    int i = 0;
    size_t off = 0;
    while (total < want) {
        if (rs->wr_shut || rs->state == RS_DISCONNECTED)
            return rs_leave_n(total ? (ssize_t)total : sn_err(EPIPE));
        if (rs->state == RS_FAILED)
            return rs_leave_n(total ? (ssize_t)total : sn_err(rs->err ? rs->err : ECONNRESET));
        while (i < iovcnt && off == iov[i].iov_len) {
            i++;
            off = 0;
        }
        size_t n = rs_send_some(rs, (const uint8_t *)iov[i].iov_base + off, iov[i].iov_len - off);
        off += n;
        total += n;
        if (n)
            continue;
        rs_progress(rs);
        if (rs_can_send(rs))
            continue;
        if (rs_nonblocking(rs, flags))
            return rs_leave_n(total ? (ssize_t)total : rs_again());
        rs_block(rs, -1);
        if (rs_get(socket) != rs)
            return rs_leave_n(sn_err(EBADF));
    }
    return rs_leave_n((ssize_t)total);
}

/* Copies up to ``len`` bytes of the ring from ``from`` bytes past what the program
 * has taken; returns how many. */
static size_t rs_copy_out(struct rsock *rs, uint8_t *to, size_t len, uint64_t from)
{
    uint64_t avail = rs->rcvd - rs->consumed;
    size_t done = 0;
    while (done < len && from + done < avail) {
        uint32_t off = (uint32_t)((rs->consumed + from + done) % rs->ring_size);
        size_t n = rs->ring_size - off;
        if (n > avail - from - done)
            n = avail - from - done;
        if (n > len - done)
            n = len - done;
        memcpy(to + done, rs->ring + off, n);
        done += n;
    }
    return done;
}

/* The program has taken ``n`` bytes: whole messages count for the credit. */
static void rs_consume(struct rsock *rs, size_t n)
{
    rs->consumed += n;
    while (rs->msgs_done < rs->msgs_rcvd
           && rs->msg_end[rs->msgs_done % rs->window] <= rs->consumed)
        rs->msgs_done++;
    rs_credit(rs, 0);
}

/* Fills the iovec from byte ``skip`` on with what the ring holds; returns how many. */
static size_t rs_fill(struct rsock *rs, const struct iovec *iov, int iovcnt, size_t skip, int peek)
{
    size_t done = 0, base = 0;
    for (int i = 0; i < iovcnt; i++) {
        size_t l = iov[i].iov_len;
        if (skip + done < base + l) {
            size_t in = skip + done - base;
            size_t n = rs_copy_out(rs, (uint8_t *)iov[i].iov_base + in, l - in,
                                   peek ? done : 0);
            if (!peek)
                rs_consume(rs, n);
            done += n;
            if (n < l - in)
                break;
        }
        base += l;
    }
    return done;
}

static ssize_t rs_recvv(int socket, const struct iovec *iov, int iovcnt, int flags)
{
    int bad = rs_iov_check(iov, iovcnt);
    if (bad)
        return sn_err(bad);
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (rs_connecting(rs) && rs_ready_for_data(rs, flags))
        return rs_leave_n(-1);
    if (rs->state == RS_LISTENING || rs->state == RS_IDLE || rs->state == RS_BOUND
            || (rs->state == RS_FAILED && !rs->sent_end))
        return rs_leave_n(sn_err(ENOTCONN));
    size_t want = 0, total = 0;
    for (int i = 0; i < iovcnt; i++)
        want += iov[i].iov_len;
    int peek = (flags & MSG_PEEK) != 0;
    for (;;) {
        rs_progress(rs);
        if (rs->rcvd > rs->consumed && total < want) {
            if (peek)
                total = rs_fill(rs, iov, iovcnt, 0, 1);
            else
                total += rs_fill(rs, iov, iovcnt, total, 0);
            if (total == want || !(flags & MSG_WAITALL))
                return rs_leave_n((ssize_t)total);
        }
        if (!want || rs->rd_eof || rs->state == RS_DISCONNECTED)
            return rs_leave_n((ssize_t)total);
        if (rs->state == RS_FAILED)
            return rs_leave_n(total ? (ssize_t)total : sn_err(rs->err ? rs->err : ECONNRESET));
        if (rs_nonblocking(rs, flags))
            return rs_leave_n(total ? (ssize_t)total : rs_again());
        rs_block(rs, -1);
        if (rs_get(socket) != rs)
            return rs_leave_n(sn_err(EBADF));
    }
}

SN_EXPORT ssize_t rrecv(int socket, void *buf, size_t len, int flags)
{
    struct iovec v = {buf, len};
    return rs_recvv(socket, &v, 1, flags);
}

SN_EXPORT ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags,
                            struct sockaddr *src_addr, socklen_t *addrlen)
{
    ssize_t r = rrecv(socket, buf, len, flags);
    if (r >= 0 && src_addr && addrlen) {
        if (rgetpeername(socket, src_addr, addrlen))
            *addrlen = 0;
    }
    return r;
}

SN_EXPORT ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)
{
    if (!msg)
        return sn_err(EINVAL);
    if (msg->msg_control && msg->msg_controllen)
        return sn_err(EOPNOTSUPP);
    ssize_t r = rs_recvv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags);
    if (r >= 0) {
        msg->msg_flags = 0;
        if (msg->msg_name && msg->msg_namelen && rgetpeername(socket, msg->msg_name,
                                                              &msg->msg_namelen))
            msg->msg_namelen = 0;
    }
    return r;
}

SN_EXPORT ssize_t rread(int socket, void *buf, size_t count)
{
    return rrecv(socket, buf, count, 0);
}

SN_EXPORT ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt)
{
    return rs_recvv(socket, iov, iovcnt, 0);
}

SN_EXPORT ssize_t rsend(int socket, const void *buf, size_t len, int flags)
{
    struct iovec v = {(void *)buf, len};
    return rs_sendv(socket, &v, 1, flags);
}

SN_EXPORT ssize_t rsendto(int socket, const void *buf, size_t len, int flags,
                          const struct sockaddr *dest_addr, socklen_t addrlen)
{
    (void)dest_addr;              /* a connected stream socket: the address is ignored */
    (void)addrlen;
    return rsend(socket, buf, len, flags);
}

SN_EXPORT ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags)
{
    if (!msg)
        return sn_err(EINVAL);
    if (msg->msg_control && msg->msg_controllen)
        return sn_err(EOPNOTSUPP);
    return rs_sendv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags);
}

SN_EXPORT ssize_t rwrite(int socket, const void *buf, size_t count)
{
    return rsend(socket, buf, count, 0);
}

SN_EXPORT ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt)
{
    return rs_sendv(socket, iov, iovcnt, 0);
}

/* ------------------------------------------------------------------ shutdown, close */

/* Sends SHUTDOWN and waits (bounded) until everything sent is acknowledged. */
static void rs_shut_wr(struct rsock *rs)
{
    if (rs->wr_shut || rs->state != RS_CONNECTED)
        return;
    uint64_t end = rs_now_ms() + RS_CLOSE_MS;
    for (;;) {
        rs_progress(rs);
        if (rs->state != RS_CONNECTED || rs_now_ms() > end)
            return;
        if (rs->sq_out < rs->sq_size && !rs_post_ctrl(rs, RS_OP_SHUTDOWN, 0))
            break;
        rs_block(rs, RS_WAIT_MS);
    }
    rs->wr_shut = 1;
    while (rs->sq_out && rs->state == RS_CONNECTED && rs_now_ms() <= end) {
        rs_block(rs, RS_WAIT_MS);
        rs_progress(rs);
    }
}

SN_EXPORT int rshutdown(int socket, int how)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
        return rs_leave(sn_err(EINVAL));
    if (!rs_connected(rs))
        return rs_leave(sn_err(ENOTCONN));
    if (how != SHUT_WR)
        rs->rd_eof = 1;
    if (how != SHUT_RD)
        rs_shut_wr(rs);
    if (how == SHUT_RDWR && rs->state == RS_CONNECTED) {
        rs->state = RS_DISCONNECTED;
        rdma_disconnect(rs->id);
    }
    return rs_leave(0);
}

SN_EXPORT int rclose(int socket)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (rs->state == RS_CONNECTED) {
        rs_shut_wr(rs);
        if (rs->state == RS_CONNECTED)
            rdma_disconnect(rs->id);
    }
    for (int i = 0; i < rs->npending; i++)
        rs_drop_request(rs->pending[i]);
    rs_tab[rs->fd] = NULL;
    rs_free_res(rs);
    if (rs->id)
        rdma_destroy_id(rs->id);
    rdma_destroy_event_channel(rs->ch);   /* its fd is parked, never reused (shim.c) */
    free(rs);
    return rs_leave(0);
}

/* ------------------------------------------------------------------ poll and select */

static short rs_revents(struct rsock *rs)
{
    short ev = 0;
    switch (rs->state) {
    case RS_LISTENING:
        return rs->npending ? POLLIN : 0;
    case RS_CONNECTED:
    case RS_DISCONNECTED:
        if (rs->rcvd > rs->consumed || rs->rd_eof || rs->state == RS_DISCONNECTED)
            ev |= POLLIN;
        if (rs_can_send(rs))
            ev |= POLLOUT;
        if (rs->state == RS_DISCONNECTED && rs->rcvd == rs->consumed)
            ev |= POLLHUP;        /* gone both ways, once the data before is taken */
        return ev;
    case RS_FAILED:
        return POLLERR | POLLHUP | POLLIN | POLLOUT;
    case RS_IDLE:
    case RS_BOUND:
        return POLLOUT | POLLHUP;
    default:
        return 0;                 /* connecting */
    }
}

SN_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    if (nfds && !fds)
        return sn_err(EFAULT);
    uint64_t end = timeout > 0 ? rs_now_ms() + (uint64_t)timeout : 0;
    struct pollfd stack[64];
    struct pollfd *p = nfds * 3 <= 64 ? stack : malloc(nfds * 3 * sizeof *p);
    if (!p)
        return sn_err(ENOMEM);
    int ret;
    for (;;) {
        int ready = 0, m = 0;
        rs_lock();
        for (nfds_t i = 0; i < nfds; i++) {
            struct rsock *rs = rs_get(fds[i].fd);
            if (!rs)
                continue;
            rs_progress(rs);
            fds[i].revents = rs_revents(rs) & (fds[i].events | POLLERR | POLLHUP | POLLNVAL);
            if (fds[i].revents)
                ready++;
        }
        for (nfds_t i = 0; i < nfds && !ready && timeout; i++) {
            /* about to sleep: arm each CQ, then look once more (a completion that
             * came before the arming signals nothing) */
            struct rsock *rs = rs_get(fds[i].fd);
            if (!rs || !rs->cq)
                continue;
            ibv_req_notify_cq(rs->cq, 0);
            rs_poll_cq(rs);
            fds[i].revents = rs_revents(rs) & (fds[i].events | POLLERR | POLLHUP | POLLNVAL);
            if (fds[i].revents)
                ready++;
        }
        for (nfds_t i = 0; i < nfds; i++) {
            struct rsock *rs = rs_get(fds[i].fd);
            if (!rs) {
                p[m++] = fds[i];
                continue;
            }
            p[m++] = (struct pollfd){rs->ch->fd, POLLIN, 0};
            p[m++] = (struct pollfd){rs->cc ? rs->cc->fd : -1, POLLIN, 0};
        }
        pthread_mutex_unlock(&rs_mut);
        int wait = ready ? 0 : timeout < 0 ? -1 : timeout == 0 ? 0
                 : (int)(end > rs_now_ms() ? end - rs_now_ms() : 0);
        void *gil = sn_gil_release();
        int n = poll(p, (nfds_t)m, wait);
        int e = errno;
        if (n < 0) {
            sn_gil_restore(gil);
            ret = ready ? ready : sn_err(e);
            break;
        }
        pthread_mutex_lock(&rs_mut);
        sn_gil_restore(gil);
        m = 0;
        for (nfds_t i = 0; i < nfds; i++) {
            struct rsock *rs = rs_get(fds[i].fd);
            if (!rs) {
                fds[i].revents = p[m++].revents;
                if (fds[i].revents)
                    ready++;
                continue;
            }
            m++;
            if ((p[m++].revents & POLLIN) && rs->cc) {
                struct ibv_cq *cq;
                void *ctx;
                while (!ibv_get_cq_event(rs->cc, &cq, &ctx))
                    ibv_ack_cq_events(cq, 1);
            }
            if (!ready || !fds[i].revents) {
                rs_progress(rs);
                fds[i].revents = rs_revents(rs) & (fds[i].events | POLLERR | POLLHUP | POLLNVAL);
                if (fds[i].revents)
                    ready++;
            }
        }
        pthread_mutex_unlock(&rs_mut);
        if (ready || timeout == 0 || (timeout > 0 && rs_now_ms() >= end)) {
            if (!ready && !timeout)
                sched_yield();    /* as rs_again: a program polling in a loop */
            ret = ready;
            break;
        }
    }
    if (p != stack)
        free(p);
    return ret;
}

SN_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds,
                      struct timeval *timeout)
{
    if (nfds < 0 || nfds > FD_SETSIZE)
        return sn_err(EINVAL);
    struct pollfd *p = calloc(nfds ? (size_t)nfds : 1, sizeof *p);
    if (!p)
        return sn_err(ENOMEM);
    nfds_t n = 0;
    for (int fd = 0; fd < nfds; fd++) {
        short ev = 0;
        if (readfds && FD_ISSET(fd, readfds))
            ev |= POLLIN;
        if (writefds && FD_ISSET(fd, writefds))
            ev |= POLLOUT;
        if (exceptfds && FD_ISSET(fd, exceptfds))
            ev |= POLLPRI;
        if (ev)
            p[n++] = (struct pollfd){fd, ev, 0};
    }
    int ms = timeout ? (int)(timeout->tv_sec * 1000 + (timeout->tv_usec + 999) / 1000) : -1;
    int r = rpoll(p, n, ms);
    if (r < 0) {
        int e = errno;
        free(p);
        return sn_err(e);
    }
    if (readfds)
        FD_ZERO(readfds);
    if (writefds)
        FD_ZERO(writefds);
    if (exceptfds)
        FD_ZERO(exceptfds);
    int count = 0;
    for (nfds_t i = 0; i < n; i++) {
        if (p[i].revents & POLLNVAL) {
            free(p);
            return sn_err(EBADF);
        }
        if (readfds && (p[i].events & POLLIN) && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
            FD_SET(p[i].fd, readfds);
            count++;
        }
        if (writefds && (p[i].events & POLLOUT) && (p[i].revents & (POLLOUT | POLLERR))) {
            FD_SET(p[i].fd, writefds);
            count++;
        }
        if (exceptfds && (p[i].events & POLLPRI) && (p[i].revents & POLLPRI)) {
            FD_SET(p[i].fd, exceptfds);
            count++;
        }
    }
    free(p);
    return count;
}

/* ------------------------------------------------------------------ names and options */

SN_EXPORT int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (!addr || !addrlen)
        return rs_leave(sn_err(EFAULT));
    if (!rs_connected(rs))
        return rs_leave(sn_err(ENOTCONN));
    rs_copy_addr(addr, addrlen, rdma_get_peer_addr(rs->id));
    return rs_leave(0);
}

SN_EXPORT int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (!addr || !addrlen)
        return rs_leave(sn_err(EFAULT));
    struct sockaddr_in any = {.sin_family = AF_INET};
    const struct sockaddr *a = rdma_get_local_addr(rs->id);
    rs_copy_addr(addr, addrlen, a->sa_family ? a : (const struct sockaddr *)&any);
    return rs_leave(0);
}

static int rs_int_opt(const void *optval, socklen_t optlen, int *v)
{
    if (!optval || optlen < sizeof(int))
        return EINVAL;
    memcpy(v, optval, sizeof(int));
    return 0;
}

SN_EXPORT int rsetsockopt(int socket, int level, int optname, const void *optval,
                          socklen_t optlen)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    int v = 0, r = 0;
    if (level == SOL_SOCKET && optname == SO_LINGER) {
        struct linger lg;
        if (!optval || optlen < sizeof lg)
            return rs_leave(sn_err(EINVAL));
        memcpy(&lg, optval, sizeof lg);
        rs->linger_on = lg.l_onoff;
        rs->linger_s = lg.l_linger;
        return rs_leave(0);
    }
    if (level == SOL_RDMA && optname == RDMA_ROUTE)
        return rs_leave(0);       /* the route is rdma_cm's to resolve */
    if ((r = rs_int_opt(optval, optlen, &v)) != 0)
        return rs_leave(sn_err(r));
    switch (level) {
    case SOL_SOCKET:
        switch (optname) {
        case SO_REUSEADDR:
            rs->reuseaddr = v != 0;
            rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, sizeof v);
            return rs_leave(0);
        case SO_SNDBUF:           /* the staging buffer, fixed at connect */
            rs->sndbuf = v;
            return rs_leave(0);
        case SO_RCVBUF:           /* the receive ring, fixed at connect */
            rs->rcvbuf = v;
            return rs_leave(0);
        case SO_KEEPALIVE:
            rs->keepalive = v != 0;
            return rs_leave(0);
        case SO_OOBINLINE:
        case SO_PRIORITY:
            return rs_leave(0);
        }
        break;
    case IPPROTO_TCP:
        switch (optname) {
        case TCP_NODELAY:         /* every send leaves at once */
            rs->nodelay = v != 0;
            return rs_leave(0);
        case TCP_MAXSEG:
            return rs_leave(0);
        case TCP_KEEPIDLE:
            rs->keepidle = v;
            return rs_leave(0);
        }
        break;
    case IPPROTO_IPV6:
        if (optname == IPV6_V6ONLY)
            return rs_leave(0);
        break;
    case SOL_RDMA:
        if (rs->cq && optname != RDMA_IOMAPSIZE)
            return rs_leave(sn_err(EINVAL));     /* sizes are fixed once connected */
        switch (optname) {
        case RDMA_SQSIZE:
            rs->sq_size = v;
            return rs_leave(0);
        case RDMA_RQSIZE:
            rs->rq_size = v;
            return rs_leave(0);
        case RDMA_INLINE:
            rs->inline_size = v;
            return rs_leave(0);
        case RDMA_IOMAPSIZE:
            rs->iomap_size = v;
            return rs_leave(0);
        }
        break;
    }
    return rs_leave(sn_err(ENOPROTOOPT));
}

SN_EXPORT int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *optlen)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (!optval || !optlen)
        return rs_leave(sn_err(EFAULT));
    if (level == SOL_SOCKET && optname == SO_LINGER) {
        struct linger lg = {rs->linger_on, rs->linger_s};
        socklen_t n = *optlen < sizeof lg ? *optlen : sizeof lg;
        memcpy(optval, &lg, n);
        *optlen = n;
        return rs_leave(0);
    }
    int v;
    switch (level) {
    case SOL_SOCKET:
        switch (optname) {
        case SO_ERROR:
            rs_progress(rs);
            v = rs->err;
            rs->err = 0;
            break;
        case SO_SNDBUF:
            v = (int)(rs->sbuf_size ? rs->sbuf_size : rs_clamp(rs->sndbuf, RS_DEF_BUF,
                                                               RS_MIN_BUF, RS_MAX_BUF));
            break;
        case SO_RCVBUF:
            v = (int)(rs->ring_size ? rs->ring_size : rs_clamp(rs->rcvbuf, RS_DEF_BUF,
                                                               RS_MIN_BUF, RS_MAX_BUF));
            break;
        case SO_KEEPALIVE:
            v = rs->keepalive;
            break;
        case SO_REUSEADDR:
            v = rs->reuseaddr;
            break;
        case SO_TYPE:
            v = SOCK_STREAM;
            break;
        case SO_ACCEPTCONN:
            v = rs->state == RS_LISTENING;
            break;
        default:
            return rs_leave(sn_err(ENOPROTOOPT));
        }
        break;
    case IPPROTO_TCP:
        switch (optname) {
        case TCP_NODELAY:
            v = rs->nodelay;
            break;
        case TCP_MAXSEG:          /* the RC QP's path MTU: what one packet carries */
            v = 4096;
            break;
        case TCP_KEEPIDLE:
            v = rs->keepidle;
            break;
        default:
            return rs_leave(sn_err(ENOPROTOOPT));
        }
        break;
    case SOL_RDMA:
        switch (optname) {
        case RDMA_SQSIZE:
            v = rs->sq_size ? rs->sq_size : RS_DEF_QSIZE;
            break;
        case RDMA_RQSIZE:
            v = (int)(rs->window ? rs->window : rs->rq_size ? (uint32_t)rs->rq_size : RS_DEF_QSIZE);
            break;
        case RDMA_INLINE:
            v = rs->inline_size;
            break;
        case RDMA_IOMAPSIZE:
            v = RS_IOMAP_MAX;
            break;
        default:
            return rs_leave(sn_err(ENOPROTOOPT));
        }
        break;
    default:
        return rs_leave(sn_err(ENOPROTOOPT));
    }
    socklen_t n = *optlen < sizeof v ? *optlen : sizeof v;
    memcpy(optval, &v, n);
    *optlen = n;
    return rs_leave(0);
}

SN_EXPORT int rfcntl(int socket, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = (cmd == F_SETFL) ? va_arg(ap, long) : 0;
    va_end(ap);
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    switch (cmd) {
    case F_GETFL:
        return rs_leave(O_RDWR | (rs->nonblock ? O_NONBLOCK : 0));
    case F_SETFL:
        rs->nonblock = (arg & O_NONBLOCK) != 0;
        return rs_leave(0);
    default:
        return rs_leave(sn_err(ENOTSUP));
    }
}

/* ------------------------------------------------------------------ iomap */

SN_EXPORT off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset)
{
    (void)flags;
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    if (!buf || !len || len > UINT32_MAX || !(prot & PROT_WRITE) || (prot & ~(PROT_WRITE | PROT_READ)))
        return rs_leave(sn_err(EINVAL));
    if (rs_ready_for_data(rs, 0))
        return rs_leave(-1);
    if (rs->state != RS_CONNECTED)
        return rs_leave(sn_err(ENOTCONN));
    int slot = -1;
    off_t next = 0;
    for (int i = 0; i < RS_IOMAP_MAX; i++) {
        if (!rs->lmap[i].mr) {
            if (slot < 0)
                slot = i;
        } else if (rs->lmap[i].offset + (off_t)rs->lmap[i].len > next) {
            next = rs->lmap[i].offset + (off_t)rs->lmap[i].len;
        }
    }
    if (slot < 0 || (uint32_t)slot >= rs->peer_iomap_count)
        return rs_leave(sn_err(ENOMEM));
    if (offset == -1)
        offset = next;
    struct ibv_mr *mr = ibv_reg_mr(rs->id->pd, buf, len, IBV_ACCESS_LOCAL_WRITE |
                                   IBV_ACCESS_REMOTE_WRITE);
    if (!mr)
        return rs_leave(-1);
    struct rs_iomap_entry *w = &rs->lmap_wire[slot];
    w->offset = htobe64((uint64_t)offset);
    w->addr = htobe64((uint64_t)(uintptr_t)buf);
    w->length = htonl((uint32_t)len);
    w->rkey = htonl(mr->rkey);
    while (rs->sq_out >= rs->sq_size && rs->state == RS_CONNECTED) {
        rs_block(rs, RS_WAIT_MS);
        rs_progress(rs);
    }
    int r = rs->state != RS_CONNECTED ? ENOTCONN
        : rs_post_send(rs, IBV_WR_RDMA_WRITE_WITH_IMM, RS_IMM(RS_OP_IOMAP, slot), w, sizeof *w,
                       rs->lmap_wire_mr->lkey, rs->peer_iomap_addr + slot * sizeof *w,
                       rs->peer_iomap_rkey);
    if (r) {
        ibv_dereg_mr(mr);
        return rs_leave(sn_err(r));
    }
    rs->lmap[slot] = (struct rs_local_map){buf, len, offset, mr};
    return rs_leave(offset);
}

SN_EXPORT int riounmap(int socket, void *buf, size_t len)
{
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return -1;
    for (int i = 0; i < RS_IOMAP_MAX; i++) {
        struct rs_local_map *m = &rs->lmap[i];
        if (!m->mr || m->buf != buf || m->len != len)
            continue;
        /* the peer's entry is cleared first, then the region's key goes */
        struct rs_iomap_entry *w = &rs->lmap_wire[i];
        memset(w, 0, sizeof *w);
        if (rs->state == RS_CONNECTED) {
            while (rs->sq_out >= rs->sq_size && rs->state == RS_CONNECTED) {
                rs_block(rs, RS_WAIT_MS);
                rs_progress(rs);
            }
            if (rs->state == RS_CONNECTED)
                rs_post_send(rs, IBV_WR_RDMA_WRITE_WITH_IMM, RS_IMM(RS_OP_IOMAP, i), w,
                             sizeof *w, rs->lmap_wire_mr->lkey,
                             rs->peer_iomap_addr + i * sizeof *w, rs->peer_iomap_rkey);
        }
        ibv_dereg_mr(m->mr);
        memset(m, 0, sizeof *m);
        return rs_leave(0);
    }
    return rs_leave(sn_err(EINVAL));
}

SN_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)
{
    if (count && !buf)
        return (size_t)sn_err(EFAULT);
    struct rsock *rs = rs_enter(socket);
    if (!rs)
        return (size_t)-1;
    if (rs_ready_for_data(rs, flags))
        return (size_t)rs_leave_n(-1);
    const struct rs_iomap_entry *e = NULL;
    for (int i = 0; i < RS_IOMAP_MAX; i++) {
        const struct rs_iomap_entry *c = &rs->rmap[i];
        uint64_t o = be64toh(c->offset), l = ntohl(c->length);
        if (l && (uint64_t)offset >= o && (uint64_t)offset + count <= o + l) {
            e = c;
            break;
        }
    }
    if (!e)
        return (size_t)rs_leave_n(sn_err(EINVAL));
    uint64_t raddr = be64toh(e->addr) + ((uint64_t)offset - be64toh(e->offset));
    uint32_t rkey = ntohl(e->rkey);
    size_t done = 0;
    while (done < count) {
        if (rs->state != RS_CONNECTED || rs->wr_shut)
            return (size_t)rs_leave_n(done ? (ssize_t)done : sn_err(rs->state == RS_FAILED
                                                                    ? rs->err : EPIPE));
        uint32_t got = 0;
        uint8_t *src = NULL;
        if (rs->sq_out < rs->sq_size - RS_SQ_RESERVE) {
            size_t n = count - done < RS_MAX_MSG ? count - done : RS_MAX_MSG;
            src = rs_stage(rs, (const uint8_t *)buf + done, n, &got);
        }
        if (src) {
            int r = rs_post_send(rs, IBV_WR_RDMA_WRITE, 0, src, got, rs->sbuf_mr->lkey,
                                 raddr + done, rkey);
            if (r) {
                rs_fail(rs, r);
                continue;
            }
            done += got;
            continue;
        }
        rs_progress(rs);
        if (rs->sq_out < rs->sq_size - RS_SQ_RESERVE && rs->s_head - rs->s_tail < rs->sbuf_size)
            continue;
        if (rs_nonblocking(rs, flags))
            return (size_t)rs_leave_n(done ? (ssize_t)done : rs_again());
        rs_block(rs, -1);
    }
    return (size_t)rs_leave_n((ssize_t)done);
}
