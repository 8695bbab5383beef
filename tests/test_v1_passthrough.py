"""V1 client -> gateway -> V1 server: a body the V1 listener cannot turn
into tensors (ragged instances a KServe custom model takes) goes up as it
is and its answer comes back as it is; toward any other upstream it stays
a 400. The body is still bounded and routed by the model name in the URL.

Behind the gateway (its own process): the real KServe ModelServer
(tests/peers/kserve.py) with the custom models of tests/peers/kserve_models.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import requests

from peers.kserve import KServePeer, kserve  # noqa: F401 - the session-wide KServe fixture
from support import GatewayProcess, write_config

# The ragged instances of a custom model (KServe V1 answers them; no tensors can hold them).
RAGGED = {"instances": [{"a": 1.5, "b": 2.0}, {"a": [1, 2], "b": [3, 5]}]}
MAX_BODY = 64 << 10


def config(peer: KServePeer) -> str:
    return f"""
admin: {{address: null}}
limits: {{max_request_bytes: {MAX_BODY}, max_inflight_bytes: 1MiB}}
listeners:
  - {{name: v1, protocol: v1-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin, models: [identity]}}
  - name: kserve
    protocol: v1-rest
    endpoints: ["{peer.address}"]
    models:
      summer:
        inputs: [{{name: a, datatype: FP32, shape: [-1, 2]}}, {{name: b, datatype: FP32, shape: [-1, 1]}}]
        outputs: [{{name: sum, datatype: FP64, shape: [-1]}}]
  - name: kserve-translated
    protocol: v1-rest
    endpoints: ["{peer.address}"]
    passthrough: false
routes:
  - {{match: {{model: identity}}, upstream: local}}
  - {{match: {{model: summer-alias}}, upstream: kserve, rewrite: {{model: summer}}}}
  - {{match: {{model: summer-translated}}, upstream: kserve-translated, rewrite: {{model: summer}}}}
  - {{match: {{model: "*"}}, upstream: kserve}}
"""


@pytest.fixture(scope="module")
def gateway(kserve: KServePeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:  # noqa: F811
    directory = tmp_path_factory.mktemp("v1-passthrough")
    with GatewayProcess(write_config(directory, config(kserve)), directory / "gateway.log") as gw:
        yield gw


def predict(gateway: GatewayProcess, model: str, body: Any) -> requests.Response:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return requests.post(f"http://{gateway.url('v1')}/v1/models/{model}:predict", data=data, timeout=30)


def test_ragged_instances_reach_a_v1_server(gateway: GatewayProcess, kserve: KServePeer) -> None:  # noqa: F811
    """KServe's answer to the ragged instances, as KServe wrote it: the sum
    of each instance (a tensor answer) and the instances echoed (no tensor)."""
    reply = predict(gateway, "summer", RAGGED)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"predictions": [3.5, 11.0]}
    seen = len(kserve.echo_calls())
    body = orjson.dumps({**RAGGED, "parameters": {"tag": "t"}})
    echoed = predict(gateway, "echo", body)
    assert echoed.status_code == 200, echoed.text
    assert echoed.json() == {"predictions": RAGGED["instances"]}
    assert kserve.echo_calls()[seen:] == [orjson.loads(body)]  # what the client sent, all of it


def test_the_route_still_decides(gateway: GatewayProcess) -> None:
    """Routed by the model in the URL before the body is read: a rewrite
    holds, an unknown model is 404, and a V1 server's own refusal is its
    error in V1 form."""
    reply = predict(gateway, "summer-alias", RAGGED)
    assert reply.status_code == 200 and reply.json() == {"predictions": [3.5, 11.0]}, reply.text
    unknown = predict(gateway, "nope", RAGGED)
    assert unknown.status_code == 404 and "unknown model" in unknown.json()["error"], unknown.text
    refused = predict(gateway, "summer", {"instances": [{"a": "x"}, {"a": [1]}]})  # KServe's InvalidInput
    assert refused.status_code == 400 and "not a number" in refused.json()["error"], refused.text


@pytest.mark.parametrize(("model", "body"), [("identity", {"instances": [[1.5], [1, 2]]}),
                                           ("summer-translated", RAGGED)])
def test_other_upstreams_still_refuse_it(gateway: GatewayProcess, model: str, body: Any) -> None:
    """A builtin (V2) model, and a V1 server with pass-through off: the
    listener's own 400, before anything goes upstream."""
    reply = predict(gateway, model, body)
    assert reply.status_code == 400 and "ragged values" in reply.json()["error"], reply.text


def ragged_body(size: int) -> bytes:
    """Ragged instances, about ``size`` bytes."""
    rows = [{"a": [1.0] * (i % 7 + 1)} for i in range(size // 24)]  # 24 bytes a row on average
    return orjson.dumps({"instances": rows})


def test_the_body_is_still_bounded(gateway: GatewayProcess, kserve: KServePeer) -> None:  # noqa: F811
    """Over limits.max_request_bytes, or needing more of the memory budget
    than there is (what parsing it could build): 413, and the V1 server
    never sees it."""
    seen = len(kserve.echo_calls())
    reply = predict(gateway, "echo", ragged_body(MAX_BODY + 8192))
    assert reply.status_code == 413 and "exceeds the limit" in reply.json()["error"], reply.text
    body = ragged_body(MAX_BODY - 8192)
    assert len(body) <= MAX_BODY
    reply = predict(gateway, "echo", body)
    assert reply.status_code == 413 and "limits.max_inflight_bytes" in reply.json()["error"], reply.text
    assert predict(gateway, "echo", RAGGED).status_code == 200  # the listener goes on
    assert len(kserve.echo_calls()) == seen + 1
