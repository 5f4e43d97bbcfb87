/* The UDP driver's receive of a stream of one SEND's or WRITE's MIDDLEs
   (responder.stream_target's), without the
   interpreter between datagrams: receive (recvmsg(2) into buf, cap bytes: the
   socket's one receive buffer, UDP_GRO runs as the kernel coalesces them) and
   take each run with sn_rx_middles, run after run, while each is wholly the next
   MIDDLEs of the SEND or WRITE a QP is receiving in order, or of a WRITE beyond a hole
   whose target is known, from PSN epsn on and up to len (the conditions
   responder.stream_target checks once per call are the caller's, checked
   before the call, and hold while only such MIDDLEs arrive: the PSNs and the
   offset move on here; the packet's conditions are sn_rx_middles'), from its
   peer's address (peer_ip, peer_port).

   Stops, with out[1] saying why:
     0  nothing waits (EAGAIN);
     1  a run that is not (wholly) such MIDDLEs was received: it waits in buf,
        out[2] bytes, datagrams of out[3] bytes (0: one datagram), from out[5]
        (IPv4, host order) port out[6]; its datagrams from offset out[4] on are
        not taken (those before it are), for the engine to take;
     2  max_runs receives, or max_bytes taken (the caller sends the ACKs owed);
     3  a datagram was truncated (dropped);
     4  recvmsg failed: out[9] is its errno.
   Returns how many packets it took; their AckReqs, as indexes from the first
   taken, are acks[0 .. out[0]-1] (a run stops before an AckReq with no room
   left there).  out[7]: the runs wholly taken; out[8]: bytes taken. */
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* Linux's values (linux/udp.h), each as the Python constant named beside it */
#define SN_RX_SOL_UDP 17          /* softnic.transport.udp.SOL_UDP */
#define SN_RX_UDP_GRO 104         /* softnic.transport.udp.UDP_GRO */

/* One recvmsg(2) into buf (cap bytes) without waiting, as both loops below
   take a datagram or a UDP_GRO run: its length, with *gro its segment size (0:
   one datagram) and its source in *sa; or, the loop to stop, -1 with out[1] 0
   (nothing waits) or 4 (out[9]: errno), or -2 with out[1] 3 (a datagram that
   did not fit, dropped).  Signals and ICMP errors for earlier sends
   (ECONNREFUSED) are skipped. */
static ssize_t sn_rx_recv(int fd, uint8_t *buf, size_t cap, struct sockaddr_in *sa,
                          uint32_t *gro, uint32_t *out)
{
    for (;;) {
        struct iovec iov = { buf, cap };
        union {
            char b[CMSG_SPACE(sizeof(int)) * 2];
            struct cmsghdr align;
        } ctl;
        struct msghdr m;
        struct cmsghdr *c;
        ssize_t r;
        memset(&m, 0, sizeof m);
        m.msg_name = sa;
        m.msg_namelen = sizeof *sa;
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.b;
        m.msg_controllen = sizeof ctl.b;
        r = recvmsg(fd, &m, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR || errno == ECONNREFUSED)
                continue;
            out[1] = (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : 4;
            out[9] = (uint32_t)errno;
            return -1;
        }
        if ((m.msg_flags & MSG_TRUNC) || (size_t)r >= cap) {
            out[1] = 3;
            return -2;
        }
        *gro = 0;
        for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SN_RX_SOL_UDP && c->cmsg_type == SN_RX_UDP_GRO
                    && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
                int g;
                memcpy(&g, CMSG_DATA(c), sizeof g);
                *gro = g > 0 && (size_t)g < (size_t)r ? (uint32_t)g : 0;
            }
        return r;
    }
}

/* A receive a loop did not (wholly) take, for the engine (out[1] = 1): r bytes,
   segments of gro, from offset o on, from sa. */
