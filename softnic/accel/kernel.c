/* softnic's per-packet kernel: the inner loops of the bulk data path, for the
   packets that make up nearly all of a large SEND, WRITE or READ (MIDDLEs), and
   the answer to a READ or an ATOMIC (a latency test's whole exchange; a READ
   of many packets as its responses leave).

   No protocol rule lives here.  Each function is a faster way through a rule
   the engine states once, for a run of packets (or one request), and stops,
   leaving the rest to the engine, at the first packet the rule's common case
   does not cover:

     sn_tx_middles   requester._send_packet / _build for a MIDDLE (BTH, AckReq
                     every ack_every packets, payload, ICRC), called by
                     requester.middle_run, the one builder of a run of a
                     message's MIDDLEs: a SEND's or WRITE's (requester._bulk),
                     a READ's RESPONSE MIDDLEs (output._read_run, encode's
                     bytes, AckReq never set); sn_tx_heads, the same but the
                     payload, which the driver gathers from memory as it sends;
     sn_rx_middles   responder.execute's early exit for a SEND or WRITE MIDDLE
                     at the ePSN (sequence, size, room in
                     responder.message_target, placement, the ACK its AckReq
                     asks for), under the conditions of the comment
                     COMMON_CASE in responder.py: the QP's are checked by its
                     caller, responder.receive_middles, each packet's here;
                     and, with selective repeat, responder._hold_placed_write
                     for a run of MIDDLEs beyond a hole (responder.
                     _middles_beyond: the PSNs from the run's first on, room
                     up to the WRITE's LAST, no byte a newer PSN placed);
                     and completer._read_response for READ RESPONSE MIDDLEs
                     at the expected PSN (completer.receive_middles: the
                     READ's one SGE, room up to its LAST);
     sn_rx_edge      completer.receive_answer_common and _read_response for
                     the READ RESPONSE FIRST or LAST around those MIDDLEs
                     (completer.receive_edge: the READ's one SGE, the
                     payload its place expects, the AETH an ACK); and
                     responder.execute (_send) for a SEND's FIRST or LAST
                     at the ePSN (responder.receive_edge: into its receive
                     WQE's one SGE, room for what the packet carries; and
                     responder.receive_send_run, a SEND's FIRST and LAST
                     around its MIDDLEs in one run, with sn_rx_middles: the
                     three in one call, sn_rx_send_run);
     sn_read_only    responder.answer and _read for an RDMA READ request at the
                     ePSN whose response is one packet, and
                     output._rc_responses' read_response_only (and
                     append_icrc) for that READ RESPONSE ONLY, under the
                     conditions of COMMON_CASE and responder.answer_target;
     sn_read_run     the same for a READ whose responses are more than one
                     packet, and output._read_run for them (its FIRST and LAST
                     by _aeth_packet, its MIDDLEs by requester.middle_run:
                     sn_tx_heads' headers, the payload left in memory);
     sn_atomic_ack   the same for an ATOMIC (responder._atomic, then
                     atomic_ack_packet for its ATOMIC ACKNOWLEDGE).

   The caller accounts for the packets taken with the count returned, through
   the same rule functions (responder.accept, the AckReq count; for READs
   and ATOMICs answered, responder.took_answers).  The
   differential tests (tests/test_kernel.py) compare both against the engine's
   general path, byte for byte.

   CRC-32 (the IEEE polynomial, zlib's crc32 with its pre- and post-inversion):
   a function found at run time (ISA-L's crc32_gzip_refl, or zlib's crc32), or
   a table here if there is none. */
#include <stdint.h>
#include <string.h>

/* BTH_LEN, ICRC_LEN, PSN_MASK, QPN_MASK, BTH_FECN, BTH_BECN, BTH_ACKREQ, and
   sn_rx_edge's EXT_AETH and EXT_TAIL: wire.h */
#define ZLIB_CHUNK 0x40000000u     /* the most bytes one call of zlib's crc32 is given */

typedef uint32_t (*crc_isal_fn)(uint32_t, const unsigned char *, uint64_t);
typedef unsigned long (*crc_zlib_fn)(unsigned long, const unsigned char *, unsigned int);

