"""softnic.trace.ladder and `softnic trace`: packet ladders from fabric traces and pcaps."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import RawPcapWriter

from softnic.trace import ladder
from softnic.driver.capture import Capture
from softnic.transport.sim import TraceRecord
from softnic.wire.icrc import append_icrc
from softnic.wire.roce import AethCode, NakCode, Opcode, encode

A = ("10.0.0.1", 4791)
B = ("10.0.0.2", 4791)
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def planted():
    """No random loss; the requester's datagram 3 (WRITE MIDDLE, PSN 103) is lost."""
    run = ladder.simulate(loss=0.0, seed=1, drop_requests={3})
    assert run.ok
    return run, ladder.from_fabric_trace(run.trace)


def datagram(opcode, psn, src=A, dst=B, **kw) -> bytes:
    pkt = encode(opcode, dest_qp=0x11, psn=psn, **kw)
    return bytes(append_icrc(pkt, src[0], dst[0], src[1], dst[1]))


# -- names ----------------------------------------------------------------------

def test_short_names():
    n = ladder.SHORT_NAMES
    assert n[Opcode.RC_RDMA_WRITE_FIRST] == "WRITE FIRST"
    assert n[Opcode.RC_RDMA_READ_RESPONSE_LAST] == "READ RESP LAST"
    assert n[Opcode.RC_RDMA_READ_REQUEST] == "READ REQ"
    assert n[Opcode.RC_ATOMIC_ACKNOWLEDGE] == "ATOMIC ACK"
    assert n[Opcode.RC_SEND_ONLY_WITH_IMMEDIATE] == "SEND ONLY IMM"
    assert n[Opcode.UC_RDMA_WRITE_LAST_WITH_IMMEDIATE] == "UC WRITE LAST IMM"
    assert n[Opcode.RC_COMPARE_SWAP] == "CMP SWAP"
    ack = Opcode.RC_ACKNOWLEDGE
    assert ladder.short_name(ack, 0x1F) == "ACK"
    assert ladder.short_name(ack, (AethCode.NAK << 5) | NakCode.PSN_SEQUENCE_ERROR) == "NAK seq-err"
    assert ladder.short_name(ack, (AethCode.NAK << 5) | NakCode.REMOTE_ACCESS_ERROR) == \
        "NAK rem-access"
    assert ladder.short_name(ack, (AethCode.RNR_NAK << 5) | 12) == "RNR NAK"
    assert ladder._aeth_text((AethCode.RNR_NAK << 5) | 12) == "rnr timer 12 (0.64 ms)"


# -- a planted loss ----------------------------------------------------------------

def test_planted_drop_nak_and_retransmission(planted):
    _, events = planted
    seq = [(e.name, e.psn, e.src) for e in events]
    drop = [i for i, e in enumerate(events) if e.dropped]
    assert len(drop) == 1
    d = events[drop[0]]
    assert (d.name, d.psn, d.src, d.dst, d.arrive) == ("WRITE MIDDLE", 103, A, B, None)
    assert d.marks == ("DROP",)
    # Everything before the loss went once; the responder NAKs the gap at PSN 103.
    assert not any(e.retransmit for e in events[:drop[0] + 1])
    nak = next(i for i, e in enumerate(events) if e.is_nak)
    assert nak > drop[0]
    n = events[nak]
    assert (n.name, n.psn, n.src, n.msn, n.syndrome) == ("NAK seq-err", 103, B, 0, 0x60)
    assert n.aeth == "PSN sequence error"
    # Go-back-N: the requester resends from 103, each marked, and they arrive.
    resent = [e for e in events[nak + 1:] if e.src == A]
    assert [(e.name, e.psn) for e in resent] == [("WRITE MIDDLE", 103), ("WRITE MIDDLE", 104),
                                                 ("WRITE MIDDLE", 105), ("WRITE MIDDLE", 106),
                                                 ("WRITE LAST", 107), ("READ REQ", 108)]
    assert all(e.retransmit and e.arrive is not None and not e.dropped for e in resent)
    # Only the resent requests are retransmissions; the ACK and READ responses are new.
    assert sum(e.retransmit for e in events) == len(resent)
    assert ("ACK", 107, B) in seq and ("READ RESP LAST", 115, B) in seq
    # Delivered packets arrive after they leave, by at least the 5 us link delay.
    assert all(e.delay >= 5e-6 for e in events if e.arrive is not None)


