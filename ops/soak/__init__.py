"""``kvroute soak``: a long mixed workload against a running kvroute (``ops.soak.cli``)."""

from .cli import add_parser, cmd_soak

__all__ = ["add_parser", "cmd_soak"]