static crc_isal_fn crc_isal;
static crc_zlib_fn crc_zlib;
static uint32_t table[256];
static int table_ready;

/* kind 1: ISA-L's crc32_gzip_refl; 2: zlib's crc32; 0: the table here.  The
   table is built on the first call whatever the kind, and a new function is
   set before the other is cleared: a call running meanwhile in another thread
   computes the same CRC by one or the other. */
int sn_set_crc(uintptr_t fn, int kind)
{
    if (!table_ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        table_ready = 1;
    }
    if (kind == 1 && fn) {
        crc_isal = (crc_isal_fn)fn;
        crc_zlib = 0;
    } else if (kind == 2 && fn) {
        crc_zlib = (crc_zlib_fn)fn;
        crc_isal = 0;
    } else {
        crc_isal = 0;
        crc_zlib = 0;
    }
    return crc_isal ? 1 : crc_zlib ? 2 : 0;
}

/* wire.icrc.crc32 (zlib's crc32: the ICRC's CRC-32), for the loops here and
   for Python, which checks it against zlib.crc32 when it loads (accel._choose_crc). */
uint32_t sn_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
    if (crc_isal)
        return crc_isal(crc, p, n);
    if (crc_zlib) {
        while (n > ZLIB_CHUNK) {
            crc = (uint32_t)crc_zlib(crc, p, ZLIB_CHUNK);
            p += ZLIB_CHUNK;
            n -= ZLIB_CHUNK;
        }
        return (uint32_t)crc_zlib(crc, p, (unsigned int)n);
    }
    crc = ~crc;
    while (n--)
        crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* Receive (responder.execute's early exit for a run of MIDDLEs;
   responder.receive_middles calls it): the datagrams laid end to end in
   buf[0:n] (each seg bytes, the last maybe shorter), from offset o on, are
   taken while each is the next MIDDLE of the SEND or WRITE being received,
   that is while each meets COMMON_CASE's per-packet conditions:
     - seg bytes whole: a full MTU of payload (seg = BTH + MTU + ICRC), no pad;
     - BTH word 0 equal to w0 (the opcode, flags and P_Key the ICRC state
       ``start`` was computed for);
     - the destination QP dqpn, FECN and BECN clear;
     - the expected PSN;
     - room in the target: off + MTU <= len;
     - a good ICRC (``start``: the state after the pseudo header and the BTH's
       first 8 bytes, icrc_start, which covers w0 and dqpn).
   Each is copied to dst + off.  At most max packets are taken.  A packet with
   AckReq set is taken only with room in ``acks`` (cap entries): its index in
   the run goes there, for Python to queue its ACK as accept does (with cap 0,
   the run stops before it).  Returns how many; *nacks is how many of them
   asked for an ACK; Python accounts for them (epsn, write offset, counters,
   the ACKs).  completer.receive_middles calls it too, for a run of READ
   RESPONSE MIDDLEs (completer._read_response at the expected PSN; the READ's
   SGE as dst, room up to its LAST): a response's AckReq bit asks for nothing,
   and its indexes are not used. */
int sn_rx_middles(const uint8_t *buf, size_t n, size_t o, size_t seg, uint32_t w0,
                  uint32_t dqpn, uint32_t epsn, uint32_t start, uint8_t *dst,
                  uint64_t off, uint64_t len, uint32_t max, uint32_t *acks,
                  uint32_t cap, uint32_t *nacks)
{
    size_t mtu = seg - BTH_LEN - ICRC_LEN;
    uint32_t k = 0, a = 0;
    if (nacks)
        *nacks = 0;
    if (seg <= BTH_LEN + ICRC_LEN)
        return 0;
    while (k < max && o + seg <= n) {
        const uint8_t *p = buf + o;
        uint32_t w2 = be32(p + 4), w3 = be32(p + 8);
        if (be32(p) != w0 || (w2 & QPN_MASK) != dqpn || (w2 & (BTH_FECN | BTH_BECN))
                || (w3 & PSN_MASK) != epsn || off + mtu > len
                || ((w3 & BTH_ACKREQ) && a >= cap))
            break;
        if (sn_crc32(start, p + 8, seg - 8 - ICRC_LEN) != le32(p + seg - ICRC_LEN))
            break;
        memcpy(dst + off, p + BTH_LEN, mtu);
        if (w3 & BTH_ACKREQ)
            acks[a++] = k;
        off += mtu;
        epsn = (epsn + 1) & PSN_MASK;
        o += seg;
        k++;
    }
    if (nacks)
        *nacks = a;
    return (int)k;
}