def test_planted_read_response_loss_restarts_read():
    run = ladder.simulate(loss=0.0, seed=1, drop_responses={2})
    events = ladder.from_fabric_trace(run.trace)
    assert run.ok
    [d] = [e for e in events if e.dropped]
    assert (d.name, d.psn, d.src) == ("READ RESP MIDDLE", 109, B)
    # The requester re-issues the READ from the missing PSN: inside the first READ's range.
    again = [e for e in events if e.name == "READ REQ"]
    assert [(e.psn, e.dma_len, e.retransmit) for e in again] == [(108, 8192, False),
                                                                 (109, 7168, True)]
    replayed = [e for e in events if e.src == B and e.retransmit]
    assert [e.psn for e in replayed] == list(range(109, 116))


def test_text_marks_the_right_lines(planted):
    _, events = planted
    text = ladder.render_text(events)
    lines = text.splitlines()
    assert len(lines) == 1 + len(events)
    drop_line = next(l for l in lines if " psn      103 " in l)
    assert "WRITE MIDDLE" in drop_line and "X" in drop_line and drop_line.endswith("DROP")
    assert ">" not in drop_line
    nak_line = next(l for l in lines if "NAK seq-err" in l)
    assert "<" in nak_line and "psn      103" in nak_line and "syn 0x60" in nak_line
    retx = [l for l in lines if l.endswith("RETX")]
    assert len(retx) == 6 and "psn      103" in retx[0]


# -- text layout ----------------------------------------------------------------------

def test_text_columns_and_line_count(planted):
    run, events = planted
    width = 30
    text = ladder.render_text(events, width=width, labels=run.labels)
    lines = text.splitlines()
    assert len(lines) == 1 + len(events)
    assert lines[0].split() == ["time", "softnic0", "10.0.0.1", "softnic1", "10.0.0.2"]
    # Every packet line has the two endpoint bars in the same two columns.
    first = lines[1].index("|")
    bars = [first, first + width + 1]
    for line, e in zip(lines[1:], events):
        assert [i for i, c in enumerate(line[:bars[1] + 1]) if c == "|"] == bars, line
        arrow = line[bars[0]:bars[1] + 1]
        if e.dropped:
            assert "X" in arrow and ">" not in arrow and "<" not in arrow
        elif e.src == A:
            assert arrow.endswith("->|") and arrow.startswith("|--")
        else:
            assert arrow.startswith("|<-") and arrow.endswith("--|")
        assert e.name in arrow
        assert re.match(r"^ +\d+\.\d{3}us$", line[:bars[0]].rstrip())
    # Times are relative to the first packet.
    assert lines[1].split()[0] == "0.000us"


def test_three_endpoints():
    C = ("10.0.0.3", 4791)
    ev = [ladder.Event(0.0, A, B, "SEND ONLY", psn=1, dest_qp=0x11, length=5),
          ladder.Event(1e-6, A, C, "WRITE ONLY", psn=7, dest_qp=0x12, length=5, dropped=True),
          ladder.Event(2e-6, C, A, "ACK", psn=7, dest_qp=0x13, opcode=Opcode.RC_ACKNOWLEDGE,
                       syndrome=0x1F, msn=1, arrive=3e-6),
          ladder.Event(3e-6, B, C, "ACK", psn=1, dest_qp=0x13, opcode=Opcode.RC_ACKNOWLEDGE)]
    lines = ladder.render_text(ev, width=24).splitlines()
    assert lines[0].split() == ["time", "10.0.0.1", "10.0.0.2", "10.0.0.3"]
    first = lines[1].index("|")
    bars = [first, first + 25, first + 50]
    assert lines[1][bars[0]:bars[2] + 1] == "|-- SEND ONLY ---------->|" + " " * 24 + "|"
    assert lines[2][bars[0]:bars[2]].rstrip().endswith("---X") and lines[2][bars[2]] == "|"
    assert lines[3][bars[0]:bars[2] + 1] == "|<" + "-" * 41 + " ACK --|"
    assert lines[4][bars[0]:bars[2] + 1] == "|" + " " * 24 + "|-- ACK ---------------->|"
    root, arrows = _arrows(ladder.render_svg(ev))
    assert len(arrows) == 4
    lifelines = sorted(float(el.get("x1")) for el in root.iter(SVG + "line")
                       if el.get("class") == "life")
    # The drop across two columns ends between them, not on the middle lifeline.
    assert lifelines[0] < float(arrows[1].get("x2")) not in lifelines


