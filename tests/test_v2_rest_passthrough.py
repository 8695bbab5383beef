"""V2 REST -> V2 REST pass-through: the client's bytes go upstream unchanged
and the upstream's bytes come back unchanged.

The gateway runs in its own process; the upstreams are recording stand-ins
(peers/rest_standin.py: no real server reports the bytes it got or
answers bytes a test chose) and the builtin models. The fallbacks against
a real MLServer are in test_v2_rest_passthrough_mlserver.py.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import requests
import tritonclient.http as httpclient

from peers.rest_standin import HEADER_LENGTH, Answer, RecordingUpstream
from support import GatewayProcess, passthrough_counts, wait_for, write_config

# What the gateway would never write itself: spaces, its own key order,
# fields and parameters it does not know.
JSON_ANSWER = (b'{"id": "from-upstream", "outputs": [{"shape": [2], "name": "OUT", "datatype": "FP32", '
               b'"data": [1.5, 2.5], "parameters": {"note": "kept"}}], "model_version": "7", '
               b'"model_name": "json", "parameters": {"extra": [1, 2]}, "unknown_field": null}')
BINARY_HEAD = (b'{"model_name": "binary", "outputs": [{"name": "OUT", "datatype": "INT32", "shape": [3], '
               b'"parameters": {"binary_data_size": 12}}], "parameters": {"extra": true}}')
BINARY_ANSWER = BINARY_HEAD + np.array([7, 8, 9], dtype="<i4").tobytes()
BIG_ANSWER = (b'{"model_name": "big", "outputs": [{"name": "OUT", "datatype": "INT32", "shape": [400], '
              b'"data": [' + b", ".join(str(i).encode() for i in range(400)) + b"]}]}")
# A client body the gateway would write differently (spaces, an extra parameter).
JSON_REQUEST = (b'{ "id": "req-1", "parameters": {"custom": {"nested": [1, true]}}, "inputs": [ '
                b'{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [' +
                b", ".join(str(i).encode() for i in range(16)) + b"]}, "
                b'{"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [' +
                b", ".join(b"1" for _ in range(16)) + b"]} ] }")


def binary_request(values: np.ndarray, extra: dict[str, Any] | None = None) -> tuple[bytes, int]:
    head = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": list(values.shape),
                                     "parameters": {"binary_data_size": values.nbytes}}],
                         "parameters": {"binary_data_output": True, **(extra or {})}})
    return head + values.astype("<i4").tobytes(), len(head)


@pytest.fixture(scope="module")
def triton_like() -> Iterator[RecordingUpstream]:
    server = RecordingUpstream(binary=True).start()
    server.answers = {"json": Answer(JSON_ANSWER), "binary": Answer(BINARY_ANSWER, header_length=len(BINARY_HEAD)),
                      "big": Answer(BIG_ANSWER), "broken": Answer(b'{"error": "no such tensor"}', status=400)}
    yield server
    server.stop()


@pytest.fixture(scope="module")
def json_only() -> Iterator[RecordingUpstream]:
    server = RecordingUpstream(binary=False).start()
    server.answers = {"json": Answer(JSON_ANSWER)}
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(triton_like: RecordingUpstream, json_only: RecordingUpstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("passthrough")
    config = f"""
admin: {{address: "127.0.0.1:0"}}
observability:
  access_log: {{format: json, destination: "{directory / 'access.log'}"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: triton, protocol: v2-rest, endpoints: ["{triton_like.address}"]}}
  - {{name: jsononly, protocol: v2-rest, endpoints: ["{json_only.address}"]}}
  - {{name: translating, protocol: v2-rest, endpoints: ["{triton_like.address}"], passthrough: false}}
  - {{name: local, protocol: builtin}}
routes:
  - {{match: {{model: alias}}, upstream: triton, rewrite: {{model: json}}}}
  - {{match: {{model: alias-binary}}, upstream: triton, rewrite: {{model: binary, version: "3"}}}}
  - {{match: {{model: route-off}}, upstream: triton, rewrite: {{model: json}},
     options: {{v2-rest: {{passthrough: false}}}}}}
  - {{match: {{model: upstream-off}}, upstream: translating, rewrite: {{model: json}}}}
  - {{match: {{model: flaky}}, upstream: triton, retry: {{attempts: 2, retry_on: [unavailable], backoff: 0.001}}}}
  - {{match: {{model: simple}}, split: [{{upstream: local, weight: 50}}, {{upstream: triton, weight: 50}}],
     sticky_header: x-user}}
  - {{match: {{model: mirrored}}, upstream: triton, mirror: {{upstream: jsononly}}}}
  - {{match: {{model: shadowed}}, upstream: local, rewrite: {{model: simple}}, mirror: {{upstream: triton}}}}
  - {{match: {{model: json-only}}, upstream: jsononly, rewrite: {{model: json}}}}
  - {{match: {{model: "[a-z]*"}}, upstream: triton}}
