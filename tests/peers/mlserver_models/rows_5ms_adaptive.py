"""rows_5ms with MLServer's own adaptive batching on (rows_5ms_adaptive.json):
the reference for the gateway's dynamic batching (bench scenario g)."""

from rows_5ms import Model

__all__ = ["Model"]