def test_text_max_lines_units_and_color(planted):
    _, events = planted
    lines = ladder.render_text(events, max_lines=5).splitlines()
    assert len(lines) == 1 + 5 + 1
    assert lines[-1].strip() == f"... {len(events) - 5} more packets not shown"
    assert "\x1b[" not in ladder.render_text(events)
    colored = ladder.render_text(events, color=True)
    assert "\x1b[31m" in colored and "\x1b[33m" in colored and "\x1b[35m" in colored
    ms = ladder.render_text(events, unit="ms").splitlines()
    assert ms[1].split()[0] == "0.000ms"
    assert ladder.render_text([]) == "(no packets)\n"


def test_summary(planted):
    _, events = planted
    assert ladder.summary(events) == f"{len(events)} packets: 1 dropped, 6 retransmitted, 1 NAKs"


# -- SVG ------------------------------------------------------------------------------

def _arrows(svg: str):
    root = ET.fromstring(svg)
    return root, [el for el in root.iter(SVG + "line") if "arrow" in el.get("class", "").split()]


def test_svg_has_one_arrow_per_packet(planted, tmp_path):
    run, events = planted
    path = tmp_path / "ladder.svg"
    svg = ladder.render_svg(events, path, labels=run.labels, title="planted loss")
    assert path.read_text() == svg
    root, arrows = _arrows(svg)
    assert len(arrows) == len(events)
    assert len(root.findall(f".//{SVG}g[@class='pkt']")) == len(events)
    lifelines = sorted({float(el.get("x1")) for el in root.iter(SVG + "line")
                        if el.get("class") == "life"})
    assert len(lifelines) == 2
    for el, e in zip(arrows, events):
        cls = el.get("class").split()
        x1, y1, x2, y2 = (float(el.get(k)) for k in ("x1", "y1", "x2", "y2"))
        assert ("drop" in cls) == e.dropped and ("retx" in cls) == e.retransmit
        assert ("nak" in cls) == e.is_nak
        if e.dropped:
            assert x2 == pytest.approx(sum(lifelines) / 2) and y2 > y1
            assert el.get("marker-end") is None
        else:
            assert y2 > y1            # slanted by the delivery delay
            assert {x1, x2} == set(lifelines)
            assert el.get("marker-end", "").startswith("url(#head-")
    assert len([p for p in root.iter(SVG + "path") if p.get("class") == "x"]) == 1
    texts = " ".join(t.text or "" for t in root.iter(SVG + "text"))
    assert "softnic0 10.0.0.1" in texts and "WRITE MIDDLE 103 DROP" in texts.replace("  ", " ")


def test_svg_from_pcap_has_level_arrows(tmp_path):
    path = tmp_path / "c.pcap"
    ladder.simulate(loss=0.0, seed=1, read=False, size=2048, capture=path)
    events = ladder.from_pcap(path)
    _, arrows = _arrows(ladder.render_svg(events, max_events=2))
    assert len(arrows) == 2
    assert all(el.get("y1") == el.get("y2") for el in arrows)
    _, none = _arrows(ladder.render_svg([]))
    assert none == []


# -- pcaps -----------------------------------------------------------------------------

