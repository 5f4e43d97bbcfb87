"""Congestion controllers behind one small interface, picked by name."""
