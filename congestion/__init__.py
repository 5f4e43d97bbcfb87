"""Congestion controllers behind one small interface, picked by name."""
from .base import Controller, FlowInfo, Hop

CONTROLLERS = {"none": Controller}


def parse_spec(text):
    name, _, rest = text.partition(":")
    params = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        params[k] = float(v)
    return name, params


def create(name, flow, **params):
    return CONTROLLERS[name](flow, **params)