def test_pcap_gives_the_fabric_sequence(tmp_path):
    """A capture of a lossy run decodes to what the fabric delivered, in order."""
    path = tmp_path / "lossy.pcap"
    run = ladder.simulate(loss=0.05, seed=2, capture=path)
    fabric = ladder.from_fabric_trace(run.trace)
    assert any(e.dropped for e in fabric) and any(e.is_nak for e in fabric)
    pcap = ladder.from_pcap(path)
    delivered = sorted((e for e in fabric if e.arrive is not None), key=lambda e: e.arrive)
    key = lambda e: (e.name, e.opcode, e.psn, e.dest_qp, e.src, e.dst, e.length, e.ackreq,  # noqa: E731
                     e.msn, e.syndrome, e.dma_len)
    assert [key(e) for e in pcap] == [key(e) for e in delivered]
    assert [e.time for e in pcap] == pytest.approx([e.arrive for e in delivered], abs=1e-6)
    assert all(e.icrc_ok is True and e.arrive is None for e in pcap)
    # Retransmissions whose first copy reached the capture point are seen as such.
    assert {e.psn for e in pcap if e.retransmit and e.src == A} >= {103, 104, 105, 106, 107}


def test_lossless_pcap_and_trace_agree_on_marks(tmp_path):
    path = tmp_path / "c.pcap"
    run = ladder.simulate(loss=0.0, seed=1, capture=path, drop_requests={3})
    fabric = [e for e in ladder.from_fabric_trace(run.trace) if not e.dropped]
    pcap = ladder.from_pcap(path)
    # The dropped PSN's resend is the first copy the capture sees, so it is not a
    # retransmission there; the others match.
    fabric_retx = [(e.psn, e.retransmit) for e in sorted(fabric, key=lambda e: e.arrive)]
    pcap_retx = [(e.psn, e.retransmit) for e in pcap]
    assert [p for p, r in fabric_retx if r] == [103, 104, 105, 106, 107, 108]
    assert [p for p, r in pcap_retx if r] == [104, 105, 106, 107, 108]


def test_corruption_and_duplicates(tmp_path):
    path = tmp_path / "faulty.pcap"
    run = ladder.simulate(faults="dup=0.2,corrupt=0.1", seed=2, capture=path)
    assert run.ok
    events = ladder.from_fabric_trace(run.trace)
    dups = [e for e in events if e.duplicate]
    bad = [e for e in events if e.corrupt]
    assert dups and bad
    # The fabric's corruptions are exactly the copies whose ICRC fails.
    assert all(e.icrc_ok is False for e in bad)
    assert all(e.icrc_ok for e in events if not e.corrupt)
    for d in dups:
        twin = events[events.index(d) - 1]
        assert (twin.name, twin.psn, twin.time) == (d.name, d.psn, d.time)
    pcap = ladder.from_pcap(path)
    assert len(pcap) == len(events)
    assert sum(e.icrc_ok is False for e in pcap) == len(bad)
    assert all(e.corrupt == (e.icrc_ok is False) for e in pcap)


def test_trace_matching_survives_copied_bytes():
    run = ladder.simulate(loss=0.05, seed=2)
    original = ladder.from_fabric_trace(run.trace)
    rebuilt = [TraceRecord(r.time, r.kind, r.src, r.dst, bytes(bytearray(r.data)))
               for r in run.trace]
    assert ladder.from_fabric_trace(rebuilt) == original


def test_trace_that_starts_mid_run():
    run = ladder.simulate(loss=0.0, seed=1, read=False)
    first_deliver = next(i for i, r in enumerate(run.trace) if r.kind == "deliver")
    events = ladder.from_fabric_trace(run.trace[first_deliver:])
    orphan = events[0]
    assert orphan.arrive == orphan.time and (orphan.name, orphan.psn) == ("WRITE FIRST", 100)
    delivered = sum(r.kind == "deliver" for r in run.trace[first_deliver:])
    assert sum(e.arrive is not None for e in events) == delivered


def test_psn_wrap_is_not_a_retransmission(tmp_path):
    path = tmp_path / "wrap.pcap"
    psns = [0xFFFFFE, 0xFFFFFF, 0, 1, 0xFFFFFF]
    with Capture(path) as cap:
        for i, psn in enumerate(psns):
            cap.record(datagram(Opcode.RC_SEND_MIDDLE, psn, payload=b"x" * 256), A, B, i * 1e-6)
        for i in range(2):   # ACKs repeat a PSN without being retransmissions
            cap.record(datagram(Opcode.RC_ACKNOWLEDGE, 1, B, A, aeth=(0x1F, 7)), B, A, 1e-5)
    events = ladder.from_pcap(path)
    assert [e.retransmit for e in events] == [False, False, False, False, True, False, False]
    assert [e.name for e in events][-2:] == ["ACK", "ACK"] and events[-1].msn == 7
    assert events[0].time == 0.0 and events[4].time == pytest.approx(4e-6)


