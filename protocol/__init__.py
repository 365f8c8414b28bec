"""What crosses between a node and the controller, owned by neither.

The agent and the controller both import this package and never each
other: cachepilot.proto and its generated modules (protocol/gen_proto.sh),
the plain dataclasses a node reports and receives (types.py), their wire
conversions (wire.py) and how a channel to the controller is opened and
authenticated (channel.py).
"""
