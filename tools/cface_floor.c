/* cface_floor.c: the floor cost, in C, of the per-message work a software RoCEv2 NIC
 * does for one RC SEND or RC RDMA WRITE, one message at a time, in one process
 * with two devices (A requester, B responder) on two nonblocking UDP sockets
 * bound on 127.0.0.1, UDP_GRO on both.  Wire format as softnic's
 * (softnic/wire/roce.py, icrc.py; softnic/accel/kernel.c, send.c, rx.c):
 *
 *   BTH 12 B [RETH 16 B] payload pad ICRC 4 B  (ICRC little-endian)
 *   ICRC = crc32 over: 8 x 0xFF, IPv4 header (TOS, TTL, checksum all ones;
 *   id 0, DF), UDP header (checksum all ones), BTH with byte 4 all ones, rest.
 *   As softnic (icrc_start / sn_crc32), the CRC state after the pseudo header
 *   and BTH bytes 0-7 is cached per packet shape; each packet's CRC is then
 *   crc32(start, pkt + 8, len - 12).
 *
 *   SEND of S bytes at MTU M: ceil(S/M) packets (FIRST, MIDDLE.., LAST; or
 *   ONLY), AckReq on the last, all in one sendmsg with UDP_SEGMENT = 12+M+4.
 *   WRITE of S <= M bytes: one WRITE ONLY with RETH, AckReq.
 *   ACK: BTH + AETH (syndrome 0x1F, MSN) + ICRC, sent with sendto.
 *
 * A measuring stick for the C face's cost per message (tools/cface_loop.py):
 * nothing in softnic runs it.  It writes the same packets softnic sends
 * (tests/test_cface_floor.py decodes them with softnic.wire and checks their
 * ICRCs), with none of the engine's rules beyond the common case: no
 * retransmission, no window, no errors but a fatal stop.
 *
 * Usage: cface_floor send|write SIZE [N [WARMUP]] [--crc zlib|isal:/path/to/lib.so]
 *        [--nosock]
 *   --nosock: the same building, checking and copying, but each run is read
 *   where its sender built it (no syscalls, no kernel copies): the user-space
 *   part alone.
 * Prints "floor OP SIZE: cpu_us X wall_us Y user_us U sys_us S" per message.
 *
 * Build: gcc -O2 -Wall -o cface_floor tools/cface_floor.c -ldl
 * FLOOR_DUMP=FILE writes the first message's packets to FILE and its ACK to FILE.ack.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "../softnic/accel/bytes.h"     /* be32, put_be32, put_be64, le32, put_le32 */
#include "../softnic/accel/wire.h"      /* BTH_LEN .. MSN_MASK, as the kernel has them */

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define PKEY 0xFFFF
#define ACK_CREDITS 0x1F
#define MTU 4096
#define SEG (BTH_LEN + MTU + ICRC_LEN)
#define MAXPKT 64
#define RXCAP 65536

enum { OP_SEND_FIRST = 0x00, OP_SEND_MIDDLE = 0x01, OP_SEND_LAST = 0x02, OP_SEND_ONLY = 0x04,
       OP_WRITE_ONLY = 0x0A, OP_ACK = 0x11 };