static void sn_rx_left(uint32_t *out, ssize_t r, uint32_t gro, size_t o,
                       const struct sockaddr_in *sa)
{
    out[1] = 1;
    out[2] = (uint32_t)r;
    out[3] = gro;
    out[4] = (uint32_t)o;
    out[5] = ntohl(sa->sin_addr.s_addr);
    out[6] = ntohs(sa->sin_port);
}

/* One receive, as the UDP socket's recv_runs takes them (softnic.transport.udp,
   IPv4, UDP_GRO on): sn_rx_recv, what it received left in buf as sn_rx_left
   leaves a run for the engine (out[1] 1: out[2] bytes, datagrams of out[3]
   bytes, 0 for one, from out[5] port out[6]); or out[1] 0 (nothing waits), 3 (a
   datagram truncated, dropped) or 4 (recvmsg failed: out[9] its errno).
   Returns out[1].  The same receive as the Python's recvmsg_into and its
   UDP_GRO ancillary data, without a poll(2) before it or an exception when
   nothing waits. */
int sn_rx_one(int fd, uint8_t *buf, size_t cap, uint32_t *out)
{
    struct sockaddr_in sa;
    uint32_t gro;
    ssize_t r = sn_rx_recv(fd, buf, cap, &sa, &gro, out);
    if (r < 0)
        return (int)out[1];
    sn_rx_left(out, r, gro, 0, &sa);
    return 1;
}

int sn_rx_stream(int fd, uint8_t *buf, size_t cap, uint32_t peer_ip, uint32_t peer_port,
                 uint32_t w0, uint32_t dqpn, uint32_t epsn, uint32_t start, uint32_t seg,
                 uint8_t *dst, uint64_t off, uint64_t len, uint32_t max_runs,
                 uint64_t max_bytes, uint32_t *acks, uint32_t cap_acks, uint32_t *out)
{
    uint32_t taken = 0, nacks = 0, runs = 0, mtu = seg - 16;
    uint64_t bytes = 0;
    memset(out, 0, 10 * sizeof *out);
    while (runs < max_runs && bytes < max_bytes) {
        struct sockaddr_in sa;
        ssize_t r;
        uint32_t gro, k, na = 0, ip;
        r = sn_rx_recv(fd, buf, cap, &sa, &gro, out);
        if (r < 0) {
            runs += r == -2;          /* (a truncated datagram is a receive) */
            break;
        }
        runs++;
        ip = ntohl(sa.sin_addr.s_addr);
        k = 0;
        if (sa.sin_family == AF_INET && ip == peer_ip && ntohs(sa.sin_port) == peer_port
                && (gro ? gro : (uint32_t)r) == seg)
            k = (uint32_t)sn_rx_middles(buf, (size_t)r, 0, seg, w0, dqpn, epsn, start, dst,
                                        off, len, 0xFFFFFFFFu, acks + nacks,
                                        cap_acks - nacks, &na);
        for (uint32_t i = 0; i < na; i++)
            acks[nacks + i] += taken;
        nacks += na;
        taken += k;
        epsn = (epsn + k) & PSN_MASK;
        off += (uint64_t)k * mtu;
        bytes += (uint64_t)k * seg;
        if ((size_t)k * seg < (size_t)r) {
            sn_rx_left(out, r, gro, (size_t)k * seg, &sa);
            runs--;
            break;
        }
        out[1] = 2;
    }
    out[0] = nacks;
    out[7] = runs;
    out[8] = (uint32_t)bytes;
    return (int)taken;
}

/* The loop sn_rx_answers and sn_rx_reads share: receive (sn_rx_recv) and offer
   each datagram from the peer (peer_ip, peer_port), a GRO run's one segment at
   a time, to take(ctx, p, n), which says whether it took it; while *more (take
   clears it once it wants no more) and for at most max_runs receives.  Stops,
   with out[1] saying why, as those two functions state; out[7] is the receives
   used.  Returns the bytes received. */
