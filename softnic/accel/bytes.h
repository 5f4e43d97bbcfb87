/* Byte order on the wire, for the kernel (kernel.c) and the compiled requester
   (requester.c): 32-bit words big-endian (the BTH and its extensions) and
   little-endian (the ICRC as RoCEv2 carries it). */

#ifndef SOFTNIC_BYTES_H
#define SOFTNIC_BYTES_H

#include <stdint.h>

static inline uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static inline void put_be64(uint8_t *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* BTH word 0 (softnic.wire.roce.bth_word0): the opcode, the flags byte (SE, MigReq,
   PadCnt, TVer) and the P_Key */
static inline uint32_t bth_word0(uint32_t op, uint32_t flags, uint32_t pkey)
{
    return op << 24 | flags << 16 | pkey;
}

/* A BTH (IBA 9.2) at p, its three words big-endian: word 0, the destination QP
   (FECN and BECN clear), and AckReq with the PSN */
static inline void bth_put(uint8_t *p, uint32_t w0, uint32_t dqpn, uint32_t w2)
{
    put_be32(p, w0);
    put_be32(p + 4, dqpn);
    put_be32(p + 8, w2);
}

static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

static inline void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24;
}

#endif
