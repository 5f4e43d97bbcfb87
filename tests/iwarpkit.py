"""Two (or more) iWARP devices joined by in-memory byte streams, no sockets.

``Streams`` plays the TCP driver's part for the sans-I/O engine: it turns each
device's ``connections_to_open`` into an accepted connection on the device at
that address, delivers every byte each side sends to the other end, and keeps
a log of what went by (direction and bytes) for tests that look at the wire.
"""

from __future__ import annotations

from softnic.core.iwarp import IwarpDevice


class Streams:
    def __init__(self, *devs: IwarpDevice, chunk: int | None = None):
        self.devs = {d.address: d for d in devs}
        self.links: dict[tuple[int, int], tuple[IwarpDevice, int]] = {}   # (id(dev), cid) -> peer end
        self.log: list[tuple[tuple[str, int], tuple[str, int], bytes]] = []
        self.chunk = chunk           # deliver in pieces of this size (exercises reassembly)
        self.now = 0.0

    def run(self, rounds: int = 1000) -> None:
        for _ in range(rounds):
            moved = False
            for d in list(self.devs.values()):
                for cid, addr in d.connections_to_open():
                    peer = self.devs[addr]
                    pcid = peer.connection_accepted(d.address)
                    self.links[(id(d), cid)] = (peer, pcid)
                    self.links[(id(peer), pcid)] = (d, cid)
                    d.connection_made(cid, self.now)
                    moved = True
                for cid, data in d.stream_data_to_send(self.now):
                    peer, pcid = self.links[(id(d), cid)]
                    self.log.append((d.address, peer.address, data))
                    step = self.chunk or len(data) or 1
                    for i in range(0, len(data), step):
                        peer.receive_stream(pcid, data[i:i + step], self.now)
                    moved = True
                for cid in d.connections_to_close():
                    end = self.links.pop((id(d), cid), None)
                    if end is not None:
                        self.links.pop((id(end[0]), end[1]), None)
                        end[0].connection_lost(end[1], self.now)
                    moved = True
            if not moved:
                return
        raise AssertionError("streams still busy after many rounds")
