"""What happened on the wire, read back: ``ladder`` turns a pcap or a simulated
fabric's trace into one event per packet copy and draws them as a ladder (text
or SVG).  The ``softnic trace`` command and the pytest plugin's failure report
both use it."""