def test_psn_reused_after_a_full_wrap_is_new(tmp_path):
    path = tmp_path / "wrap2.pcap"
    psns = [5, 0x400000, 0x7FFFFF, 0xBFFFFF, 0xFFFFFF, 5, 5]   # the last: a resend
    with Capture(path) as cap:
        for i, psn in enumerate(psns):
            cap.record(datagram(Opcode.RC_SEND_ONLY, psn, payload=b"y"), A, B, i * 1e-6)
    assert [e.retransmit for e in ladder.from_pcap(path)] == [False] * 6 + [True]


def test_read_restart_inside_the_first_reads_range(tmp_path):
    path = tmp_path / "reads.pcap"
    read = lambda psn, n: datagram(Opcode.RC_RDMA_READ_REQUEST, psn,  # noqa: E731
                                   reth=(0x1000, 7, n), ackreq=True)
    resp = datagram(Opcode.RC_RDMA_READ_RESPONSE_FIRST, 10, B, A, payload=b"r" * 1024,
                    aeth=(0x1F, 1))
    with Capture(path) as cap:
        for i, (d, s, t) in enumerate([(read(10, 4096), A, B), (resp, B, A),
                                       (read(14, 1024), A, B),     # the next READ: PSN 10 + 4
                                       (read(12, 2048), A, B),     # a restart at the 3rd packet
                                       (read(15, 1024), A, B)]):   # new again
            cap.record(d, s, t, i * 1e-6)
    assert [(e.name, e.psn, e.retransmit) for e in ladder.from_pcap(path)] == [
        ("READ REQ", 10, False), ("READ RESP FIRST", 10, False), ("READ REQ", 14, False),
        ("READ REQ", 12, True), ("READ REQ", 15, False)]


def _eth_frame(src, dst, roce: bytes, *, ident=0, flags="DF", vlan=False) -> bytes:
    l2 = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    if vlan:
        l2 = l2 / Dot1Q(vlan=7)
    return bytes(l2 / IP(src=src[0], dst=dst[0], id=ident, flags=flags, ttl=7, tos=2)
                 / UDP(sport=src[1], dport=dst[1], chksum=0) / Raw(roce))


def test_ethernet_pcap_vlan_ports_and_icrc(tmp_path):
    path = tmp_path / "eth.pcap"
    src = ("192.168.1.5", 51000)             # a real NIC's flow-entropy source port
    dst = ("192.168.1.6", 4791)
    good = datagram(Opcode.RC_RDMA_WRITE_ONLY, 9, src, dst, payload=b"abc",
                    reth=(0x1000, 0x42, 3), ackreq=True)
    flipped = bytearray(good)
    flipped[20] ^= 0x10                       # a payload bit
    other = datagram(Opcode.RC_SEND_ONLY, 10, src, ("192.168.1.6", 9999), payload=b"q")
    w = RawPcapWriter(str(path), linktype=1)
    w.write_header(None)
    for i, frame in enumerate([
            _eth_frame(src, dst, good),                          # canonical IP header
            _eth_frame(src, dst, good, vlan=True),               # VLAN tag, canonical
            _eth_frame(src, dst, bytes(flipped)),                # corrupted
            _eth_frame(src, dst, good, ident=77, flags=0),       # ICRC not checkable here
            _eth_frame(src, ("192.168.1.6", 9999), other),       # another UDP port
            bytes(Ether() / IP(src="1.1.1.1", dst="2.2.2.2") / UDP(dport=4791) / Raw(b"\x99" * 20)),
    ]):
        w.write_packet(frame, sec=100, usec=i * 10)
    w.close()
    events = ladder.from_pcap(path)
    assert len(events) == 5
    first = events[0]
    assert (first.name, first.psn, first.length, first.ackreq, first.dma_len) == \
        ("WRITE ONLY", 9, 3, True, 3)
    assert (first.src, first.dst, first.icrc_ok) == (src, dst, True)
    assert events[1].icrc_ok is True
    assert events[2].icrc_ok is False and events[2].marks == ("RETX", "CORRUPT", "BAD-ICRC")
    assert events[3].icrc_ok is None and not events[3].corrupt
    assert events[4].name.startswith("op 0x99") and events[4].psn is None
    assert [e.time - 100 for e in events] == pytest.approx([0, 1e-5, 2e-5, 3e-5, 5e-5])
    everything = ladder.from_pcap(path, port=None)
    assert len(everything) == 6 and everything[4].name == "SEND ONLY"
    only = ladder.from_pcap(path, port=9999)
    assert [e.dst for e in only] == [("192.168.1.6", 9999)]
    text = ladder.render_text(everything)      # undecodable packets still render
    assert len(text.splitlines()) == 7 and "192.168.1.6:4791" in text.splitlines()[0]


