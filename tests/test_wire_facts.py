"""Each wire fact written once: the PSN helpers (``softnic.wire.psn``) and the BTH
layouts and bits (``softnic.wire.roce``)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from softnic.wire import roce
from softnic.wire.psn import PSN_HALF, PSN_MASK, PSN_MODULUS, psn_add, psn_before, psn_diff, \
    psn_distance
from softnic.wire.roce import Opcode as O

psns = st.one_of(st.integers(0, PSN_MASK), st.sampled_from([0, 1, PSN_HALF - 1, PSN_HALF,
                                                           PSN_HALF + 1, PSN_MASK]))


def test_psn_constants_are_the_24_bit_field():
    assert (PSN_MASK, PSN_MODULUS, PSN_HALF) == (0xFFFFFF, 1 << 24, 1 << 23)


@given(psns, psns)
def test_psn_arithmetic_is_serial_arithmetic_on_24_bits(a, b):
    # the representative of a - b mod 2**24 in [-2**23, 2**23), by brute reasoning
    d = next(x for x in (a - b, a - b + PSN_MODULUS, a - b - PSN_MODULUS)
             if -PSN_HALF <= x < PSN_HALF)
    assert psn_diff(a, b) == d
    assert psn_before(a, b) == (d < 0)
    assert psn_distance(a, b) == d % PSN_MODULUS
    assert psn_add(b, psn_diff(a, b)) == a
    assert psn_add(b, psn_distance(a, b)) == a
    if a != b and psn_diff(a, b) != -PSN_HALF:
        assert psn_before(a, b) != psn_before(b, a)


def test_psn_wraps():
    assert psn_add(PSN_MASK, 1) == 0 and psn_add(0, -1) == PSN_MASK
    assert psn_before(PSN_MASK, 0) and not psn_before(0, PSN_MASK)
    assert psn_diff(0, PSN_MASK) == 1


def test_the_bth_layouts_and_bits_are_the_codecs():
    """An ACK packed with BTH_AETH_STRUCT and the named bits decodes as the same
    fields (the codec is the check: ``decode`` reads with the same names)."""
    buf = bytearray(roce.BTH_AETH_STRUCT.size)
    roce.BTH_AETH_STRUCT.pack_into(
        buf, 0, O.RC_ACKNOWLEDGE, roce.BTH_SE | roce.BTH_MIGREQ, 0x1234,
        roce.BTH_BECN | 0x00ABCD, roce.BTH_ACKREQ | 0x123456,
        (0x61 << roce.AETH_SYNDROME_SHIFT) | 0x000042)
    assert roce.BTH_STRUCT.size == roce.BTH_LEN
    assert roce.BTH_AETH_STRUCT.size == roce.BTH_LEN + roce.AETH_LEN
    assert roce.BTH_RETH_STRUCT.size == roce.BTH_LEN + roce.RETH_LEN
    pkt = roce.decode(bytes(buf))
    b = pkt.bth
    assert (b.opcode, b.se, b.migreq, b.pad, b.pkey, b.fecn, b.becn, b.dest_qp, b.ackreq,
            b.psn) == (O.RC_ACKNOWLEDGE, True, True, 0, 0x1234, False, True, 0xABCD, True,
                       0x123456)
    assert (pkt.aeth.syndrome, pkt.aeth.msn) == (0x61, 0x42)
    # IBA 9.2: the bit positions, stated independently of the constants
    assert (buf[1], buf[4], buf[8], bytes(buf[9:12])) == (0xC0, 0x40, 0x80, b"\x12\x34\x56")
    sent = roce.encode(O.RC_SEND_ONLY, dest_qp=1, psn=2, payload=b"x")
    assert (sent[1] >> roce.BTH_PAD_SHIFT) & roce.BTH_PAD_MASK == 3 == roce.pad_count(1)


@given(st.sampled_from(list(O)), st.integers(0, 0xFF))
def test_bth_word0_is_the_first_word_an_encoded_bth_carries(op, flags):
    """``roce.bth_word0`` (the word the kernel compares and builds) is the first
    four bytes of a BTH packed with that opcode and flags byte and the default
    P_Key."""
    packed = roce.BTH_STRUCT.pack(int(op), flags, roce.DEFAULT_PKEY, 0, 0)
    assert roce.bth_word0(int(op), flags) == int.from_bytes(packed[:4], "big")