static uint64_t sn_rx_segments(int fd, uint8_t *buf, size_t cap, uint32_t peer_ip,
                               uint32_t peer_port, uint32_t max_runs,
                               int (*take)(void *, const uint8_t *, size_t), void *ctx,
                               const int *more, uint32_t *out)
{
    uint32_t runs = 0;
    uint64_t bytes = 0;
    while (runs < max_runs && *more) {
        struct sockaddr_in sa;
        ssize_t r;
        size_t o = 0, seg;
        uint32_t gro, ip;
        r = sn_rx_recv(fd, buf, cap, &sa, &gro, out);
        if (r < 0) {
            runs += r == -2;          /* (a truncated datagram is a receive) */
            break;
        }
        runs++;
        bytes += (uint64_t)r;
        ip = ntohl(sa.sin_addr.s_addr);
        seg = gro ? gro : (size_t)r;
        if (sa.sin_family == AF_INET && ip == peer_ip && ntohs(sa.sin_port) == peer_port)
            while (o < (size_t)r && *more) {
                size_t n = (size_t)r - o < seg ? (size_t)r - o : seg;
                if (!take(ctx, buf + o, n))
                    break;
                o += n;
            }
        if (o < (size_t)r) {
            sn_rx_left(out, r, gro, o, &sa);
            runs--;
            break;
        }
        out[1] = 2;
    }
    out[7] = runs;
    return bytes;
}

/* sn_rx_answers' state, and its take for sn_rx_segments: one request answered
   and its response sent, or 0. */
struct sn_answers {
    int more, fd;
    uint32_t taken, max, lost, kind, w0, qpn, epsn, req_start, rkey, length, resp_w0, dqpn,
        syndrome, msn, resp_start, mtu, mid_w0, mid_start, last_w0, last_start, max_middles;
    uint64_t lo, hi;
    uint8_t *mem, *resp, *heads;
    uint64_t *origs;
    struct sockaddr_in to;
};

/* A READ of more than one packet (kind 3) answered: sn_read_run's responses
   sent, the FIRST and LAST from resp (the LAST after the FIRST's room), the
   MIDDLEs gathered from their headers and the memory they read
   (sn_send_gather, UDP GSO); a send the socket refuses loses its datagrams
   (counted), as sn_answer's.  Returns the packets the READ took on the
   wire, or 0 (not taken). */
static uint32_t sn_answer_run(struct sn_answers *a, const uint8_t *p, size_t n, uint32_t aeth)
{
    size_t first_len = BTH_LEN + AETH_LEN + (size_t)a->mtu + ICRC_LEN, k;
    uint8_t *last = a->resp + first_len;
    uint64_t at;
    uint32_t npkts, lost;
    int err;
    k = sn_read_run(p, n, a->w0, a->qpn, a->epsn, a->req_start, a->rkey, a->length, a->lo,
                    a->hi, a->mem, a->mtu, a->resp_w0, a->mid_w0, a->last_w0, a->dqpn, aeth,
                    a->resp_start, a->mid_start, a->last_start, a->max_middles, a->resp,
                    a->heads, last, &at);
    if (!k)
        return 0;
    npkts = (uint32_t)(((uint64_t)a->length + a->mtu - 1) / a->mtu);
    if (sendto(a->fd, a->resp, first_len, 0, (struct sockaddr *)&a->to, sizeof a->to) < 0)
        a->lost++;
    if (npkts > 2) {
        uint32_t done = (uint32_t)sn_send_gather(
            a->fd, ntohl(a->to.sin_addr.s_addr), ntohs(a->to.sin_port), 0, 0, a->heads,
            a->mem + at + a->mtu, a->mtu, npkts - 2, 0, 0, 64, &lost, &err);
        a->lost += lost + (npkts - 2 - done);     /* (an error: the rest not sent) */
    }
    if (sendto(a->fd, last, k, 0, (struct sockaddr *)&a->to, sizeof a->to) < 0)
        a->lost++;
    return npkts;
}