/* Receive one packet of a message at its place, the edges around a run of
   MIDDLEs (sn_rx_middles): a READ RESPONSE FIRST or LAST for
   completer._read_response at the expected PSN (completer.receive_edge calls
   it, ``ext`` EXT_AETH), or a SEND FIRST or LAST for responder.execute (_send)
   at the ePSN (responder.receive_edge and receive_send_run, ``ext`` 0, or
   EXT_TAIL for a LAST with an immediate or an IETH).  The datagram p[0:n] is
   taken if it meets the per-packet conditions of the caller's rule (those of
   the QP and the message are the caller's):
     - BTH word 0 equal to w0 (the opcode; no flag but the pad count that
       ``len`` implies, and for a SEND the SE bit the packet has; the P_Key:
       what the ICRC state ``start`` was computed for);
     - the destination QP dqpn, FECN and BECN clear;
     - the expected PSN;
     - with EXT_AETH, an AETH whose syndrome is an ACK (its top three bits
       clear: the credit count and MSN are not the requester's to check);
       with EXT_TAIL, 4 bytes of ImmDt or IETH (what they hold is the
       caller's to read, once the packet is taken);
     - n = BTH (+ AETH, ImmDt or IETH) + len + pad + ICRC: the payload its
       place expects (a whole MTU for a FIRST, the rest of a READ for its
       LAST, what a SEND's LAST carries), and room for it: off + len <= cap;
     - a good ICRC.
   Its payload is copied to dst + off.  Returns 1 if taken, else 0 (nothing
   touched); the caller accounts for it as the rule does (completer.
   took_responses; responder.took_send_edge, took_send_run). */
int sn_rx_edge(const uint8_t *p, size_t n, uint32_t w0, uint32_t dqpn, uint32_t epsn,
               uint32_t start, int ext, uint8_t *dst, uint64_t off, uint64_t len,
               uint64_t cap)
{
    uint64_t pad = (0 - len) & 3;
    /* (an IETH is as long as an ImmDt) */
    size_t hdr = BTH_LEN + (ext == EXT_AETH ? AETH_LEN : ext == EXT_TAIL ? IMMDT_LEN : 0);
    uint32_t w2, w3;
    if ((ext != 0 && ext != EXT_AETH && ext != EXT_TAIL) || n < hdr + ICRC_LEN
            || (uint64_t)n != hdr + len + pad + ICRC_LEN || off > cap || len > cap - off)
        return 0;
    w2 = be32(p + 4);
    w3 = be32(p + 8);
    if (be32(p) != w0 || (w2 & QPN_MASK) != dqpn || (w2 & (BTH_FECN | BTH_BECN))
            || (w3 & PSN_MASK) != epsn
            || (ext == EXT_AETH && (be32(p + BTH_LEN) >> 29) != 0))
        return 0;
    if (sn_crc32(start, p + 8, n - 8 - ICRC_LEN) != le32(p + n - ICRC_LEN))
        return 0;
    memcpy(dst + off, p + hdr, (size_t)len);
    return 1;
}

/* Receive (responder.receive_send_run): a run of datagrams laid end to end in
   buf[0:n] (each seg bytes, the last maybe shorter) that begins at offset o
   with a SEND's FIRST, taken by the three calls that take its packets alone,
   in one: sn_rx_edge for the FIRST (seg bytes; BTH word 0 first_w0, ICRC state
   first_start; its mtu bytes to dst + 0), sn_rx_middles for the MIDDLEs after
   it up to last_at, or to n if last_at is 0 (word 0 mid_w0, state mid_start,
   from dst + mtu on, none past room; acks, cap and *nacks as there), and, if
   they end at last_at (not 0), sn_rx_edge for the LAST there (n - last_at
   bytes; word 0 last_w0, state last_start, ext 0 or EXT_TAIL; its last_len
   bytes after the MIDDLEs').  Each packet under the conditions of the call
   that takes it; none is taken after one refused.  Returns -1 if the FIRST is
   not taken (nothing touched), else 2 * (the MIDDLEs taken) + (1 if the LAST
   was). */
