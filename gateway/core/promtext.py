"""Just enough of the Prometheus text exposition format to read one gauge:
a selector (``name{label="value",...}``) as the config writes it, and the
sum of the matching series in a scraped body.

The body is searched for the metric's name with ``bytes.find`` (C speed)
and only the matching lines are parsed, so a large exposition (Triton's,
many models) costs little Python.
"""

from __future__ import annotations

import math
import re

Labels = tuple[tuple[str, str], ...]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|(?=\}|$))')
_ESCAPE = re.compile(r"\\(.)")
# Every label of a scraped line in one call (tolerant: the exposition is the server's, not ours to check).
_EVERY_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), text) if "\\" in text else text


def _labels(text: str, start: int) -> tuple[Labels, int] | None:
    """The labels of ``text`` from just after its ``{``: (labels, index past
    the closing ``}``), or None if malformed."""
    labels: list[tuple[str, str]] = []
    position = start
    while True:
        while position < len(text) and text[position] in " \t":
            position += 1
        if position < len(text) and text[position] == "}":
            return tuple(labels), position + 1
        match = _LABEL.match(text, position)
        if match is None:
            return None
        labels.append((match.group(1), _unescape(match.group(2))))
        position = match.end()


def parse_selector(text: str) -> tuple[str, Labels] | None:
    """``name`` or ``name{a="x",b="y"}`` as (name, labels); None if malformed."""
    text = text.strip()
    name, brace, _ = text.partition("{")
    if not _METRIC_NAME.fullmatch(name):
        return None
    if not brace:
        return name, ()
    parsed = _labels(text, len(name) + 1)
    if parsed is None or parsed[1] != len(text):
        return None
    return name, parsed[0]


def gauge_sum(body: bytes, name: str, labels: Labels = ()) -> float | None:
    """The sum of the series of ``name`` that carry every one of ``labels``
    (other labels may differ: a preset sums over models); None when no such
    series is in ``body``. NaN samples are skipped."""
    needle = name.encode()
    total, found = 0.0, False
    position = 0
    while True:
        position = body.find(needle, position)
        if position < 0:
            return total if found else None
        line_end = body.find(b"\n", position)
        if line_end < 0:
            line_end = len(body)
        at_line_start = position == 0 or body[position - 1] in b"\n"
        after = position + len(needle)
        if at_line_start and after < line_end and body[after] in b"{ \t":
            value = _sample(body[after:line_end], labels)
            if value is not None and not math.isnan(value):
                total, found = total + value, True
        position = line_end


def _sample(rest: bytes, wanted: Labels) -> float | None:
    """The value of one sample line after its name, if its labels match.
    The last ``}`` closes the labels (what follows is numbers); they are
    parsed only when some are wanted."""
    if rest.startswith(b"{"):
        close = rest.rfind(b"}")
        if close < 0:
            return None
        if wanted:
            have = {(name, _unescape(value))
                    for name, value in _EVERY_LABEL.findall(rest[1:close].decode("utf-8", "replace"))}
            if not have.issuperset(wanted):
                return None
        rest = rest[close + 1:]
    elif wanted:
        return None
    fields = rest.split()
    if not fields:
        return None
    try:
        return float(fields[0])
    except ValueError:
        return None
