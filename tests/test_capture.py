"""softnic.driver.capture: the pcap files it writes, read back with scapy's pcap reader."""

from __future__ import annotations

import struct
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.utils import RawPcapReader

from softnic.driver.capture import LINKTYPE_RAW, Capture
from softnic.wire.icrc import append_icrc, check_icrc, ipv4_udp_headers
from softnic.wire.roce import ROCEV2_PORT, Opcode, encode

SRC = ("10.1.2.3", 49200)
DST = ("10.1.2.4", ROCEV2_PORT)


def read(path) -> tuple[RawPcapReader, list]:
    reader = RawPcapReader(str(path))
    with reader:
        return reader, list(reader)


def datagram(n: int = 8) -> bytes:
    payload = bytes(i & 0xFF for i in range(n))
    pkt = encode(Opcode.RC_SEND_ONLY, dest_qp=0x11, psn=7, payload=payload)
    return bytes(append_icrc(pkt, SRC[0], DST[0], SRC[1], DST[1]))


def test_empty_capture_is_a_valid_pcap(tmp_path):
    path = tmp_path / "empty.pcap"
    Capture(path, snaplen=1500).close()
    magic, major, minor, _, _, snaplen, linktype = struct.unpack("=IHHiIII", path.read_bytes())
    assert (magic, major, minor, snaplen, linktype) == (0xA1B2C3D4, 2, 4, 1500, LINKTYPE_RAW)
    reader, records = read(path)
    assert reader.linktype == LINKTYPE_RAW and records == []


def test_records_are_ipv4_udp_frames(tmp_path):
    path = tmp_path / "c.pcap"
    d1, d2 = datagram(5), datagram(300)
    with Capture(path) as cap:
        cap.record(d1, SRC, DST, 1.25)
        cap.record(bytearray(d2), DST, SRC, 2.5)  # a received one: the peer is the source
        cap.record(memoryview(d1), SRC, DST, 3.0)
    _, records = read(path)
    assert [frame for frame, _ in records] == [
        ipv4_udp_headers(SRC[0], DST[0], SRC[1], DST[1], len(d1)) + d1,
        ipv4_udp_headers(DST[0], SRC[0], DST[1], SRC[1], len(d2)) + d2,
        ipv4_udp_headers(SRC[0], DST[0], SRC[1], DST[1], len(d1)) + d1,
    ]
    ip = IP(records[1][0])
    assert (ip.src, ip.dst, ip[UDP].sport, ip[UDP].dport) == (DST[0], SRC[0], DST[1], SRC[1])
    ip = IP(records[0][0])
    assert ip.flags == "DF" and ip.id == 0
    assert check_icrc(bytes(ip[UDP].payload), ip.src, ip.dst, ip[UDP].sport, ip[UDP].dport)


@pytest.mark.parametrize("now, sec, usec", [
    (0.0, 0, 0),
    (1.5, 1, 500_000),
    (1700000000.000001, 1700000000, 1),
    (5.0000004, 5, 0),
    (5.9999996, 6, 0),  # rounds into the next second
    (5.9999994, 5, 999_999),
])
def test_timestamps(tmp_path, now, sec, usec):
    path = tmp_path / "t.pcap"
    with Capture(path) as cap:
        cap.record(datagram(), SRC, DST, now)
    _, [(_, meta)] = read(path)
    assert (meta.sec, meta.usec) == (sec, usec)


@given(st.integers(0, (1 << 32) * 1_000_000 - 1))
def test_microsecond_timestamps_survive(tmp_path_factory, now_us):
    path = tmp_path_factory.getbasetemp() / "microseconds.pcap"
    with Capture(path) as cap:
        cap.record(datagram(), SRC, DST, now_us / 1e6)
    _, [(_, meta)] = read(path)
    assert meta.sec * 1_000_000 + meta.usec == now_us


def test_snaplen_truncates_but_keeps_the_wire_length(tmp_path):
    path = tmp_path / "s.pcap"
    d = datagram(100)
    with Capture(path, snaplen=40) as cap:
        cap.record(d, SRC, DST, 1.0)
    _, [(frame, meta)] = read(path)
    assert (len(frame), meta.caplen, meta.wirelen) == (40, 40, 28 + len(d))
    assert frame == (ipv4_udp_headers(SRC[0], DST[0], SRC[1], DST[1], len(d)) + d)[:40]


def test_snaplen_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        Capture(tmp_path / "x.pcap", snaplen=0)


def test_close_is_idempotent_and_later_records_are_dropped(tmp_path):
    path = tmp_path / "c.pcap"
    cap = Capture(path)
    cap.record(datagram(), SRC, DST, 1.0)
    cap.close()
    assert cap.closed
    size = path.stat().st_size
    cap.close()
    cap.record(datagram(), SRC, DST, 2.0)
    cap.flush()
    assert path.stat().st_size == size
    _, records = read(path)
    assert len(records) == 1


def test_concurrent_records_are_not_interleaved(tmp_path):
    path = tmp_path / "threads.pcap"
    per_thread, sizes = 500, (1, 37, 600, 1400)
    with Capture(path) as cap:
        def run(n):
            d = datagram(n)
            for i in range(per_thread):
                cap.record(d, SRC, DST, float(i))
        threads = [threading.Thread(target=run, args=(n,)) for n in sizes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    _, records = read(path)
    assert len(records) == per_thread * len(sizes)
    frames = {ipv4_udp_headers(SRC[0], DST[0], SRC[1], DST[1], len(datagram(n))) + datagram(n)
              for n in sizes}
    assert all(frame in frames for frame, _ in records)