def test_truncated_capture_keeps_headers(tmp_path):
    path = tmp_path / "snap.pcap"
    with Capture(path, snaplen=28 + 40) as cap:
        cap.record(datagram(Opcode.RC_RDMA_WRITE_FIRST, 5, payload=b"z" * 1024,
                            reth=(0, 1, 4096)), A, B, 0.0)
    [e] = ladder.from_pcap(path)
    assert (e.name, e.psn, e.length, e.dma_len, e.icrc_ok, e.size) == \
        ("WRITE FIRST", 5, 1024, 4096, None, 12 + 16 + 1024 + 4)


def test_pcapng(tmp_path):
    from scapy.utils import PcapNgWriter
    path = tmp_path / "c.pcapng"
    w = PcapNgWriter(str(path))
    pkt = IP(bytes(IP(src=A[0], dst=B[0], id=0, flags="DF") / UDP(sport=4791, dport=4791, chksum=0)
                   / Raw(datagram(Opcode.RC_SEND_ONLY, 3, payload=b"hi"))))
    pkt.time = 12.5
    w.write(pkt)
    w.close()
    [e] = ladder.from_pcap(path)
    assert (e.name, e.psn, e.icrc_ok) == ("SEND ONLY", 3, True)
    assert e.time == pytest.approx(12.5)


# -- the command ---------------------------------------------------------------------

def cli(*args, check=True):
    return subprocess.run([sys.executable, "-m", "softnic.cli", "trace", *args],
                          capture_output=True, text=True, check=check)


def test_cli_demo(tmp_path):
    svg = tmp_path / "demo.svg"
    out = cli("--demo", "--loss", "0.05", "--svg", str(svg)).stdout
    assert "NAK seq-err" in out and "DROP" in out and "RETX" in out
    assert "\x1b[" not in out                    # not a terminal: no color
    lines = out.splitlines()
    assert lines[0].startswith("RC WRITE 8192 B then READ 8192 B")
    assert re.match(r"\d+ packets: 2 dropped, \d+ retransmitted, 1 NAKs", lines[-2])
    _, arrows = _arrows(svg.read_text())
    assert len(arrows) == int(lines[-2].split()[0])


def test_cli_pcap_and_errors(tmp_path):
    path = tmp_path / "c.pcap"
    ladder.simulate(loss=0.0, seed=1, capture=path)
    out = cli(str(path), "--max", "3", "--color", "always").stdout
    lines = out.splitlines()
    assert lines[0] == str(path) and len(lines) == 1 + 1 + 3 + 1 + 1
    assert "more packets not shown" in lines[-2]
    bad = cli(check=False)
    assert bad.returncode == 2 and "give a pcap file or --demo" in bad.stderr
    missing = cli(str(tmp_path / "nope.pcap"), check=False)
    assert missing.returncode == 1 and "nope.pcap" in missing.stderr


def test_svg_text_is_escaped_as_xml_text():
    """The SVG's titles and labels escape as ``xml.sax.saxutils.escape`` does
    (``&``, ``<``, ``>``; quotes left as they are, text not attributes)."""
    from xml.sax.saxutils import escape as xml_escape
    for text in ("a<b>&c", "\"quoted\" and 'single'", "&amp; twice", "", "plain"):
        assert ladder.escape(text) == xml_escape(text)