static int sn_answer(void *ctx, const uint8_t *p, size_t n)
{
    struct sn_answers *a = ctx;
    uint32_t aeth = a->syndrome | ((a->msn + 1) & MSN_MASK);
    size_t k;
    if (a->kind == 3) {
        uint32_t npkts = sn_answer_run(a, p, n, aeth);
        if (!npkts)
            return 0;
        a->msn = (a->msn + 1) & MSN_MASK;
        a->epsn = (a->epsn + npkts) & PSN_MASK;
        a->more = ++a->taken < a->max;
        return 1;
    }
    if (a->kind == 0)
        k = sn_read_only(p, n, a->w0, a->qpn, a->epsn, a->req_start, a->rkey, a->length, a->lo,
                         a->hi, a->mem, a->resp_w0, a->dqpn, aeth, a->resp_start, a->resp);
    else
        k = sn_atomic_ack(p, n, a->w0, a->qpn, a->epsn, a->req_start, a->rkey, a->kind == 2,
                          a->lo, a->hi, a->mem, a->resp_w0, a->dqpn, aeth, a->resp_start,
                          a->resp, a->origs + a->taken);
    if (!k)
        return 0;
    if (sendto(a->fd, a->resp, k, 0, (struct sockaddr *)&a->to, sizeof a->to) < 0)
        a->lost++;
    a->msn = (a->msn + 1) & MSN_MASK;
    a->epsn = (a->epsn + 1) & PSN_MASK;
    a->more = ++a->taken < a->max;
    return 1;
}

/* The UDP driver's answer to a peer's READs or ATOMICs
   (responder.answer_target's), without the interpreter between request and
   response: receive (as sn_rx_stream: recvmsg(2) into buf, cap bytes, UDP_GRO
   runs as the kernel coalesces them) and, while each datagram from the QP's
   peer (peer_ip, peer_port) is such a request at the ePSN (kind 0: a READ,
   sn_read_only's conditions; 1: a FETCH_ADD, 2: a COMPARE_SWAP,
   sn_atomic_ack's; 3: a READ of more than one packet, sn_read_run's, whose
   responses need room for max_middles MIDDLEs' 16-byte headers in heads; from
   epsn on, each answered with the MSN after it: msn + 1 for the first), send
   its response to the peer at once (sendto(2) from resp, room for the longest:
   BTH + AETH + length + pad + ICRC bytes; for kind 3, room for the FIRST,
   BTH + AETH + mtu + ICRC bytes, and the LAST after it, its MIDDLEs gathered
   from memory by sn_answer_run; mid_w0, mid_start, last_w0 and last_start are
   sn_read_run's, the others unused).  An ATOMIC's
   original value goes to origs (max entries).  A send the socket refuses (no
   room, no route) loses the response, as a wire would: counted in out[8]; the
   requester's retransmission asks again (a duplicate, the engine's to answer).

   Stops, with out[1] saying why (out[2..7] and out[9] as sn_rx_stream's):
     0  nothing waits;  1  a datagram not so taken waits in buf (from offset
     out[4] on, of a run of out[2] bytes, segments of out[3]; from out[5] port
     out[6]), for the engine;  2  max requests answered, or max_runs receives
     used;  3  a truncated datagram (dropped);  4  recvmsg failed (out[9]:
     errno).
   in_len > 0: first the datagrams of a run received before, in buf (in_len
   bytes, segments of in_seg, 0: one datagram) from offset in_off on, from the
   peer (a run an earlier call stopped in, the engine having taken the
   datagram it stopped at); stopping in it (a datagram not taken, or max
   answered), out[1] is 1, out[2..6] say what is left as for a receive and
   out[9] is 1 (no receive used).
   Returns how many it answered; responder.took_answers accounts for them (the
   ePSN past each one's responses, the MSN past each, each remembered for its
   replay). */