int sn_rx_send_run(const uint8_t *buf, size_t n, size_t o, size_t seg, uint32_t qpn,
                   uint32_t epsn, uint32_t first_w0, uint32_t first_start, uint32_t mid_w0,
                   uint32_t mid_start, size_t last_at, uint32_t last_w0, uint32_t last_start,
                   int ext, uint64_t last_len, uint8_t *dst, uint64_t room, uint32_t *acks,
                   uint32_t cap, uint32_t *nacks)
{
    uint64_t mtu;
    int m;
    *nacks = 0;
    if (seg <= BTH_LEN + ICRC_LEN || o + seg > n
            || (last_at && (last_at < o + seg || last_at > n)))
        return -1;
    mtu = seg - BTH_LEN - ICRC_LEN;
    if (!sn_rx_edge(buf + o, seg, first_w0, qpn, epsn, first_start, 0, dst, 0, mtu, room))
        return -1;
    m = sn_rx_middles(buf, last_at ? last_at : n, o + seg, seg, mid_w0, qpn,
                      (epsn + 1) & PSN_MASK, mid_start, dst, mtu, room, 0xFFFFFFFFu, acks, cap,
                      nacks);
    if (last_at && last_at == o + (1 + (size_t)m) * seg
            && sn_rx_edge(buf + last_at, n - last_at, last_w0, qpn,
                          (epsn + 1 + (uint32_t)m) & PSN_MASK, last_start, ext, dst,
                          (1 + (uint64_t)m) * mtu, last_len, room))
        return 2 * m + 1;
    return 2 * m;
}

/* A MIDDLE's BTH at p: word 0 w0, destination QP dqpn, PSN psn, and the AckReq
   bit as requester._send_packet sets it, when the count s of packets since the
   last that asked reaches ack_every.  Returns the count after this packet. */
static inline uint32_t put_middle_bth(uint8_t *p, uint32_t w0, uint32_t dqpn, uint32_t psn,
                                      uint32_t s, uint32_t ack_every)
{
    uint32_t w3 = psn & PSN_MASK;
    if (++s >= ack_every) {
        s = 0;
        w3 |= BTH_ACKREQ;
    }
    put_be32(p, w0);
    put_be32(p + 4, dqpn & QPN_MASK);
    put_be32(p + 8, w3);
    return s;
}

/* Send (requester._send_packet and _build for a run of MIDDLEs;
   requester.middle_run calls it, for a request's MIDDLEs or a READ's RESPONSE
   MIDDLEs): count MIDDLE packets built into buf from offset o on, one after
   another (BTH, an MTU of payload from src, ICRC): BTH word 0 w0, destination
   QP dqpn, PSNs from psn on.  The AckReq bit follows the requester's count s
   of packets since the last one that asked: set when s reaches ack_every.
   ``start`` is the ICRC state after the pseudo header and the BTH's first 8
   bytes' invariant part (icrc_start).  Returns the count s after them. */
uint32_t sn_tx_middles(uint8_t *buf, size_t o, uint32_t count, uint32_t w0, uint32_t dqpn,
                       uint32_t psn, uint32_t s, uint32_t ack_every, const uint8_t *src,
                       size_t mtu, uint32_t start)
{
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *p = buf + o;
        s = put_middle_bth(p, w0, dqpn, psn, s, ack_every);
        memcpy(p + BTH_LEN, src, mtu);
        put_le32(p + BTH_LEN + mtu, sn_crc32(start, p + 8, 4 + mtu));
        src += mtu;
        psn = (psn + 1) & PSN_MASK;
        o += BTH_LEN + mtu + ICRC_LEN;
    }
    return s;
}

/* Send without copying the payload (requester.middle_run, for a request's
   MIDDLEs or a READ's RESPONSE MIDDLEs, with a driver that gathers,
   ``Device.tx_gather``): of count MIDDLE packets, what sn_tx_middles builds but
   the payload, 16 bytes a packet in heads: the BTH (12 bytes, AckReq as there)
   and the ICRC (4), computed over the payload where it lies, src (an MTU a
   packet, one after another).  The driver sends each packet as its BTH, its
   MTU of src and its ICRC, gathered (sn_send_gather).  Returns the count s
   after them. */
