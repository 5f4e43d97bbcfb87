"""pcap capture of the RoCEv2 datagrams a NIC sends and receives.

A device sees only UDP payloads, so each record gets the canonical IP and
UDP header that ``wire.icrc`` also uses for the ICRC (IPv4: id 0, DF set, UDP
checksum 0; IPv6: no extension headers, the UDP checksum IPv6 requires).
Captured packets therefore carry an ICRC that checks in Wireshark, tshark and
scapy.  Records are raw IPv4 or IPv6 (LINKTYPE_RAW, the version nibble tells
them apart), with no link-layer header to invent.

Writing is one header build and one buffered write per datagram; no scapy
packet objects are built.
"""

from __future__ import annotations

import threading
from os import PathLike

from ..wire.icrc import ipv4_udp_headers, ipv6_udp_headers

__all__ = ["Capture", "TcpCapture", "LINKTYPE_RAW"]

#: pcap link type for raw IPv4/IPv6 packets (libpcap's portable value; DLT_RAW is 12 or 14).
LINKTYPE_RAW = 101

_BUFSIZE = 1 << 16
_HEADER_CACHE_SIZE = 4096  # (src, dst, length) -> IPv4+UDP header; a few flows, a few sizes


class _PcapFile:
    """What both captures share: a pcap writer behind a lock, flushed and
    closed once (records after ``close()`` are dropped)."""

    _lock: threading.Lock
    _writer: object | None

    @property
    def closed(self) -> bool:
        return self._writer is None

    def flush(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.flush()

    def close(self) -> None:
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Capture(_PcapFile):
    """Append RoCEv2 datagrams to a pcap file at ``path``.

    ``record()`` may be called from several threads (a device's progress
    thread and the caller's).  After ``close()``, further records are
    dropped, so a driver can close the capture while its threads wind down.
    """

    def __init__(self, path: str | PathLike[str], *, snaplen: int = 65535) -> None:
        if snaplen <= 0:
            raise ValueError(f"snaplen must be positive, not {snaplen}")
        self.path = str(path)
        self.snaplen = snaplen
        self._lock = threading.Lock()
        self._headers: dict[tuple, bytes] = {}
        from scapy.utils import RawPcapWriter   # here: scapy takes ~0.2 s to import
        self._writer: RawPcapWriter | None = RawPcapWriter(
            self.path, linktype=LINKTYPE_RAW, snaplen=snaplen, bufsz=_BUFSIZE)
        # Write the file header now, so even an empty capture is a valid pcap.
        self._writer.write_header(None)


    def record(self, datagram: bytes | bytearray | memoryview, src: tuple[str, int],
               dst: tuple[str, int], now: float) -> None:
        """Write one UDP payload sent from ``src`` to ``dst`` at time ``now`` (seconds)."""
        key = (src, dst, len(datagram))
        header = self._headers.get(key)
        if header is None and ":" in src[0]:     # IPv6: the UDP checksum covers the payload
            header = ipv6_udp_headers(src[0], dst[0], src[1], dst[1], datagram)
        elif header is None:
            if len(self._headers) >= _HEADER_CACHE_SIZE:
                self._headers.clear()
            header = self._headers[key] = ipv4_udp_headers(src[0], dst[0], src[1], dst[1],
                                                           len(datagram))
        frame = header + datagram
        wirelen = len(frame)
        if wirelen > self.snaplen:
            frame = frame[:self.snaplen]
        sec = int(now)
        usec = round((now - sec) * 1_000_000)
        if usec >= 1_000_000:  # rounding carried into the next second
            sec += 1
            usec -= 1_000_000
        with self._lock:
            if self._writer is not None:
                self._writer.write_packet(frame, sec=sec, usec=usec, caplen=len(frame),
                                          wirelen=wirelen)




class TcpCapture(_PcapFile):
    """pcap of the byte streams of an iWARP device's TCP connections.

    The device sees stream bytes, not segments, so each chunk it sends or
    receives becomes one TCP segment (split at 64000 bytes) with sequence
    numbers that follow the stream; a flow's first chunk is preceded by a
    SYN / SYN-ACK / ACK exchange so dissectors (tshark's ``iwarp_mpa``) see a
    connection open and the MPA handshake at its start.  Headers are built by
    scapy, checksums included.
    """

    SEGMENT = 64000

    def __init__(self, path: str | PathLike[str]) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._seq: dict[tuple, int] = {}           # (src, dst) -> next sequence number
        # scapy takes ~0.2 s to import: when a capture opens, not with the module
        from scapy.layers.inet import IP, TCP
        from scapy.utils import RawPcapWriter
        self._ip, self._tcp = IP, TCP
        self._writer: RawPcapWriter | None = RawPcapWriter(
            self.path, linktype=LINKTYPE_RAW, snaplen=65535, bufsz=_BUFSIZE)
        self._writer.write_header(None)


    def _write(self, src, dst, flags: str, payload: bytes, now: float) -> None:
        seq = self._seq[(src, dst)]
        ack = self._seq.get((dst, src), 0)
        pkt = self._ip(src=src[0], dst=dst[0], flags="DF", id=0) / self._tcp(
            sport=src[1], dport=dst[1], flags=flags, seq=seq, ack=ack if "A" in flags else 0,
            window=65535) / payload
        frame = bytes(pkt)
        self._seq[(src, dst)] = (seq + len(payload) + ("S" in flags)) & 0xFFFFFFFF
        sec = int(now)
        usec = min(999_999, round((now - sec) * 1_000_000))
        self._writer.write_packet(frame, sec=sec, usec=usec, caplen=len(frame),
                                  wirelen=len(frame))

    def record(self, src: tuple[str, int], dst: tuple[str, int], data, now: float) -> None:
        """Bytes that went from ``src`` to ``dst`` on a TCP connection at ``now``."""
        src, dst = (str(src[0]), int(src[1])), (str(dst[0]), int(dst[1]))
        with self._lock:
            if self._writer is None:
                return
            if (src, dst) not in self._seq:
                self._seq[(src, dst)] = 1000
                self._seq[(dst, src)] = 5000
                self._write(src, dst, "S", b"", now)
                self._write(dst, src, "SA", b"", now)
                self._write(src, dst, "A", b"", now)
            data = bytes(data)
            for i in range(0, len(data), self.SEGMENT):
                self._write(src, dst, "PA", data[i:i + self.SEGMENT], now)