int sn_rx_answers(int fd, uint8_t *buf, size_t cap, uint32_t peer_ip, uint32_t peer_port,
                  uint32_t kind, uint32_t w0, uint32_t qpn, uint32_t epsn, uint32_t req_start,
                  uint32_t rkey, uint32_t length, uint64_t lo, uint64_t hi, uint8_t *mem,
                  uint32_t resp_w0, uint32_t dqpn, uint32_t syndrome, uint32_t msn,
                  uint32_t resp_start, uint8_t *resp, uint32_t max, uint64_t *origs,
                  uint32_t mtu, uint32_t mid_w0, uint32_t mid_start, uint32_t last_w0,
                  uint32_t last_start, uint8_t *heads, uint32_t max_middles, size_t in_len,
                  uint32_t in_seg, size_t in_off, uint32_t max_runs, uint32_t *out)
{
    struct sn_answers a;
    memset(out, 0, 10 * sizeof *out);
    memset(&a, 0, sizeof a);
    a.more = max > 0;
    a.fd = fd;
    a.max = max;
    a.kind = kind;
    a.w0 = w0;
    a.qpn = qpn;
    a.epsn = epsn;
    a.req_start = req_start;
    a.rkey = rkey;
    a.length = length;
    a.resp_w0 = resp_w0;
    a.dqpn = dqpn;
    a.syndrome = syndrome;
    a.msn = msn;
    a.resp_start = resp_start;
    a.lo = lo;
    a.hi = hi;
    a.mem = mem;
    a.resp = resp;
    a.origs = origs;
    a.mtu = mtu;
    a.mid_w0 = mid_w0;
    a.mid_start = mid_start;
    a.last_w0 = last_w0;
    a.last_start = last_start;
    a.heads = heads;
    a.max_middles = max_middles;
    a.to.sin_family = AF_INET;
    a.to.sin_port = htons((uint16_t)peer_port);
    a.to.sin_addr.s_addr = htonl(peer_ip);
    if (in_len) {                       /* the rest of a run received before, first */
        size_t o = in_off, seg = in_seg ? in_seg : in_len;
        while (o < in_len && a.more) {
            size_t n = in_len - o < seg ? in_len - o : seg;
            if (!sn_answer(&a, buf + o, n))
                break;
            o += n;
        }
        if (o < in_len) {               /* (max answered, or one not taken: the rest */
            sn_rx_left(out, (ssize_t)in_len, in_seg, o, &a.to);     /* the engine's) */
            out[8] = a.lost;
            out[9] = 1;
            return (int)a.taken;
        }
        out[1] = 2;
    }
    sn_rx_segments(fd, buf, cap, peer_ip, peer_port, max_runs, sn_answer, &a, &a.more, out);
    out[8] = a.lost;
    return (int)a.taken;
}

/* sn_rx_reads' state, and its take for sn_rx_segments: the next response
   expected taken, or 0. */
struct sn_reads {
    int more;
    uint32_t qpn, epsn, mtu, first_w0, first_start, mid_w0, mid_start, nreads, i, p, taken,
        done;
    uint8_t **dst;
    const uint32_t *len, *last_w0, *last_start;
};