"""
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


def post(gateway: GatewayProcess, model: str, body: bytes, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(f"http://{gateway.url()}/v2/models/{model}/infer", data=body, headers=headers or {},
                         timeout=10)




def access_log(gateway: GatewayProcess) -> list[dict[str, Any]]:
    path = Path(gateway.config_path).parent / "access.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- bytes unchanged, both ways -------------------------------------------------------


def test_json_request_and_answer_pass_unchanged(gateway: GatewayProcess, triton_like: RecordingUpstream) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    reply = post(gateway, "json", JSON_REQUEST, {"x-request-id": "rid-json", "traceparent": traceparent,
                                                 "Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert reply.content == JSON_ANSWER
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.headers["x-request-id"] == "rid-json"
    seen = triton_like.seen_for("json")[-1]
    assert seen.body == JSON_REQUEST
    assert seen.path == "/v2/models/json/infer"
    assert seen.headers["x-request-id"] == "rid-json" and seen.headers["traceparent"] == traceparent
    assert HEADER_LENGTH.lower() not in seen.headers
    line = wait_for(lambda: [x for x in access_log(gateway) if x["request_id"] == "rid-json"], 5, "the access log")
    assert line[0]["passthrough"] == "verbatim"


def test_binary_request_and_answer_pass_unchanged(gateway: GatewayProcess, triton_like: RecordingUpstream) -> None:
    body, head_length = binary_request(np.arange(6, dtype=np.int32).reshape(2, 3), {"custom": "x"})
    reply = post(gateway, "binary", body, {HEADER_LENGTH: str(head_length)})
    assert reply.status_code == 200, reply.text
    assert reply.content == BINARY_ANSWER
    assert reply.headers[HEADER_LENGTH] == str(len(BINARY_HEAD))
    assert reply.headers["Content-Type"] == "application/octet-stream"
    seen = triton_like.seen_for("binary")[-1]
    assert seen.body == body and seen.headers[HEADER_LENGTH.lower()] == str(head_length)
    # and what tritonclient makes of it (binary in, binary out)
    with httpclient.InferenceServerClient(gateway.url()) as client:
        item = httpclient.InferInput("INPUT0", [4], "INT32")
        item.set_data_from_numpy(np.arange(4, dtype=np.int32))
        result = client.infer("binary", [item], outputs=[httpclient.InferRequestedOutput("OUT")])
    np.testing.assert_array_equal(result.as_numpy("OUT"), [7, 8, 9])
    assert triton_like.seen_for("binary")[-1].headers[HEADER_LENGTH.lower()]  # tritonclient's binary body went up


def test_gzip_both_ways(gateway: GatewayProcess, triton_like: RecordingUpstream) -> None:
    """A gzip body is inflated (under the size limit) and forwarded plain;
    an answer over 1 KiB is compressed for a client that accepts gzip."""
    reply = post(gateway, "big", gzip.compress(JSON_REQUEST), {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["Content-Encoding"] == "gzip"
    assert reply.content == BIG_ANSWER  # requests inflates it
    seen = triton_like.seen_for("big")[-1]
    assert seen.body == JSON_REQUEST and "content-encoding" not in seen.headers
    plain = post(gateway, "big", JSON_REQUEST, {"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers and plain.content == BIG_ANSWER


# --- rewrites: the path changes, the bytes do not ------------------------------------


def test_rewrite_forwards_the_bytes_and_names_the_model_asked_for(gateway: GatewayProcess,
                                                                   triton_like: RecordingUpstream) -> None:
    reply = post(gateway, "alias", JSON_REQUEST)
    assert reply.status_code == 200, reply.text
    assert triton_like.seen_for("json")[-1].body == JSON_REQUEST
    answer, upstream = orjson.loads(reply.content), orjson.loads(JSON_ANSWER)
    assert answer == {**upstream, "model_name": "alias"}
    assert list(answer) == list(upstream)  # keys keep their order; unknown ones stay


def test_rewrite_of_a_binary_answer_keeps_its_tensor_bytes(gateway: GatewayProcess,
                                                           triton_like: RecordingUpstream) -> None:
    body, head_length = binary_request(np.arange(3, dtype=np.int32))
    reply = post(gateway, "alias-binary", body, {HEADER_LENGTH: str(head_length)})
    assert reply.status_code == 200, reply.text
    seen = triton_like.seen_for("binary")[-1]
    assert seen.path == "/v2/models/binary/versions/3/infer" and seen.body == body
    length = int(reply.headers[HEADER_LENGTH])
    head = orjson.loads(reply.content[:length])
    assert head == {**orjson.loads(BINARY_HEAD), "model_name": "alias-binary", "model_version": ""}
    assert reply.content[length:] == BINARY_ANSWER[len(BINARY_HEAD):]


# --- when bytes are not forwarded ----------------------------------------------------


@pytest.mark.parametrize("model", ["route-off", "upstream-off"])
def test_passthrough_can_be_turned_off(gateway: GatewayProcess, triton_like: RecordingUpstream, model: str) -> None:
    reply = post(gateway, model, JSON_REQUEST)
    assert reply.status_code == 200, reply.text
    seen = triton_like.seen_for("json")[-1]
    length = int(seen.headers[HEADER_LENGTH.lower()])  # re-encoded, with binary tensors for this server
    assert np.frombuffer(seen.body[length:], dtype="<i4").tolist() == list(range(16)) + [1] * 16
    assert reply.content != JSON_ANSWER  # re-encoded by the gateway
    assert orjson.loads(reply.content)["outputs"][0]["data"] == [1.5, 2.5]
    assert passthrough_counts(gateway).get(("triton" if model == "route-off" else "translating", "translated"), 0) >= 1


def test_binary_body_to_a_json_only_server_is_translated(gateway: GatewayProcess,
                                                         json_only: RecordingUpstream) -> None:
    """The server lists no binary extension: the gateway sends it JSON and
    writes the answer in the binary form the client asked for."""
    body, head_length = binary_request(np.arange(4, dtype=np.int32))
    reply = post(gateway, "json-only", body, {HEADER_LENGTH: str(head_length)})
    assert reply.status_code == 200, reply.text
    sent = json_only.seen_for("json")[-1]
    assert HEADER_LENGTH.lower() not in sent.headers
    assert orjson.loads(sent.body)["inputs"][0]["data"] == [0, 1, 2, 3]
    length = int(reply.headers[HEADER_LENGTH])
    assert np.frombuffer(reply.content[length:], dtype="<f4").tolist() == [1.5, 2.5]


def test_output_choices_a_json_only_server_cannot_honour_are_made_by_the_gateway(
        gateway: GatewayProcess, json_only: RecordingUpstream) -> None:
    """Bytes go up unchanged, but a JSON-only server neither writes binary
    outputs nor (MLServer) selects outputs: the gateway does both."""
    request = orjson.loads(JSON_REQUEST)
    request["outputs"] = [{"name": "OUT", "parameters": {"binary_data": True}}]
    body = orjson.dumps(request)
    reply = post(gateway, "json-only", body)
    assert reply.status_code == 200, reply.text
    assert json_only.seen_for("json")[-1].body == body
    length = int(reply.headers[HEADER_LENGTH])
    assert np.frombuffer(reply.content[length:], dtype="<f4").tolist() == [1.5, 2.5]
    request["outputs"] = [{"name": "MISSING"}]
    reply = post(gateway, "json-only", orjson.dumps(request))
    assert reply.status_code == 400 and "unexpected inference output 'MISSING'" in reply.json()["error"]
    assert passthrough_counts(gateway).get(("jsononly", "request_only"), 0) >= 2


# --- validation and errors stay the gateway's ----------------------------------------


def test_a_bad_body_is_refused_before_anything_goes_upstream(gateway: GatewayProcess,
                                                             triton_like: RecordingUpstream) -> None:
    before = len(triton_like.seen_for("json"))
    bad = JSON_REQUEST.replace(b'"shape": [1, 16]', b'"shape": [1, 15]', 1)
    reply = post(gateway, "json", bad)
    assert reply.status_code == 400
    assert reply.json() == {"error": "input 'INPUT0': has 16 data elements but shape [1, 15] needs 15"}
    body, head_length = binary_request(np.arange(4, dtype=np.int32))
    reply = post(gateway, "json", body[:-1], {HEADER_LENGTH: str(head_length)})
    assert reply.status_code == 400 and "overruns the binary data" in reply.json()["error"]
    assert len(triton_like.seen_for("json")) == before


def test_an_unknown_model_is_404_before_its_body_is_read_as_a_request(gateway: GatewayProcess) -> None:
    reply = post(gateway, "NO-ROUTE", b"this is not JSON")
    assert reply.status_code == 404
    assert reply.json() == {"error": "Request for unknown model: 'NO-ROUTE' is not found"}


def test_upstream_errors_are_mapped_not_passed_through(gateway: GatewayProcess) -> None:
    reply = post(gateway, "broken", JSON_REQUEST)
    assert reply.status_code == 400
    assert reply.json()["error"].endswith("answered 400: no such tensor")


def test_a_retry_sends_the_same_bytes_again(gateway: GatewayProcess, triton_like: RecordingUpstream) -> None:
    triton_like.failures["flaky"] = 1
    reply = post(gateway, "flaky", JSON_REQUEST)
    assert reply.status_code == 200, reply.text
    assert [s.body for s in triton_like.seen_for("flaky")] == [JSON_REQUEST, JSON_REQUEST]


# --- splits and mirrors ----------------------------------------------------------------


def test_a_split_between_builtin_and_rest_serves_both_sides(gateway: GatewayProcess,
                                                            triton_like: RecordingUpstream) -> None:
    # x-user "a" hashes below 50 (builtin side), "c" above (the REST side).
    builtin = post(gateway, "simple", JSON_REQUEST, {"x-user": "a"})
    assert builtin.status_code == 200, builtin.text
    outputs = {o["name"]: o["data"] for o in builtin.json()["outputs"]}
    assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]
    before = len(triton_like.seen_for("simple"))
    rest = post(gateway, "simple", JSON_REQUEST, {"x-user": "c"})
    assert rest.status_code == 200, rest.text
    assert triton_like.seen_for("simple")[before:][0].body == JSON_REQUEST
    assert rest.json()["outputs"][0]["data"] == [len(JSON_REQUEST)]


def test_mirrors_get_the_bytes_or_a_translation(gateway: GatewayProcess, triton_like: RecordingUpstream,
                                                json_only: RecordingUpstream) -> None:
    """A shadow of the same protocol gets the client's bytes; one that
    cannot take them (binary to a JSON-only server) gets a translation."""
    assert post(gateway, "mirrored", JSON_REQUEST).status_code == 200
    wait_for(lambda: json_only.seen_for("mirrored"), 5, "the mirror copy")
    assert json_only.seen_for("mirrored")[-1].body == JSON_REQUEST
    body, head_length = binary_request(np.arange(5, dtype=np.int32))
    reply = post(gateway, "mirrored", body, {HEADER_LENGTH: str(head_length)})
    assert reply.status_code == 200
    assert triton_like.seen_for("mirrored")[-1].body == body
    def translated_copy() -> bool:
        shadow = json_only.seen_for("mirrored")[-1]
        return HEADER_LENGTH.lower() not in shadow.headers and b'"data":[0,1,2,3,4]' in shadow.body

    wait_for(translated_copy, 5, "the translated mirror copy")


def test_a_builtin_primary_mirrors_the_bytes_to_a_rest_shadow(gateway: GatewayProcess,
                                                              triton_like: RecordingUpstream) -> None:
    body = JSON_REQUEST.replace(b'"req-1"', b'"req-shadow"')
    reply = post(gateway, "shadowed", body)
    assert reply.status_code == 200 and reply.json()["model_name"] == "shadowed"
    wait_for(lambda: any(s.body == body for s in triton_like.seen_for("simple")), 5, "the mirror copy")


def test_passthrough_is_counted(gateway: GatewayProcess) -> None:
    before = passthrough_counts(gateway)
    assert post(gateway, "json", JSON_REQUEST).status_code == 200
    assert post(gateway, "alias", JSON_REQUEST).status_code == 200

    def counted() -> bool:
        after = passthrough_counts(gateway)
        keys = (("triton", "verbatim"), ("triton", "renamed"))
        return all(after.get(key, 0) == before.get(key, 0) + 1 for key in keys)

    wait_for(counted, 5, "the pass-through counter")