uint32_t sn_tx_heads(uint8_t *heads, uint32_t count, uint32_t w0, uint32_t dqpn,
                     uint32_t psn, uint32_t s, uint32_t ack_every, const uint8_t *src,
                     size_t mtu, uint32_t start)
{
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *p = heads + 16 * (size_t)i;
        s = put_middle_bth(p, w0, dqpn, psn, s, ack_every);
        put_le32(p + BTH_LEN, sn_crc32(sn_crc32(start, p + 8, 4), src, mtu));
        src += mtu;
        psn = (psn + 1) & PSN_MASK;
    }
    return s;
}

/* A request the kernel answers, as its BTH and ICRC must be (sn_read_only,
   sn_atomic_ack): want bytes (BTH, its extended header, ICRC: no payload, no
   pad), BTH word 0 w0 (the opcode, flags and P_Key the ICRC state req_start was
   computed for), the destination QP qpn with FECN and BECN clear, the PSN
   epsn, a good ICRC. */
static int sn_request_at(const uint8_t *req, size_t n, size_t want, uint32_t w0,
                         uint32_t qpn, uint32_t epsn, uint32_t req_start)
{
    uint32_t w2, w3;
    if (n != want)
        return 0;
    w2 = be32(req + 4);
    w3 = be32(req + 8);
    if (be32(req) != w0 || (w2 & QPN_MASK) != qpn || (w2 & (BTH_FECN | BTH_BECN))
            || (w3 & PSN_MASK) != epsn)
        return 0;
    return sn_crc32(req_start, req + 8, n - 8 - ICRC_LEN) == le32(req + n - ICRC_LEN);
}

/* A response's BTH (word 0 resp_w0, destination QP dqpn, PSN psn, AckReq clear)
   and AETH (aeth) at resp; the ICRC, from resp_start over resp[8:len], after
   its len bytes (sn_read_only, sn_atomic_ack). */
static inline void sn_response_head(uint8_t *resp, uint32_t resp_w0, uint32_t dqpn,
                                    uint32_t psn, uint32_t aeth)
{
    put_be32(resp, resp_w0);
    put_be32(resp + 4, dqpn & QPN_MASK);
    put_be32(resp + 8, psn & PSN_MASK);
    put_be32(resp + BTH_LEN, aeth);
}

static inline size_t sn_response_seal(uint8_t *resp, size_t len, uint32_t resp_start)
{
    put_le32(resp + len, sn_crc32(resp_start, resp + 8, len - 8));
    return len + ICRC_LEN;
}