static int sn_read_response(void *ctx, const uint8_t *b, size_t n)
{
    struct sn_reads *r = ctx;
    uint32_t i = r->i, p = r->p, ack, na;
    uint32_t npkts = (uint32_t)(((uint64_t)r->len[i] + r->mtu - 1) / r->mtu);
    uint64_t off = (uint64_t)p * r->mtu;
    int ok;
    if (npkts < 2)
        return 0;
    if (p == 0)
        ok = sn_rx_edge(b, n, r->first_w0, r->qpn, r->epsn, r->first_start, EXT_AETH, r->dst[i],
                        0, r->mtu, r->len[i]);
    else if (p == npkts - 1)
        ok = sn_rx_edge(b, n, r->last_w0[i], r->qpn, r->epsn, r->last_start[i], EXT_AETH,
                        r->dst[i], off, r->len[i] - off, r->len[i]);
    else
        ok = n == BTH_LEN + (size_t)r->mtu + ICRC_LEN
            && sn_rx_middles(b, n, 0, n, r->mid_w0, r->qpn, r->epsn, r->mid_start, r->dst[i],
                             off, (uint64_t)(npkts - 1) * r->mtu, 1, &ack, 1, &na) == 1;
    if (!ok)
        return 0;
    r->taken++;
    r->epsn = (r->epsn + 1) & PSN_MASK;
    if (++r->p == npkts) {
        r->p = 0;
        r->done++;
        r->more = ++r->i < r->nreads;
    }
    return 1;
}

/* The UDP driver's receive of a QP's READ responses for its outstanding READs
   (completer.reads_target's), without the interpreter between them: receive
   (as sn_rx_stream: recvmsg(2) into buf, cap bytes, UDP_GRO runs as the kernel
   coalesces them) and, while each datagram from the QP's peer (peer_ip,
   peer_port) is the next response expected, take it, from PSN epsn on: READ i
   of nreads (its bytes to dst[i], len[i] of them, npkts = ceil(len[i] / mtu),
   at least 2, its PSNs following the one before's) has its FIRST taken by
   sn_rx_edge (EXT_AETH: an ACK; word 0 first_w0, the ICRC from first_start;
   mtu bytes to dst[i]), each MIDDLE by sn_rx_middles (word 0 mid_w0, ICRC
   mid_start, BTH + mtu + ICRC bytes; room up to its LAST), its LAST by
   sn_rx_edge (word 0 last_w0[i], its pad count in it; ICRC last_start[i]; the
   rest of its bytes) (completer.receive_edge and receive_middles, what
   _read_response does for each at the expected PSN); the first READ from its
   packet p0 on (those before were taken).

   Stops, with out[1] saying why (out[2..7] and out[9] as sn_rx_stream's):
     0  nothing waits;  1  a datagram not so taken waits in buf (from offset
     out[4] on, of a run of out[2] bytes, segments of out[3]; from out[5] port
     out[6]), for the engine;  2  max_runs receives, or every READ's responses
     taken;  3  a truncated datagram (dropped);  4  recvmsg failed (out[9]: errno).
   Returns how many packets it took; out[0] is how many READs it finished (their
   LAST taken), out[8] the bytes received; completer.took_responses accounts for
   them. */
int sn_rx_reads(int fd, uint8_t *buf, size_t cap, uint32_t peer_ip, uint32_t peer_port,
                uint32_t qpn, uint32_t epsn, uint32_t mtu, uint32_t first_w0,
                uint32_t first_start, uint32_t mid_w0, uint32_t mid_start, uint32_t nreads,
                uint8_t **dst, const uint32_t *len, const uint32_t *last_w0,
                const uint32_t *last_start, uint32_t p0, uint32_t max_runs, uint32_t *out)
{
    struct sn_reads r;
    memset(out, 0, 10 * sizeof *out);
    memset(&r, 0, sizeof r);
    r.more = mtu > 0 && nreads > 0;
    r.qpn = qpn;
    r.epsn = epsn;
    r.mtu = mtu;
    r.first_w0 = first_w0;
    r.first_start = first_start;
    r.mid_w0 = mid_w0;
    r.mid_start = mid_start;
    r.nreads = nreads;
    r.p = p0;
    r.dst = dst;
    r.len = len;
    r.last_w0 = last_w0;
    r.last_start = last_start;
    out[8] = (uint32_t)sn_rx_segments(fd, buf, cap, peer_ip, peer_port, max_runs,
                                      sn_read_response, &r, &r.more, out);
    out[0] = r.done;
    return (int)r.taken;
}
