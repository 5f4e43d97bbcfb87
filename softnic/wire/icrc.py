"""The RoCEv2 invariant CRC (IBA Annex A17, over IPv4/UDP and IPv6/UDP).

The ICRC is a CRC-32 (the Ethernet polynomial, as zlib computes it) over
a pseudo packet:

    8 bytes of 0xFF                      (stands in for the IB LRH)
    the IP header, its variant fields set to all ones:
      IPv4: TOS, TTL and the header checksum
      IPv6: traffic class, flow label and hop limit
    UDP header, with the checksum set to all ones
    BTH, with byte 4 (FECN, BECN, resv6) set to all ones
    the rest of the transport packet (extended headers, payload, pad)

and is carried after the pad, least significant byte first.  These are the
fields a router may rewrite (ECN in TOS or traffic class, TTL or hop limit,
the checksums, FECN/BECN), so the ICRC stays invariant end to end.

The family follows the addresses: an address with a colon is IPv6.  softnic's
devices sit on UDP sockets and never see the IP header the kernel writes, so
both ends reconstruct a canonical one: for IPv4 version 4, IHL 5,
identification 0, DF set, protocol UDP; for IPv6 no extension headers (next
header UDP).  The capture writer emits exactly that header, so captured
packets verify with any decoder.
"""

from __future__ import annotations

import socket
import struct

try:  # ISA-L computes the same CRC-32 about 4x faster than zlib
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a declared dependency
    from zlib import crc32

from .roce import BTH_LEN, ICRC_LEN

__all__ = ["ipv4_udp_headers", "ipv6_udp_headers", "ip_udp_headers", "icrc", "icrc_start", "append_icrc", "check_icrc", "IP_DF"]

IP_DF = 0x4000
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_IPV6 = struct.Struct("!IHBB16s16s")      # version/class/flow, payload length, next, hops
_UDP = struct.Struct("!HHHH")
_LRH_ONES = b"\xff" * 8
_BYTE4_ONES = b"\xff"
_W0 = struct.Struct("!I")           # BTH bytes 0-3: opcode, flags, P_Key
_ICRC = struct.Struct("<I")
#: the most entries a memo of pseudo headers or ICRC states keeps; past it, it
#: starts again (these caches', and a device's: ``responder.rx_icrc_start``,
#: ``requester.tx_icrc_start``)
MEMO_MAX = 4096
_cache: dict[tuple, bytes] = {}
#: (src_ip, dst_ip, sport, dport, roce_len, BTH bytes 0-3 as a big-endian word)
#: -> the CRC state after the pseudo header, those bytes and the masked byte 4;
#: (..., roce_len, BTH bytes 0-7) -> the state after byte 7 (``icrc_start``)
_start_cache: dict[tuple, int] = {}


