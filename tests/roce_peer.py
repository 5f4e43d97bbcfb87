"""A RoCEv2 RC peer that softnic did not write: scapy's RoCE layers on a plain UDP socket.

The BTH, the AETH and the ICRC (over the IPv4 pseudo header, IBA Annex A17) are
scapy's (``scapy.contrib.roce``); the extended headers scapy lacks (RETH,
AtomicETH, AtomicAckETH, ImmDt) are packed here with ``struct`` from their IBA layouts;
nothing of ``softnic.wire`` is used.  The peer sends what a test tells it to,
byte for byte (any PSN, any opcode, a wrong ICRC), and reports what it receives
as ``Seen`` records after checking each one's ICRC with scapy.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH, opcode
from scapy.layers.inet import IP, UDP
from scapy.packet import Raw

ROCEV2_PORT = 4791


def op(name: str) -> int:
    """The RC opcode named as scapy names it (``'RDMA_WRITE_FIRST'``, ``'ACKNOWLEDGE'``)."""
    return opcode('RC', name)[0]


SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_ONLY = (op(n) for n in (
    'SEND_FIRST', 'SEND_MIDDLE', 'SEND_LAST', 'SEND_ONLY'))
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_ONLY = (op(n) for n in (
    'RDMA_WRITE_FIRST', 'RDMA_WRITE_MIDDLE', 'RDMA_WRITE_LAST', 'RDMA_WRITE_ONLY'))
WRITE_ONLY_IMM = op('RDMA_WRITE_ONLY_WITH_IMMEDIATE')
READ_REQUEST = op('RDMA_READ_REQUEST')
READ_FIRST, READ_MIDDLE, READ_LAST, READ_ONLY = (op(n) for n in (
    'RDMA_READ_RESPONSE_FIRST', 'RDMA_READ_RESPONSE_MIDDLE', 'RDMA_READ_RESPONSE_LAST',
    'RDMA_READ_RESPONSE_ONLY'))
ACK = op('ACKNOWLEDGE')
ATOMIC_ACK = op('ATOMIC_ACKNOWLEDGE')
CMP_SWAP, FETCH_ADD = op('COMPARE_SWAP'), op('FETCH_ADD')

# AETH syndromes: bits 6:5 the kind (0 ACK, 1 RNR NAK, 3 NAK), bits 4:0 its value
SYN_ACK = 0x1F                        # ACK, credit field "invalid" (no end-to-end credits)
SYN_RNR = 0x20                        # | the RNR timer code
NAK_PSN_SEQ, NAK_INV_REQ, NAK_REM_ACCESS, NAK_REM_OP = 0x60, 0x61, 0x62, 0x63

# The extended headers scapy has no layer for, big-endian
RETH = struct.Struct('!QII')          # virtual address, R_Key, DMA length
ATOMIC_ETH = struct.Struct('!QIQQ')   # virtual address, R_Key, swap (or add) data, compare data
ATOMIC_ACK_ETH = struct.Struct('!Q')  # original remote data
IMM_DT = struct.Struct('!I')
AETH_LEN = 4

_RETH_OPS = {WRITE_FIRST, WRITE_ONLY, WRITE_ONLY_IMM, READ_REQUEST}
_IMM_OPS = {op('SEND_LAST_WITH_IMMEDIATE'), op('SEND_ONLY_WITH_IMMEDIATE'),
            op('RDMA_WRITE_LAST_WITH_IMMEDIATE'), WRITE_ONLY_IMM}
_AETH_OPS = {READ_FIRST, READ_LAST, READ_ONLY, ACK, ATOMIC_ACK}


def ip_header(src: str, dst: str) -> IP:
    """The IPv4 header the ICRC covers.  A program on a UDP socket never sees the
    header the kernel writes, so both ends agree on one: identification 0 and DF
    set, as Linux sends UDP (TOS, TTL and the checksums are masked anyway)."""
    return IP(src=src, dst=dst, id=0, flags='DF')


@dataclass(frozen=True)
class Seen:
    """One packet the peer received, decoded."""
    opcode: int
    psn: int
    dqpn: int
    ackreq: bool
    syndrome: int | None = None       # AETH
    msn: int | None = None
    reth: tuple | None = None         # (va, rkey, dma_len)
    atomic: tuple | None = None       # (va, rkey, swap_add, compare)
    orig: int | None = None           # AtomicAckETH
    imm: int | None = None
    payload: bytes = b''

    @property
    def name(self) -> str:
        return BTH(opcode=self.opcode).sprintf('%BTH.opcode%')


class Peer:
    """The peer's end of one RC connection: its own IP (a loopback address), UDP port
    4791 and QPN; ``connect`` names the softnic device and QP it talks to."""

    def __init__(self, ip: str, qpn: int = 0x5A5A, port: int = ROCEV2_PORT):
        self.ip, self.port, self.qpn = ip, port, qpn
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind((ip, port))
        except OSError:
            self.sock.close()
            raise
        self.dev: tuple[str, int] | None = None
        self.dqpn = 0
        self.icrc_errors = 0          # received packets whose ICRC scapy found wrong

    @classmethod
    def builder(cls, ip: str, dev: tuple[str, int], dqpn: int) -> "Peer":
        """A peer with no socket, only its packet builder (``packet``)."""
        peer = cls.__new__(cls)
        peer.ip, peer.port, peer.qpn, peer.sock = ip, ROCEV2_PORT, 0, None
        peer.dev, peer.dqpn, peer.icrc_errors = dev, dqpn, 0
        return peer

    @property
    def gid(self) -> str:
        return '::ffff:' + self.ip

    def connect(self, dev_ip: str, dev_port: int, dqpn: int) -> None:
        self.dev, self.dqpn = (dev_ip, dev_port), dqpn

    def close(self) -> None:
        self.sock.close()

    # ---------------------------------------------------------------- sending

    def packet(self, opcode_: int, psn: int, *, payload: bytes = b'', reth=None, atomic=None,
               syndrome=None, msn: int = 0, orig=None, imm=None, ackreq: bool = False,
               dqpn: int | None = None, bad_icrc: bool = False) -> bytes:
        """The UDP payload of one packet: scapy's BTH, the extended headers, the
        payload and its pad, scapy's ICRC (flipped if ``bad_icrc``)."""
        ext = b''
        if reth is not None:
            ext += RETH.pack(*reth)
        if atomic is not None:
            ext += ATOMIC_ETH.pack(*atomic)
        if syndrome is not None:
            ext += raw(AETH(syndrome=syndrome, msn=msn))
        if orig is not None:
            ext += ATOMIC_ACK_ETH.pack(orig)
        if imm is not None:
            ext += IMM_DT.pack(imm)
        pad = -len(payload) % 4
        bth = BTH(opcode=opcode_, psn=psn & 0xFFFFFF, ackreq=int(ackreq), padcount=pad,
                  dqpn=self.dqpn if dqpn is None else dqpn)
        whole = ip_header(self.ip, self.dev[0]) / UDP(sport=self.port, dport=self.dev[1]) / \
            bth / Raw(ext + payload + b'\0' * pad)
        data = raw(whole[BTH])
        if bad_icrc:
            data = data[:-1] + bytes([data[-1] ^ 0x01])
        return data

    def send(self, opcode_: int, psn: int, **kw) -> None:
        self.sock.sendto(self.packet(opcode_, psn, **kw), self.dev)

    def ack(self, psn: int, syndrome: int = SYN_ACK, msn: int = 0) -> None:
        self.send(ACK, psn, syndrome=syndrome, msn=msn)

    # ---------------------------------------------------------------- receiving

    def decode(self, data: bytes, src: tuple[str, int]) -> Seen:
        """A received packet as a ``Seen``; its ICRC checked against scapy's."""
        bth = BTH(data)
        check = bth.copy()
        check.icrc = None
        want = raw(ip_header(src[0], self.ip) / UDP(sport=src[1], dport=self.port) /
                   check)[-4:]
        if want != data[-4:]:
            self.icrc_errors += 1
        code = bth.opcode
        rest = data[12:len(data) - 4]
        kw = {}
        if code in _RETH_OPS:
            kw['reth'] = RETH.unpack_from(rest)
            rest = rest[RETH.size:]
        if code in (CMP_SWAP, FETCH_ADD):
            kw['atomic'] = ATOMIC_ETH.unpack_from(rest)
            rest = rest[ATOMIC_ETH.size:]
        if code in _AETH_OPS:
            aeth = AETH(rest[:AETH_LEN])
            kw['syndrome'], kw['msn'] = aeth.syndrome, aeth.msn
            rest = rest[AETH_LEN:]
        if code == ATOMIC_ACK:
            kw['orig'] = ATOMIC_ACK_ETH.unpack_from(rest)[0]
            rest = rest[ATOMIC_ACK_ETH.size:]
        if code in _IMM_OPS:
            kw['imm'] = IMM_DT.unpack_from(rest)[0]
            rest = rest[IMM_DT.size:]
        payload = bytes(rest[:len(rest) - bth.padcount])
        return Seen(code, bth.psn, bth.dqpn, bool(bth.ackreq), payload=payload, **kw)

    def recv(self, timeout: float) -> Seen | None:
        """The next packet, or None after ``timeout`` seconds of nothing."""
        self.sock.settimeout(max(timeout, 1e-4))
        try:
            data, src = self.sock.recvfrom(65536)
        except socket.timeout:
            return None
        if self.dev is None:
            self.dev = src
        return self.decode(data, src)

    def expect(self, n: int, timeout: float = 5.0) -> list[Seen]:
        """Exactly the next ``n`` packets (AssertionError if fewer come in ``timeout``)."""
        got: list[Seen] = []
        deadline = time.monotonic() + timeout
        while len(got) < n:
            p = self.recv(deadline - time.monotonic())
            if p is None:
                raise AssertionError(f'{len(got)} of {n} packets after {timeout} s: {got}')
            got.append(p)
        return got

    def quiet(self, duration: float) -> list[Seen]:
        """Everything that arrives in the next ``duration`` seconds."""
        got: list[Seen] = []
        deadline = time.monotonic() + duration
        while (left := deadline - time.monotonic()) > 0:
            p = self.recv(left)
            if p is not None:
                got.append(p)
        return got
