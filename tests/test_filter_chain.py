"""The filter chain: a filter defined in the tests (peers/filter_gateway.py:
one class plus one registry line) runs on a route's requests whatever
protocol and transport the client speaks — V2 REST (tritonclient.http), V2
gRPC unary and ModelStreamInfer (tritonclient.grpc) — and may refuse in the
client's overload form, answer early, or change the answer; a route without
policies is untouched."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway.app.configure import parse_config
from gateway.config.node import ConfigError
from peers.filter_gateway import REGISTRY_LINE, filter_env
from support import GatewayProcess, write_config

CONFIG = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
policies:
  - {name: first, stamp: {mark: 7}}
routes:
  - match: {model: simple}
    upstream: local
    policies: [first]
  - match: {model: "*"}
    upstream: local
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("filters")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log", filter_env(),
                        module="peers.filter_gateway") as gw:
        yield gw


def _inputs(module: Any) -> tuple[list[Any], np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        item = module.InferInput(name, [1, 16], "INT32")
        item.set_data_from_numpy(a)
        inputs.append(item)
    return inputs, a


def _stamp(result: Any) -> str:
    response = result.get_response()
    if isinstance(response, dict):
        return str(response["parameters"]["stamp"])
    return str(response.parameters["stamp"].string_param)


def _counts(text: str) -> list[int]:
    return [int(n) for n in text.split("/")]


@pytest.mark.parametrize("client_kind", ["rest", "grpc"])
def test_the_filter_sees_and_changes_every_protocols_answer(gateway: GatewayProcess, client_kind: str) -> None:
    module = httpclient if client_kind == "rest" else grpcclient
    with module.InferenceServerClient(gateway.url(client_kind)) as client:
        inputs, a = _inputs(module)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)  # the upstream's answer ...
        np.testing.assert_array_equal(result.as_numpy("STAMP"), [7])  # ... with what the filter added
        requests, responses, errors = _counts(_stamp(result))
        assert requests >= 1 and responses >= 1 and errors == 0  # shared by both listeners: compared below

        early = client.infer("simple", inputs, parameters={"stamp_early": True})
        np.testing.assert_array_equal(early.as_numpy("EARLY"), [7])
        assert early.as_numpy("OUTPUT0") is None and early.as_numpy("STAMP") is None  # the upstream never ran

        with pytest.raises(InferenceServerException) as refused:
            client.infer("simple", inputs, parameters={"stamp_refuse": True})
        assert "policy first refused the request" in str(refused.value)
        assert refused.value.status() in ("429", "StatusCode.RESOURCE_EXHAUSTED")

        # A route without policies is not filtered.
        plain = client.infer("identity", _identity(module))
        assert plain.as_numpy("STAMP") is None

        after = _counts(_stamp(client.infer("simple", inputs)))
        assert after[0] == requests + 3  # this one, the early answer and the refusal
        assert after[1] == responses + 1  # its own early answer and its refusal do not pass it again
        assert after[2] == errors  # nor does its refusal come back to it as an error


def _identity(module: Any) -> list[Any]:
    item = module.InferInput("INPUT0", [1, 2], "FP32")
    item.set_data_from_numpy(np.array([[1.5, 2.5]], dtype=np.float32))
    return [item]


def test_rest_refusal_is_the_protocols_overload_form_with_retry_after(gateway: GatewayProcess) -> None:
    import urllib.error
    import urllib.request

    body = (b'{"parameters": {"stamp_refuse": true}, "inputs": ['
            b'{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [' + b",".join([b"1"] * 16) + b']},'
            b'{"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [' + b",".join([b"1"] * 16) + b']}]}')
    request = urllib.request.Request(f"http://{gateway.url('rest')}/v2/models/simple/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 429
    assert refused.value.headers["Retry-After"] == "7"
    assert refused.value.read() == b'{"error":"policy first refused the request"}'


def test_each_answer_of_a_stream_passes_the_filter(gateway: GatewayProcess) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            inputs, a = _inputs(grpcclient)
            client.async_stream_infer("simple", inputs, request_id="s-1")
            client.async_stream_infer("simple", inputs, request_id="s-2", parameters={"stamp_refuse": True})
            client.async_stream_infer("simple", inputs, request_id="s-3", parameters={"stamp_early": True})
            got = {}
            for _ in range(3):
                result, error = answers.get(timeout=10)
                if error is not None:
                    got["error"] = str(error)
                else:
                    got[result.get_response().id] = result
        finally:
            client.stop_stream()
    np.testing.assert_array_equal(got["s-1"].as_numpy("STAMP"), [7])
    np.testing.assert_array_equal(got["s-1"].as_numpy("OUTPUT0"), a + a)
    np.testing.assert_array_equal(got["s-3"].as_numpy("EARLY"), [7])
    assert "policy first refused the request" in got["error"]


# --- the config ------------------------------------------------------------------


def _config(policies: str, route_policies: str) -> dict[str, Any]:
    import yaml

    text = f"""
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams: [{{name: local, protocol: builtin}}]
policies: {policies}
routes: [{{match: {{model: "*"}}, upstream: local, policies: {route_policies}}}]
"""
    return dict(yaml.safe_load(text))


@pytest.mark.parametrize(("policies", "route_policies", "problem"), [
    ('[{name: a, no_such_filter: {}}]', "[a]", "policies[0].no_such_filter: unknown filter kind 'no_such_filter'"),
    ('[{name: a}]', "[]", "policies[0]: needs exactly one filter kind beside 'name'"),
    ('[]', "[missing]", "routes[0].policies[0]: no policy named 'missing'"),
    ('[a]', "[]", "policies[0]: must be a mapping"),
])
def test_bad_policies_are_config_errors(policies: str, route_policies: str, problem: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(_config(policies, route_policies))
    assert any(p.startswith(problem) for p in error.value.problems), error.value.problems


def test_a_registered_filter_is_a_known_kind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gateway.dataplane.filters import registry

    monkeypatch.setitem(registry.FILTERS, *REGISTRY_LINE)
    config = parse_config(_config("[{name: a, stamp: {mark: 3}}, {name: b, stamp: null}]", "[b, a]"))
    assert [(p.name, p.kind, p.options) for p in config.policies] == [("a", "stamp", 3), ("b", "stamp", 1)]
    assert config.routes[0].policies == ("b", "a")
    with pytest.raises(ConfigError) as error:
        parse_config(_config("[{name: a, stamp: {mark: 3}}, {name: a, stamp: {}}]", "[a, a]"))
    assert "policies[1].name: a policy named 'a' is defined twice" in error.value.problems
    assert "routes[0].policies[1]: policy 'a' is listed twice" in error.value.problems


def test_grpc_refusal_carries_the_retry_pushback(gateway: GatewayProcess) -> None:
    """A refusal that says when to retry tells a gRPC client too: the
    server pushback of gRPC's retry design (grpc-retry-pushback-ms)."""
    import grpc
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="simple")
    request.parameters["stamp_refuse"].bool_param = True
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(range(16))
    with grpc.insecure_channel(gateway.url("grpc")) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                    response_deserializer=service_pb2.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as refused:
            infer(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(refused.value.trailing_metadata())["grpc-retry-pushback-ms"] == "7000"
