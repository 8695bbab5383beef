"""Embedded demo models served in-process by the ``builtin`` upstream."""