def ipv4_udp_headers(src_ip: str, dst_ip: str, sport: int, dport: int, roce_len: int,
                     *, tos: int = 0, ttl: int = 64, ident: int = 0) -> bytes:
    """The 28-byte IPv4 + UDP header for a RoCE packet of ``roce_len`` bytes
    (BTH through ICRC), with a valid IP checksum and UDP checksum 0."""
    total = 20 + 8 + roce_len
    hdr = bytearray(_IPV4.pack(0x45, tos, total, ident, IP_DF, ttl, socket.IPPROTO_UDP, 0,
                               socket.inet_aton(src_ip), socket.inet_aton(dst_ip)))
    s = sum(struct.unpack("!10H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    struct.pack_into("!H", hdr, 10, ~s & 0xFFFF)
    return bytes(hdr) + _UDP.pack(sport, dport, 8 + roce_len, 0)


def ipv6_udp_headers(src_ip: str, dst_ip: str, sport: int, dport: int,
                     roce: bytes | bytearray | memoryview, *, traffic_class: int = 0,
                     flow_label: int = 0, hop_limit: int = 64) -> bytes:
    """The 48-byte IPv6 + UDP header for the RoCE packet ``roce`` (BTH through
    ICRC), with its UDP checksum (which IPv6 makes mandatory, RFC 8200 8.1)."""
    src, dst = socket.inet_pton(socket.AF_INET6, src_ip), socket.inet_pton(socket.AF_INET6, dst_ip)
    n = 8 + len(roce)
    ip6 = _IPV6.pack((6 << 28) | (traffic_class << 20) | flow_label, n, socket.IPPROTO_UDP,
                     hop_limit, src, dst)
    # the one's-complement sum of 16-bit words is the big number they spell modulo
    # 0xFFFF (2**16 is 1 modulo 0xFFFF); the pseudo header is RFC 8200 8.1's
    words = src + dst + struct.pack("!IxxxB", n, socket.IPPROTO_UDP) + _UDP.pack(
        sport, dport, n, 0) + bytes(roce) + b"\0" * (len(roce) & 1)
    s = int.from_bytes(words, "big") % 0xFFFF
    csum = (~s & 0xFFFF) or 0xFFFF
    return ip6 + _UDP.pack(sport, dport, n, csum)


def ip_udp_headers(src_ip: str, dst_ip: str, sport: int, dport: int,
                   roce: bytes | bytearray | memoryview) -> bytes:
    """The IPv4 or IPv6 (by the addresses) and UDP header softnic writes for the RoCE
    packet ``roce`` (the header the ICRC's pseudo header masks)."""
    if ":" in src_ip:
        return ipv6_udp_headers(src_ip, dst_ip, sport, dport, roce)
    return ipv4_udp_headers(src_ip, dst_ip, sport, dport, len(roce))


def _pseudo(src_ip: str, dst_ip: str, sport: int, dport: int, roce_len: int) -> bytes:
    key = (src_ip, dst_ip, sport, dport, roce_len)
    p = _cache.get(key)
    if p is None:
        if ":" in src_ip:
            ip = _IPV6.pack(0x6FFFFFFF, 8 + roce_len, socket.IPPROTO_UDP, 0xFF,
                            socket.inet_pton(socket.AF_INET6, src_ip),
                            socket.inet_pton(socket.AF_INET6, dst_ip))
        else:
            ip = _IPV4.pack(0x45, 0xFF, 20 + 8 + roce_len, 0, IP_DF, 0xFF, socket.IPPROTO_UDP,
                            0xFFFF, socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
        p = _LRH_ONES + ip + _UDP.pack(sport, dport, 8 + roce_len, 0xFFFF)
        if len(_cache) > MEMO_MAX:
            _cache.clear()
        _cache[key] = p
    return p


def _start(key: tuple) -> int:
    """The ``_start_cache`` entry for ``key`` (computed on a miss)."""
    c = _start_cache.get(key)
    if c is None:
        c = crc32(_pseudo(*key[:5]))
        c = crc32(_W0.pack(key[5]), c)
        c = crc32(_BYTE4_ONES, c)
        if len(_start_cache) > MEMO_MAX:
            _start_cache.clear()
        _start_cache[key] = c
    return c


def icrc_start(src_ip: str, dst_ip: str, sport: int, dport: int, roce_len: int,
               head: bytes) -> int:
    """CRC state after the pseudo header and the first 8 bytes of a BTH, ``head``
    (opcode, flags, P_Key, the FECN/BECN byte, destination QP), byte 4 masked
    whatever it holds.

    The ICRC of a packet of ``roce_len`` bytes (BTH .. ICRC) whose BTH begins
    with ``head`` is ``crc32(pkt[8:-4], start)``: a sender of many packets that
    differ only from byte 8 on (AckReq, PSN, payload) pays for the rest once."""
    key = (src_ip, dst_ip, sport, dport, roce_len, head)
    c = _start_cache.get(key)
    if c is None:
        c = crc32(head[5:8], _start((src_ip, dst_ip, sport, dport, roce_len,
                                     _W0.unpack_from(head)[0])))
        if len(_start_cache) > MEMO_MAX:
            _start_cache.clear()
        _start_cache[key] = c
    return c


def icrc(pkt: bytes | bytearray | memoryview, src_ip: str, dst_ip: str, sport: int,
         dport: int) -> int:
    """ICRC of a transport packet ``pkt`` (BTH .. pad, without the ICRC)."""
    mv = memoryview(pkt)
    n = len(mv) + ICRC_LEN
    if n < 8:          # not even a BTH word: spelled out (byte 4 is masked all the same)
        c = crc32(mv[:4], crc32(_pseudo(src_ip, dst_ip, sport, dport, n)))
        return crc32(_BYTE4_ONES, c) & 0xFFFFFFFF
    c = _start((src_ip, dst_ip, sport, dport, n, _W0.unpack_from(mv)[0]))
    return crc32(mv[5:], c) & 0xFFFFFFFF


def append_icrc(pkt: bytearray, src_ip: str, dst_ip: str, sport: int, dport: int) -> bytearray:
    """Append the ICRC (little-endian on the wire) to ``pkt`` in place and return it."""
    pkt += icrc(pkt, src_ip, dst_ip, sport, dport).to_bytes(4, "little")
    return pkt


def check_icrc(datagram: bytes | bytearray | memoryview, src_ip: str, dst_ip: str, sport: int,
               dport: int) -> bool:
    """True if the datagram's trailing ICRC matches its contents."""
    n = len(datagram)
    if n < BTH_LEN + ICRC_LEN:
        return False
    # icrc() inlined: this runs for every packet received
    key = (src_ip, dst_ip, sport, dport, n, _W0.unpack_from(datagram)[0])
    c = _start_cache.get(key)
    if c is None:
        c = _start(key)
    return crc32(memoryview(datagram)[5:n - 4], c) == _ICRC.unpack_from(datagram, n - 4)[0]
