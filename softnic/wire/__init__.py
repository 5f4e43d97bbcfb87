"""RoCEv2 and (later) iWARP wire codecs: pure functions, no state."""
