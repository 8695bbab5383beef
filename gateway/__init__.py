"""Multi-protocol inference gateway."""

__version__ = "0.1.0"