#define DIE(...) \
    do { fprintf(stderr, "cface_floor: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

/* ---- CRC-32: zlib's crc32 (default; libz.so.1, loaded at start, as the kernel
   takes it: no zlib headers needed) or ISA-L's crc32_gzip_refl (--crc isal:LIB) */
typedef uint32_t (*isal_fn)(uint32_t, const unsigned char *, uint64_t);
typedef unsigned long (*zlib_fn)(unsigned long, const unsigned char *, unsigned int);
static isal_fn crc_isal;
static zlib_fn crc_zlib;
static inline uint32_t crc(uint32_t c, const uint8_t *p, size_t n)
{
    if (crc_isal)
        return crc_isal(c, p, n);
    return (uint32_t)crc_zlib(c, p, (unsigned int)n);
}

static inline uint64_t be64(const uint8_t *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

/* ---- the ICRC's start state: CRC after the pseudo header and BTH bytes 0-7
   (byte 4 masked), for a packet of roce_len bytes (BTH .. ICRC) between two
   endpoints; a small cache, as softnic's _start_cache */
struct path { uint32_t src_ip, dst_ip; uint16_t sport, dport; };   /* host order */

static uint32_t icrc_start_compute(const struct path *pa, uint32_t roce_len, uint32_t w0,
                                   uint32_t dqpn_word)
{
    uint8_t ps[8 + 20 + 8 + 8];
    uint8_t *ip = ps + 8, *udp = ps + 28, *bth = ps + 36;
    memset(ps, 0xFF, 8);
    ip[0] = 0x45; ip[1] = 0xFF;
    ip[2] = (20 + 8 + roce_len) >> 8; ip[3] = (uint8_t)(20 + 8 + roce_len);
    ip[4] = 0; ip[5] = 0; ip[6] = 0x40; ip[7] = 0;           /* id 0, DF */
    ip[8] = 0xFF; ip[9] = 17; ip[10] = 0xFF; ip[11] = 0xFF;   /* TTL, UDP, checksum */
    put_be32(ip + 12, pa->src_ip);
    put_be32(ip + 16, pa->dst_ip);
    udp[0] = pa->sport >> 8; udp[1] = (uint8_t)pa->sport;
    udp[2] = pa->dport >> 8; udp[3] = (uint8_t)pa->dport;
    udp[4] = (8 + roce_len) >> 8; udp[5] = (uint8_t)(8 + roce_len);
    udp[6] = 0xFF; udp[7] = 0xFF;
    put_be32(bth, w0);
    put_be32(bth + 4, dqpn_word);
    bth[4] = 0xFF;                                            /* FECN, BECN, resv6 */
    return crc(0, ps, sizeof ps);
}

#define NCACHE 16
struct start_cache {
    struct { uint32_t len, w0, w1, start; int used; } e[NCACHE];
    int next;
    const struct path *pa;
};

static inline uint32_t icrc_start(struct start_cache *sc, uint32_t len, uint32_t w0, uint32_t w1)
{
    w1 &= QPN_MASK;            /* byte 4 is masked: the start depends on bytes 5-7 only */
    for (int i = 0; i < NCACHE; i++)
        if (sc->e[i].used && sc->e[i].len == len && sc->e[i].w0 == w0 && sc->e[i].w1 == w1)
            return sc->e[i].start;
    int i = sc->next;
    sc->next = (sc->next + 1) % NCACHE;
    sc->e[i].len = len; sc->e[i].w0 = w0; sc->e[i].w1 = w1; sc->e[i].used = 1;
    sc->e[i].start = icrc_start_compute(sc->pa, len, w0, w1);
    return sc->e[i].start;
}

/* seal a packet of n bytes (BTH .. ICRC) at p */
static inline void seal(struct start_cache *sc, uint8_t *p, size_t n)
{
    uint32_t s = icrc_start(sc, (uint32_t)n, be32(p), be32(p + 4));
    put_le32(p + n - ICRC_LEN, crc(s, p + 8, n - 8 - ICRC_LEN));
}

static inline int icrc_ok(struct start_cache *sc, const uint8_t *p, size_t n)
{
    if (n < BTH_LEN + ICRC_LEN)
        return 0;
    uint32_t s = icrc_start(sc, (uint32_t)n, be32(p), be32(p + 4));
    return crc(s, p + 8, n - 8 - ICRC_LEN) == le32(p + n - ICRC_LEN);
}

static inline void put_bth(uint8_t *p, int opcode, int pad, uint32_t dqpn, uint32_t psn,
                           int ackreq)
{
    put_be32(p, (uint32_t)opcode << 24 | (uint32_t)(pad << 4) << 16 | PKEY);
    put_be32(p + 4, dqpn & QPN_MASK);
    put_be32(p + 8, (psn & PSN_MASK) | (ackreq ? BTH_ACKREQ : 0));
}

/* ---- a CQE and a receive WQE, 32 bytes each */
struct cqe { uint64_t wr_id; uint32_t status, opcode, byte_len, qp_num, src_qp, flags; };
struct rwqe { uint64_t wr_id, addr; uint32_t len, lkey; uint64_t resv; };
_Static_assert(sizeof(struct cqe) == 32, "cqe 32 bytes");
_Static_assert(sizeof(struct rwqe) == 32, "rwqe 32 bytes");

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static double tv_s(struct timeval t) { return t.tv_sec + t.tv_usec * 1e-6; }

/* ---- the transport: sockets, or in-memory hand-over (--nosock) */
static int nosock;
static const uint8_t *mem_buf;  /* --nosock: the one datagram/run in flight */
static size_t mem_len, mem_gro;
static int mem_to;              /* which side it is for: 0 A, 1 B; -1 none */
static unsigned long n_eagain, n_poll;

static int fd_a, fd_b;
static struct sockaddr_in sa_a, sa_b;

/* send a run of n bytes of packets of gso bytes each (0: one datagram) to side `to` */
static void xmit(int from_fd, int to, const uint8_t *buf, size_t n, size_t gso)
{
    if (nosock) {
        mem_buf = buf;                  /* handed over in place: no copy */
        mem_len = n;
        mem_gro = gso;
        mem_to = to;
        return;
    }
    const struct sockaddr_in *dst = to ? &sa_b : &sa_a;
    ssize_t r;
    if (gso) {
        struct iovec iov = { (void *)buf, n };
        union { char b[CMSG_SPACE(sizeof(uint16_t))]; struct cmsghdr align; } ctl;
        struct msghdr m;
        memset(&m, 0, sizeof m);
        memset(&ctl, 0, sizeof ctl);
        m.msg_name = (void *)dst;
        m.msg_namelen = sizeof *dst;
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.b;
        m.msg_controllen = sizeof ctl.b;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        uint16_t seg = (uint16_t)gso;
        memcpy(CMSG_DATA(c), &seg, sizeof seg);
        r = sendmsg(from_fd, &m, 0);
    } else {
        r = sendto(from_fd, buf, n, 0, (const struct sockaddr *)dst, sizeof *dst);
    }
    if (r != (ssize_t)n)
        DIE("send: %zd of %zu (%s)", r, n, strerror(errno));
}

/* receive one datagram or GRO run on side `me`: its length, *gro its segment
   size (0: one datagram); spins as a polling program would: recvmsg without
   waiting, poll(2) when nothing is there */
static size_t rcv(int fd, int me, const uint8_t **bufp, size_t cap, size_t *gro)
{
    uint8_t *buf = (uint8_t *)*bufp;
    if (nosock) {
        if (mem_to != me)
            DIE("nosock: nothing for side %d", me);
        *bufp = mem_buf;                /* read where the sender built it */
        mem_to = -1;
        *gro = mem_gro;
        return mem_len;
    }
    for (;;) {
        struct iovec iov = { buf, cap };
        union { char b[CMSG_SPACE(sizeof(int)) * 2]; struct cmsghdr align; } ctl;
        struct sockaddr_in from;
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_name = &from;
        m.msg_namelen = sizeof from;
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.b;
        m.msg_controllen = sizeof ctl.b;
        ssize_t r = recvmsg(fd, &m, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd p = { fd, POLLIN, 0 };
                n_eagain++;
                n_poll++;
                if (poll(&p, 1, 2000) == 0)
                    DIE("no datagram in 2 s on side %d", me);
                continue;
            }
            if (errno == EINTR)
                continue;
            DIE("recvmsg: %s", strerror(errno));
        }
        if (m.msg_flags & MSG_TRUNC)
            DIE("truncated");
        *gro = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                int g;
                memcpy(&g, CMSG_DATA(c), sizeof g);
                *gro = g > 0 && g < r ? (size_t)g : 0;
            }
        return (size_t)r;
    }
}

static int open_sock(struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0), one = 1;
    if (fd < 0)
        DIE("socket: %s", strerror(errno));
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)sa, sizeof *sa) < 0)
        DIE("bind: %s", strerror(errno));
    socklen_t l = sizeof *sa;
    getsockname(fd, (struct sockaddr *)sa, &l);
    if (setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) < 0)
        DIE("UDP_GRO: %s", strerror(errno));
    return fd;
}

