"""A UDP payload plus what travels beside it, outside the payload bytes.

RoCEv2 packets ride in UDP; two things a congestion controller needs are not
in the UDP payload: the ECN codepoint of the IP header (a switch sets CE, the
receiver reads it with ``IP_RECVTOS``), and in-band network telemetry, which
HPCC-capable switches insert into data packets and receivers echo back in
ACKs.  On real sockets the driver reads ECN from the IP header and there is no
INT.  In the simulated fabric a datagram is a ``Datagram``: the payload bytes
themselves, with these fields attached.

    ecn    the IP ECN codepoint (0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE)
    hops   INT records stamped by the egress ports crossed so far, or None
    echo   INT records a responder echoes back to the requester, or None
           (switches stamp nothing onto a datagram that carries an echo)
"""

from __future__ import annotations

NOT_ECT, ECT1, ECT0, CE = 0, 1, 2, 3


class Datagram(bytes):

    ecn: int = NOT_ECT
    hops: tuple | None = None
    echo: tuple | None = None

    def __new__(cls, data, *, ecn: int = NOT_ECT, hops: tuple | None = None,
                echo: tuple | None = None):
        self = super().__new__(cls, data)
        if ecn:
            self.ecn = ecn
        if hops is not None:
            self.hops = hops
        if echo is not None:
            self.echo = echo
        return self

    def with_(self, **changes) -> "Datagram":
        """A copy with some fields changed (the payload bytes are the same).  (A
        RED mark's copy, ``with_(ecn=CE)``, is compiled beside it for the fabric's
        loop: softnic/accel/fabric.c's ``marked``.)"""
        f = {"ecn": self.ecn, "hops": self.hops, "echo": self.echo}
        f.update(changes)
        return Datagram(self, **f)

    def __repr__(self) -> str:
        return f"Datagram({len(self)} B, ecn={self.ecn}, hops={self.hops}, echo={self.echo})"
