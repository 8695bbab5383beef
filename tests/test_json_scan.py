"""The chunked JSON scan (gateway/core/limits.py) against a character-by-character
reference, for every chunk boundary; and the offload pool's promises."""

from __future__ import annotations

import asyncio
import gc
import threading

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core import limits
from gateway.core.limits import JsonShape, scan_json
from gateway.runtime.offload import Offloader


def reference(text: str) -> JsonShape:
    depth = deepest = commas = containers = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            containers += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
        elif char == ",":
            commas += 1
    return JsonShape(deepest, commas + 1, containers)


string_literal = st.lists(st.sampled_from(["\\\\", '\\"', "a", "[", "{", "]", "}", ",", "\\n", " "]),
                          max_size=8).map(lambda parts: '"' + "".join(parts) + '"')
token = st.one_of(st.sampled_from(["[", "]", "{", "}", ",", " ", "1", ":"]), string_literal)


@settings(max_examples=300, deadline=None)
@given(st.lists(token, max_size=40), st.sampled_from([1, 2, 3, 5, 8, 1 << 20]))
def test_scan_matches_a_reference_at_every_chunk_size(tokens: list[str], chunk: int) -> None:
    text = "".join(tokens)
    saved = limits._SCAN_CHUNK
    limits._SCAN_CHUNK = chunk
    try:
        assert scan_json(text.encode()) == reference(text)
    finally:
        limits._SCAN_CHUNK = saved


def test_scan_of_real_documents() -> None:
    document = {"a": [[1, 2], [3, [4, {"b": "x,[y]\\\"z"}]]], "c": "}}}", "d": []}
    text = orjson.dumps(document)
    assert scan_json(text) == reference(text.decode())
    assert scan_json(text).depth == 5
    assert scan_json(b"[]" * 1000) == JsonShape(1, 1, 1000)


async def test_small_work_stays_inline_and_big_work_goes_to_the_pool() -> None:
    offload = Offloader(threads=1, min_bytes=100)
    try:
        main = threading.get_ident()
        assert await offload.run(99, threading.get_ident) == main
        assert await offload.run(100, threading.get_ident) != main
    finally:
        offload.close()


async def test_the_collector_is_paused_during_pool_calls_and_restored_after() -> None:
    offload = Offloader(threads=2, min_bytes=0)
    started = threading.Barrier(2, timeout=5)

    def observe() -> bool:
        started.wait()  # both calls overlap: the first to end must not re-enable it
        return gc.isenabled()

    assert gc.isenabled()
    try:
        during = await asyncio.gather(offload.run(1, observe), offload.run(1, observe))
        assert during == [False, False]
        assert gc.isenabled()
    finally:
        offload.close()


@pytest.mark.parametrize(("body", "shape"), [
    (b"", JsonShape(0, 1, 0)), (b"[", JsonShape(1, 1, 1)), (b"]]]]", JsonShape(0, 1, 0)),
    (b'"\\', JsonShape(0, 1, 0)), (b'["\\"]', JsonShape(1, 1, 1)), (b"[,,", JsonShape(1, 3, 1))])
def test_scan_of_text_that_is_not_json(body: bytes, shape: JsonShape) -> None:
    # A bound, never an error: such text is refused when parsed.
    assert scan_json(body) == shape
