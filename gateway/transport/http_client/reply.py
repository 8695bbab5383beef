"""An upstream's HTTP reply as the client hands it over: status, headers
(case-insensitive lookups) and the body read whole."""

from __future__ import annotations


class ReplyHeaders:
    """A reply's headers, looked up case-insensitively (repeated fields
    joined with ", "). Values are decoded as Latin-1, byte for byte."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._fields.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields

    def __repr__(self) -> str:
        return f"ReplyHeaders({sorted(self._fields)})"  # names only: values may be secrets


class UpstreamReply:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: ReplyHeaders, body: bytes | bytearray) -> None:
        self.status = status
        self.headers = headers
        self.body = body  # a bytearray when it was read into a buffer of the declared length