int main(int argc, char **argv)
{
    const char *op = NULL, *crcname = "zlib";
    size_t size = 0;
    long n = 20000, warm = 1000;
    int pos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--crc") && i + 1 < argc)
            crcname = argv[++i];
        else if (!strcmp(argv[i], "--nosock"))
            nosock = 1;
        else if (pos == 0) { op = argv[i]; pos++; }
        else if (pos == 1) { size = strtoul(argv[i], NULL, 0); pos++; }
        else if (pos == 2) { n = atol(argv[i]); pos++; }
        else if (pos == 3) { warm = atol(argv[i]); pos++; }
    }
    if (!op || (strcmp(op, "send") && strcmp(op, "write")) || size == 0) {
        fprintf(stderr, "usage: cface_floor send|write SIZE [N [WARMUP]] "
                        "[--crc zlib|isal:LIB] [--nosock]\n");
        return 2;
    }
    int send = !strcmp(op, "send");
    void *z = dlopen("libz.so.1", RTLD_NOW);
    if (!z || !(crc_zlib = (zlib_fn)dlsym(z, "crc32")))
        DIE("zlib: %s", dlerror());
    if (!strncmp(crcname, "isal:", 5)) {
        void *h = dlopen(crcname + 5, RTLD_NOW);
        if (!h || !(crc_isal = (isal_fn)dlsym(h, "crc32_gzip_refl")))
            DIE("ISA-L: %s", dlerror());
        static const uint8_t t[] = "123456789 the quick brown fox";
        if (crc_isal(0x1234, t, sizeof t) != (uint32_t)crc_zlib(0x1234, t, sizeof t))
            DIE("ISA-L's crc32_gzip_refl disagrees with zlib");
    } else if (strcmp(crcname, "zlib"))
        DIE("--crc zlib or isal:LIB");
    size_t npkts = send ? (size + MTU - 1) / MTU : 1;
    if (!send && size > MTU)
        DIE("a WRITE of one packet: SIZE <= %d", MTU);
    if (npkts > MAXPKT)
        DIE("at most %d packets", MAXPKT);

    if (!nosock) {
        fd_a = open_sock(&sa_a);
        fd_b = open_sock(&sa_b);
    } else {
        sa_a.sin_addr.s_addr = sa_b.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sa_a.sin_port = htons(40001);
        sa_b.sin_port = htons(40002);
    }
    mem_to = -1;
    struct path ab = { ntohl(sa_a.sin_addr.s_addr), ntohl(sa_b.sin_addr.s_addr),
                       ntohs(sa_a.sin_port), ntohs(sa_b.sin_port) };
    struct path ba = { ab.dst_ip, ab.src_ip, ab.dport, ab.sport };
    /* each side's caches: A seals on a->b and checks on b->a, B the reverse */
    struct start_cache a_tx = { .pa = &ab }, a_rx = { .pa = &ba };
    struct start_cache b_tx = { .pa = &ba }, b_rx = { .pa = &ab };

    const uint32_t qpn_a = 0x11, qpn_b = 0x22, rkey = 0x1234;
    uint8_t *src = malloc(size), *dst = calloc(1, size);
    uint8_t *txa = malloc(RXCAP), *rxa = malloc(RXCAP), *txb = malloc(64), *rxb = malloc(RXCAP);
    long total = n + warm;
    struct cqe *cq_a = calloc(total, sizeof *cq_a), *cq_b = calloc(total, sizeof *cq_b);
    struct rwqe *rq_b = calloc(total, sizeof *rq_b);
    if (!src || !dst || !txa || !rxa || !txb || !rxb || !cq_a || !cq_b || !rq_b)
        DIE("malloc");
    for (size_t i = 0; i < size; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    uint32_t a_psn = 0x100, b_epsn = 0x100, b_msn = 0, a_msn = 0;
    long rq_head = 0, rq_tail = 0, cq_a_n = 0, cq_b_n = 0;
    double c0 = 0, w0 = 0;
    struct rusage ru0 = {0}, ru1;
    unsigned long eagain0 = 0, poll0 = 0;

    for (long i = -warm; i < n; i++) {
        if (i == 0) {
            getrusage(RUSAGE_SELF, &ru0);
            eagain0 = n_eagain;
            poll0 = n_poll;
            c0 = cpu_s();
            w0 = now_s();
        }
        uint32_t stamp = (uint32_t)(i + warm) * 2654435761u;
        memcpy(src, &stamp, 4);                       /* each message's bytes differ */
        if (size >= 8)
            memcpy(src + size - 4, &stamp, 4);
        if (send)                                     /* the receive posted */
            rq_b[rq_tail++] = (struct rwqe){ (uint64_t)i, (uintptr_t)dst, (uint32_t)size, 1, 0 };

        /* ---- 1. A builds the message's packets and sends them */
        uint32_t first_psn = a_psn, last_psn;
        size_t run = 0;
        if (send) {
            for (size_t k = 0; k < npkts; k++) {
                size_t off = k * MTU, len = size - off < MTU ? size - off : MTU;
                int pad = (int)(-len & 3);
                int opc = npkts == 1 ? OP_SEND_ONLY : k == 0 ? OP_SEND_FIRST
                        : k == npkts - 1 ? OP_SEND_LAST : OP_SEND_MIDDLE;
                uint8_t *p = txa + run;
                put_bth(p, opc, pad, qpn_b, a_psn, k == npkts - 1);
                memcpy(p + BTH_LEN, src + off, len);
                memset(p + BTH_LEN + len, 0, pad);
                size_t plen = BTH_LEN + len + pad + ICRC_LEN;
                seal(&a_tx, p, plen);
                run += plen;
                a_psn = (a_psn + 1) & PSN_MASK;
            }
        } else {
            uint8_t *p = txa;
            int pad = (int)(-size & 3);
            put_bth(p, OP_WRITE_ONLY, pad, qpn_b, a_psn, 1);
            put_be64(p + BTH_LEN, (uintptr_t)dst);
            put_be32(p + BTH_LEN + 8, rkey);
            put_be32(p + BTH_LEN + 12, (uint32_t)size);
            memcpy(p + BTH_LEN + RETH_LEN, src, size);
            memset(p + BTH_LEN + RETH_LEN + size, 0, pad);
            run = BTH_LEN + RETH_LEN + size + pad + ICRC_LEN;
            seal(&a_tx, p, run);
            a_psn = (a_psn + 1) & PSN_MASK;
        }
        last_psn = (a_psn - 1) & PSN_MASK;
        (void)first_psn;
        if (i == -warm && getenv("FLOOR_DUMP")) {     /* the first run, for checking */
            FILE *f = fopen(getenv("FLOOR_DUMP"), "wb");
            fwrite(txa, 1, run, f);
            fclose(f);
            fprintf(stderr, "dump: %zu bytes, ports %u -> %u\n", run, ab.sport, ab.dport);
        }
        xmit(fd_a, 1, txa, run, npkts > 1 ? SEG : 0);

        /* ---- 2. B receives, checks, places, acknowledges */
        size_t got = 0;                 /* packets of this message taken */
        uint64_t moff = 0;              /* SEND: bytes placed so far */
        int done = 0;
        uint32_t ack_psn = 0;
        while (!done) {
            const uint8_t *rb = rxb;
            size_t gro, r = rcv(fd_b, 1, &rb, RXCAP, &gro);
            size_t seg = gro ? gro : r;
            for (size_t o = 0; o < r; o += seg) {
                const uint8_t *p = rb + o;
                size_t pn = r - o < seg ? r - o : seg;
                if (!icrc_ok(&b_rx, p, pn))
                    DIE("B: bad ICRC, message %ld packet %zu", i, got);
                uint32_t w0 = be32(p), w1 = be32(p + 4), w2 = be32(p + 8);
                int opc = w0 >> 24, pad = (w0 >> 20) & 3;
                if ((w0 & 0xFFFF) != PKEY || (w1 & QPN_MASK) != qpn_b
                        || (w1 & (BTH_FECN | BTH_BECN)))
                    DIE("B: header");
                if ((w2 & PSN_MASK) != b_epsn)
                    DIE("B: PSN %u, expected %u", w2 & PSN_MASK, b_epsn);
                if (send) {
                    int want_first = got == 0;
                    int is_first = opc == OP_SEND_FIRST || opc == OP_SEND_ONLY;
                    int is_last = opc == OP_SEND_LAST || opc == OP_SEND_ONLY;
                    if (opc != OP_SEND_FIRST && opc != OP_SEND_MIDDLE && opc != OP_SEND_LAST
                            && opc != OP_SEND_ONLY)
                        DIE("B: opcode %#x", opc);
                    if (want_first != is_first)
                        DIE("B: opcode %#x out of sequence", opc);
                    if (pn < BTH_LEN + pad + ICRC_LEN)
                        DIE("B: short");
                    size_t len = pn - BTH_LEN - pad - ICRC_LEN;
                    if (!is_last && (len != MTU || pad))
                        DIE("B: a FIRST or MIDDLE of %zu bytes", len);
                    if (rq_head == rq_tail)
                        DIE("B: RNR");
                    struct rwqe *wq = &rq_b[rq_head];
                    if (moff + len > wq->len)
                        DIE("B: longer than the receive");
                    memcpy((uint8_t *)(uintptr_t)wq->addr + moff, p + BTH_LEN, len);
                    moff += len;
                    got++;
                    b_epsn = (b_epsn + 1) & PSN_MASK;
                    if (is_last) {
                        if (!(w2 & BTH_ACKREQ))
                            DIE("B: no AckReq on the LAST");
                        cq_b[cq_b_n++] = (struct cqe){ wq->wr_id, 0, 128 /* RECV */,
                                                       (uint32_t)moff, qpn_b, qpn_a, 0 };
                        rq_head++;
                        done = 1;
                        ack_psn = w2 & PSN_MASK;
                    }
                } else {
                    if (opc != OP_WRITE_ONLY)
                        DIE("B: opcode %#x", opc);
                    if (pn < BTH_LEN + RETH_LEN + pad + ICRC_LEN)
                        DIE("B: short");
                    size_t len = pn - BTH_LEN - RETH_LEN - pad - ICRC_LEN;
                    uint64_t va = be64(p + BTH_LEN);
                    uint32_t rk = be32(p + BTH_LEN + 8), dlen = be32(p + BTH_LEN + 12);
                    uintptr_t lo = (uintptr_t)dst, hi = lo + size;
                    if (rk != rkey || dlen != len || va < lo || va > hi || len > hi - va)
                        DIE("B: RETH");
                    memcpy((uint8_t *)(uintptr_t)va, p + BTH_LEN + RETH_LEN, len);
                    got++;
                    b_epsn = (b_epsn + 1) & PSN_MASK;
                    if (!(w2 & BTH_ACKREQ))
                        DIE("B: no AckReq");
                    done = 1;      /* (a WRITE completes nothing at the responder) */
                    ack_psn = w2 & PSN_MASK;
                }
            }
        }
        if (got != npkts)
            DIE("B: %zu packets, expected %zu", got, npkts);
        b_msn = (b_msn + 1) & MSN_MASK;
        put_bth(txb, OP_ACK, 0, qpn_a, ack_psn, 0);
        put_be32(txb + BTH_LEN, (uint32_t)ACK_CREDITS << 24 | b_msn);
        seal(&b_tx, txb, BTH_LEN + AETH_LEN + ICRC_LEN);
        if (i == -warm && getenv("FLOOR_DUMP")) {
            char nm[512];
            snprintf(nm, sizeof nm, "%s.ack", getenv("FLOOR_DUMP"));
            FILE *f = fopen(nm, "wb");
            fwrite(txb, 1, BTH_LEN + AETH_LEN + ICRC_LEN, f);
            fclose(f);
        }
        xmit(fd_b, 0, txb, BTH_LEN + AETH_LEN + ICRC_LEN, 0);

        /* ---- 3. A receives the ACK, checks its ICRC and PSN */
        {
            const uint8_t *ra = rxa;
            size_t gro, r = rcv(fd_a, 0, &ra, RXCAP, &gro);
            if (r != BTH_LEN + AETH_LEN + ICRC_LEN || gro)
                DIE("A: ACK of %zu bytes", r);
            if (!icrc_ok(&a_rx, ra, r))
                DIE("A: bad ICRC on the ACK");
            uint32_t w0 = be32(ra), w1 = be32(ra + 4), w2 = be32(ra + 8);
            uint32_t aeth = be32(ra + BTH_LEN);
            if ((w0 >> 24) != OP_ACK || (w1 & QPN_MASK) != qpn_a)
                DIE("A: not an ACK for its QP");
            if ((w2 & PSN_MASK) != last_psn)
                DIE("A: ACK PSN %u, expected %u", w2 & PSN_MASK, last_psn);
            if ((aeth >> 29) != 0)
                DIE("A: a NAK");
            a_msn = (a_msn + 1) & MSN_MASK;
            if ((aeth & MSN_MASK) != a_msn)
                DIE("A: MSN %u, expected %u", aeth & MSN_MASK, a_msn);
            /* ---- 4. the message complete: the requester's CQE */
            cq_a[cq_a_n++] = (struct cqe){ (uint64_t)i, 0, send ? 0 : 1, (uint32_t)size,
                                           qpn_a, 0, 0 };
        }
        if (memcmp(dst, &stamp, 4) || (size >= 8 && memcmp(dst + size - 4, &stamp, 4)))
            DIE("message %ld: the bytes that landed are not this message's", i);
    }
    double c1 = cpu_s(), w1 = now_s();
    getrusage(RUSAGE_SELF, &ru1);
    if (memcmp(dst, src, size))
        DIE("FAIL: destination differs from source");
    if (cq_a_n != total || cq_b_n != (send ? total : 0))
        DIE("FAIL: completions %ld %ld", cq_a_n, cq_b_n);
    printf("floor %s %zu: %ld messages, cpu_us %.3f wall_us %.3f user_us %.3f sys_us %.3f"
           " eagain_per_msg %.3f crc %s%s\n", op, size, n, (c1 - c0) / n * 1e6,
           (w1 - w0) / n * 1e6, (tv_s(ru1.ru_utime) - tv_s(ru0.ru_utime)) / n * 1e6,
           (tv_s(ru1.ru_stime) - tv_s(ru0.ru_stime)) / n * 1e6,
           (double)(n_eagain - eagain0) / n, crc_isal ? "isa-l" : "zlib",
           nosock ? " nosock" : "");
    (void)poll0;
    return 0;
}