static inline uint64_t be64(const uint8_t *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

/* An RDMA READ request the kernel answers (sn_read_only, sn_read_run): as
   sn_request_at says for BTH + RETH + ICRC bytes, its RETH's R_Key rkey and
   DMA length length, its VA (*va) such that [VA, VA + length) lies within
   [lo, hi) (else the engine NAKs it: REMOTE ACCESS ERROR). */
static int sn_read_at(const uint8_t *req, size_t n, uint32_t w0, uint32_t qpn, uint32_t epsn,
                      uint32_t req_start, uint32_t rkey, uint32_t length, uint64_t lo,
                      uint64_t hi, uint64_t *va)
{
    if (hi < lo
            || !sn_request_at(req, n, BTH_LEN + RETH_LEN + ICRC_LEN, w0, qpn, epsn, req_start))
        return 0;
    *va = be64(req + BTH_LEN);
    return be32(req + BTH_LEN + 8) == rkey && be32(req + BTH_LEN + 12) == length
        && *va >= lo && *va <= hi && hi - *va >= length;
}

/* Answer (responder.answer and _read, for an RDMA READ request at the ePSN,
   then output._rc_responses' read_response_only and append_icrc for its one
   response): the request in req[0:n] is taken if it meets COMMON_CASE's
   per-packet conditions and answer_target's for the READ (the QP's are checked
   by the caller, responder.answer_target, once per call):
     - n == BTH + RETH + ICRC: no payload, no pad;
     - BTH word 0 equal to w0 (the opcode, flags and P_Key the ICRC state
       req_start was computed for: icrc_start of the request);
     - the destination QP qpn, FECN and BECN clear, the PSN epsn;
     - a good ICRC;
     - the RETH's R_Key rkey and DMA length length (answer_target's: an MR of the
       QP's PD with remote read, its bytes lo .. hi at mem, and a length of one
       packet at most, not 0), its VA such that [VA, VA + length) lies within
       [lo, hi) (else the engine NAKs it: REMOTE ACCESS ERROR).
   The READ RESPONSE ONLY goes to resp: BTH word 0 resp_w0 (its opcode, pad
   count and P_Key), destination QP dqpn, the request's PSN, AckReq clear;
   AETH aeth (the syndrome and the MSN after this READ); the length bytes read
   at VA; zero pad; the ICRC from resp_start (icrc_start of the response: its
   pseudo header depends on its length, which length fixes).  Returns the
   response's length, or 0 (resp untouched) if the request is not taken. */
size_t sn_read_only(const uint8_t *req, size_t n, uint32_t w0, uint32_t qpn, uint32_t epsn,
                    uint32_t req_start, uint32_t rkey, uint32_t length, uint64_t lo,
                    uint64_t hi, const uint8_t *mem, uint32_t resp_w0, uint32_t dqpn,
                    uint32_t aeth, uint32_t resp_start, uint8_t *resp)
{
    uint32_t pad = -length & 3u;
    uint64_t va;
    if (length == 0
            || !sn_read_at(req, n, w0, qpn, epsn, req_start, rkey, length, lo, hi, &va))
        return 0;
    sn_response_head(resp, resp_w0, dqpn, epsn, aeth);
    memcpy(resp + BTH_LEN + AETH_LEN, mem + (va - lo), length);
    memset(resp + BTH_LEN + AETH_LEN + length, 0, pad);
    return sn_response_seal(resp, BTH_LEN + AETH_LEN + (size_t)length + pad, resp_start);
}

/* Answer (responder.answer and _read, for an RDMA READ request at the ePSN
   whose responses are npkts = ceil(length / mtu) > 1 packets, then
   output._read_run for them): the request is taken under sn_read_only's
   conditions, but for its length: more than mtu (mtu > 0, a multiple of 4), and
   no more than max_middles MIDDLEs (npkts - 2) (the caller's room in heads).
   Its responses, as output._read_run builds them, from the request's PSN on:
     - the READ RESPONSE FIRST to first, whole: BTH word 0 first_w0, destination
       QP dqpn, AETH aeth (the syndrome and the MSN after this READ), mtu bytes
       from VA, the ICRC from first_start (BTH + AETH + mtu + ICRC bytes);
     - the npkts - 2 RESPONSE MIDDLEs as sn_tx_heads gives them (AckReq never
       set: a response never asks), 16 bytes each in heads, word 0 mid_w0, ICRC
       state mid_start; their payload the mtu bytes each at VA + mtu on, where
       they lie: mem + *at + mtu (the driver gathers them as it sends);
     - the READ RESPONSE LAST to last, whole: word 0 last_w0 (its pad count
       in it), the AETH again, the length - (npkts - 1) mtu bytes left, zero
       pad, the ICRC from last_start.
   *at is the VA's offset in mem.  Returns the LAST's length, or 0 (nothing
   written) if the request is not taken. */
size_t sn_read_run(const uint8_t *req, size_t n, uint32_t w0, uint32_t qpn, uint32_t epsn,
                   uint32_t req_start, uint32_t rkey, uint32_t length, uint64_t lo,
                   uint64_t hi, const uint8_t *mem, uint32_t mtu, uint32_t first_w0,
                   uint32_t mid_w0, uint32_t last_w0, uint32_t dqpn, uint32_t aeth,
                   uint32_t first_start, uint32_t mid_start, uint32_t last_start,
                   uint32_t max_middles, uint8_t *first, uint8_t *heads, uint8_t *last,
                   uint64_t *at)
{
    uint64_t va, o, npkts, rem;
    uint32_t pad;
    if (mtu == 0 || (mtu & 3) || length <= mtu)
        return 0;
    npkts = ((uint64_t)length + mtu - 1) / mtu;
    if (npkts - 2 > max_middles
            || !sn_read_at(req, n, w0, qpn, epsn, req_start, rkey, length, lo, hi, &va))
        return 0;
    o = va - lo;
    sn_response_head(first, first_w0, dqpn, epsn, aeth);
    memcpy(first + BTH_LEN + AETH_LEN, mem + o, mtu);
    sn_response_seal(first, BTH_LEN + AETH_LEN + (size_t)mtu, first_start);
    sn_tx_heads(heads, (uint32_t)(npkts - 2), mid_w0, dqpn, (epsn + 1) & PSN_MASK, 0,
                0xFFFFFFFFu, mem + o + mtu, mtu, mid_start);
    rem = length - (npkts - 1) * mtu;
    pad = -(uint32_t)rem & 3u;
    sn_response_head(last, last_w0, dqpn, (uint32_t)((epsn + npkts - 1) & PSN_MASK), aeth);
    memcpy(last + BTH_LEN + AETH_LEN, mem + o + (npkts - 1) * mtu, rem);
    memset(last + BTH_LEN + AETH_LEN + rem, 0, pad);
    *at = o;
    return sn_response_seal(last, BTH_LEN + AETH_LEN + (size_t)rem + pad, last_start);
}

/* Answer (responder.answer and _atomic, for an ATOMIC at the ePSN, then
   output.atomic_ack_packet and append_icrc for its ATOMIC ACKNOWLEDGE): the
   request in req[0:n] is taken under the conditions sn_read_only states, for
   an ATOMIC: n == BTH + AtomicETH + ICRC; BTH word 0 w0 (FETCH_ADD, or
   COMPARE_SWAP: compare_swap); the AtomicETH's R_Key rkey, its VA 8-byte
   aligned (else the engine NAKs it: INVALID REQUEST) and its 8 bytes within
   [lo, hi) (answer_target's: an MR of the QP's PD with remote atomics, its
   bytes lo .. hi at mem).  The 8 bytes at VA, in the host's byte order as
   _atomic reads them, are *orig; COMPARE_SWAP writes the swap value there if
   they equal the compare value, FETCH_ADD their sum with the add value (mod
   2**64).  The ATOMIC ACKNOWLEDGE goes to resp: BTH word 0 resp_w0,
   destination QP dqpn, the request's PSN; AETH aeth; the original value (big
   endian); the ICRC from resp_start.  Returns its length, or 0 (nothing
   written, memory untouched) if the request is not taken. */
size_t sn_atomic_ack(const uint8_t *req, size_t n, uint32_t w0, uint32_t qpn, uint32_t epsn,
                     uint32_t req_start, uint32_t rkey, int compare_swap, uint64_t lo,
                     uint64_t hi, uint8_t *mem, uint32_t resp_w0, uint32_t dqpn,
                     uint32_t aeth, uint32_t resp_start, uint8_t *resp, uint64_t *orig)
{
    const uint8_t *e = req + BTH_LEN;
    uint64_t va, o, v;
    if (hi < lo
            || !sn_request_at(req, n, BTH_LEN + ATOMICETH_LEN + ICRC_LEN, w0, qpn, epsn,
                              req_start))
        return 0;
    va = be64(e);
    if (be32(e + 8) != rkey || (va & 7) || va < lo || va > hi || hi - va < 8)
        return 0;
    memcpy(&o, mem + (va - lo), 8);
    if (compare_swap) {
        if (o == be64(e + 20)) {
            v = be64(e + 12);
            memcpy(mem + (va - lo), &v, 8);
        }
    } else {
        v = o + be64(e + 12);
        memcpy(mem + (va - lo), &v, 8);
    }
    *orig = o;
    sn_response_head(resp, resp_w0, dqpn, epsn, aeth);
    put_be32(resp + BTH_LEN + AETH_LEN, (uint32_t)(o >> 32));
    put_be32(resp + BTH_LEN + AETH_LEN + 4, (uint32_t)o);
    return sn_response_seal(resp, BTH_LEN + AETH_LEN + ATOMICACKETH_LEN, resp_start);
}
