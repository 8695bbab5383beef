"""The response cache's parts without sockets: its options, its key (what
makes two requests one question) and the memory backend's bounds (bytes,
ttl, the memory budget it charges and gives back)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gateway.config.node import ConfigError
from gateway.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from gateway.dataplane.filters.cache_key import key_of
from gateway.dataplane.filters.cache_store import MemoryBackend, answer_size, answer_to
from gateway.dataplane.filters.response_cache import ResponseCacheOptions
from gateway.runtime.budget import InflightBudget
from gateway.runtime.offload import Offloader
from support import Clock, parse_yaml_config

SALT = b"route"


def _config(options: str) -> Any:
    return parse_yaml_config(f"""
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams: [{{name: local, protocol: builtin}}]
policies: [{{name: cache, response_cache: {options}}}]
routes: [{{match: {{model: "*"}}, upstream: local, policies: [cache]}}]
""")


def test_options_default_and_parse() -> None:
    assert _config("null").policies[0].options == ResponseCacheOptions()
    options = _config("{ttl: 250ms, max_bytes: 1MiB, backend: memory}").policies[0].options
    assert options == ResponseCacheOptions(0.25, 1 << 20, "memory")


@pytest.mark.parametrize(("options", "problem"), [
    ("{ttl: 0}", "policies[0].response_cache.ttl: must be more than 0"),
    ("{max_bytes: 0}", "policies[0].response_cache.max_bytes: must be more than 0"),
    ("{backend: disk}", "policies[0].response_cache.backend: must be one of memory"),
    ("{size: 3}", "policies[0].response_cache.size: unknown key"),
    ("[1]", "policies[0].response_cache: must be a mapping"),
])
def test_bad_options_are_config_errors(options: str, problem: str) -> None:
    with pytest.raises(ConfigError) as error:
        _config(options)
    assert any(p.startswith(problem) for p in error.value.problems), error.value.problems


@pytest.mark.parametrize(("options", "valid"), [
    ({"ttl": "250ms", "max_bytes": "1MiB", "backend": "memory"}, True), (None, True),
    ({"backend": "disk"}, False), ({"size": 3}, False), ({"ttl": "soon"}, False),
])
def test_the_config_schema_describes_the_options(options: Any, valid: bool) -> None:
    import jsonschema

    from gateway.app.configure import build_schema

    config = {"listeners": [{"name": "rest", "protocol": "v2-rest", "address": "127.0.0.1:8000"}],
              "upstreams": [{"name": "local", "protocol": "builtin"}],
              "policies": [{"name": "cache", "response_cache": options}],
              "routes": [{"match": {"model": "*"}, "upstream": "local", "policies": ["cache"]}]}
    errors = list(jsonschema.Draft202012Validator(build_schema()).iter_errors(config))
    assert not errors if valid else errors


def _request(*inputs: Tensor, outputs: tuple[str, ...] = (), **parameters: Any) -> InferRequest:
    return InferRequest("m", "1", "id-1", list(inputs), [RequestedOutput(n) for n in outputs], dict(parameters))


def _int32(name: str, values: list[int]) -> Tensor:
    return Tensor.from_numpy(name, np.array(values, dtype=np.int32))


def _bytes(name: str, items: list[bytes]) -> Tensor:
    return Tensor.from_numpy(name, np.array(items, dtype=object), "BYTES")


def test_the_key_is_the_question_not_its_wire_form() -> None:
    a, b = _int32("A", [1, 2]), _int32("B", [3])
    key = key_of(_request(a, b), SALT)
    # Input order, the request id and encoding-only parameters do not matter ...
    assert key_of(_request(b, a), SALT) == key
    assert key_of(InferRequest("m", "1", "other-id", [a, b]), SALT) == key
    assert key_of(_request(a, b, binary_data_output=True, priority=3), SALT) == key
    # ... a strided view holds the same bytes as a contiguous array.
    strided = Tensor("A", "INT32", (2,), np.array([1, 9, 2, 9], dtype=np.int32)[::2])
    assert key_of(_request(strided, b), SALT) == key


@pytest.mark.parametrize("changed", [
    _request(_int32("A", [1, 3]), _int32("B", [3])),  # one element
    _request(_int32("A", [1, 2]), _int32("C", [3])),  # a name
    _request(Tensor.from_numpy("A", np.array([1, 2], dtype=np.uint32)), _int32("B", [3])),  # a datatype
    _request(Tensor.from_numpy("A", np.array([[1, 2]], dtype=np.int32)), _int32("B", [3])),  # a shape
    _request(_int32("A", [1, 2]), _int32("B", [3]), temperature=1),  # a parameter
    _request(_int32("A", [1, 2]), _int32("B", [3]), outputs=("OUT",)),  # the outputs asked for
    InferRequest("m", "2", "id-1", [_int32("A", [1, 2]), _int32("B", [3])]),  # the version
])
def test_anything_that_can_change_the_answer_changes_the_key(changed: InferRequest) -> None:
    assert key_of(changed, SALT) != key_of(_request(_int32("A", [1, 2]), _int32("B", [3])), SALT)


def test_bytes_elements_are_keyed_with_their_lengths() -> None:
    assert key_of(_request(_bytes("S", [b"ab", b"c"])), SALT) != key_of(_request(_bytes("S", [b"a", b"bc"])), SALT)
    assert key_of(_request(_bytes("S", [b"ab", b"c"])), SALT) != key_of(_request(_bytes("S", [b"ab", b"c"])), b"x")


def _answer(value: int, elements: int = 16) -> InferResponse:
    return InferResponse("m", "1", "first-id", [Tensor.from_numpy("OUT", np.full(elements, value, np.int32))],
                         {"p": 1})


def _backend(max_bytes: int, budget: InflightBudget, clock: Clock, ttl: float = 10.0) -> MemoryBackend:
    return MemoryBackend(ttl, max_bytes, budget, Offloader(), clock=clock)


async def test_kept_bytes_are_bounded_and_charged_to_the_memory_budget() -> None:
    budget, clock = InflightBudget(1 << 20), Clock()
    size = answer_size(_answer(0).outputs)
    store = _backend(2 * size, budget, clock)
    assert await store.put(b"a", _answer(1)) and await store.put(b"b", _answer(2))
    assert budget.used == store.used == 2 * size
    assert await store.get(b"a") is not None  # `a` used last: `b` goes first
    assert await store.put(b"c", _answer(3))
    assert await store.get(b"b") is None and len(store) == 2 and budget.used == 2 * size
    assert not await store.put(b"big", _answer(4, elements=2 * size))  # larger than max_bytes: never kept
    assert budget.used == 2 * size
    await store.close()
    assert budget.used == store.used == 0 and len(store) == 0


async def test_an_answer_the_budget_has_no_room_for_is_not_kept() -> None:
    size = answer_size(_answer(0).outputs)
    budget = InflightBudget(size + size // 2)
    store = _backend(1 << 20, budget, Clock())
    assert await store.put(b"a", _answer(1))
    assert not await store.put(b"b", _answer(2))
    assert budget.used == size and await store.get(b"b") is None


async def test_answers_expire_and_give_back_their_bytes() -> None:
    budget, clock = InflightBudget(1 << 20), Clock()
    store = _backend(1 << 20, budget, clock, ttl=5.0)
    await store.put(b"a", _answer(1))
    clock.now = 4.9
    assert await store.get(b"a") is not None
    clock.now = 5.0
    assert await store.get(b"a") is None and budget.used == 0
    await store.put(b"b", _answer(2))
    clock.now = 11.0
    await store.put(b"c", _answer(3))  # storing sweeps what expired before it
    assert len(store) == 1 and budget.used == answer_size(_answer(3).outputs)


async def test_a_kept_answer_is_each_requests_own_and_cannot_be_changed() -> None:
    store = _backend(1 << 20, InflightBudget(1 << 20), Clock())
    first = _answer(7)
    await store.put(b"a", first)
    first.outputs[0].data[0] = 99  # the upstream's answer changed after it was kept: the copy is not
    kept = await store.get(b"a")
    assert kept is not None
    answer = answer_to(kept, InferRequest("asked", "", "second-id"))
    assert (answer.model_name, answer.model_version, answer.id, answer.parameters) == ("asked", "1", "second-id",
                                                                                        {"p": 1})
    np.testing.assert_array_equal(answer.outputs[0].data, np.full(16, 7, np.int32))
    with pytest.raises(ValueError):
        answer.outputs[0].data[0] = 1
    answer.outputs[0].parameters["x"] = 1
    assert answer_to(kept, InferRequest("asked")).outputs[0].parameters == {}
