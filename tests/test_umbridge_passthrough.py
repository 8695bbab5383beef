"""UM-Bridge -> UM-Bridge pass-through: a client's Evaluate goes upstream as
the bytes it sent and the upstream's answer comes back as the bytes it
sent, once both are checked (bench scenario e measures it).

The gateway runs in its own process. Upstreams: the reference server
(``umbridge.serve_models``, peers/umbridge_peer.py) and a stand-in that
records the bytes it got and answers bytes a test chose
(peers/umbridge_standin.py): no real server does either, and broken
answers need one that can be told to break.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import requests
import umbridge

from peers.umbridge_peer import UmbridgePeer
from peers.umbridge_standin import StandinModel, UmbridgeStandin
from support import GatewayProcess, passthrough_counts, write_config

BIG = 65_536  # values of scenario (e)

# What the gateway would never write itself: spaces, its own key order, an
# unknown field, integers.
ODD_CALL = b'{ "input" : [ [1, 2.50] ], "extra": {"kept": [true, null]},\n  "name" : "rec", "config": {} }'
ODD_ANSWER = b'{"note": "from the stand-in", "output": [ [ 1.0e0, 2 ] ] }'


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UmbridgePeer]:
    with UmbridgePeer(tmp_path_factory.mktemp("umbridge-peer")) as server:
        yield server


@pytest.fixture(scope="module")
def standin() -> Iterator[UmbridgeStandin]:
    server = UmbridgeStandin().start()
    server.models = {"rec": StandinModel([2], [2], ODD_ANSWER), "odd": StandinModel([2], [2], ODD_ANSWER),
                     "wide": StandinModel([2], [BIG], ODD_ANSWER), "long": StandinModel([20_001], [2], ODD_ANSWER)}
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, peer: UmbridgePeer,
            standin: UmbridgeStandin) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("umbridge-passthrough")
    config = f"""
admin: {{address: "127.0.0.1:0"}}
limits: {{max_request_bytes: 2MiB, max_inflight_bytes: 16MiB, max_json_depth: 16, max_json_containers: 1000}}
listeners:
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: peer, protocol: umbridge, endpoints: ["{peer.address}"], keepalive: true}}
  - {{name: peer_off, protocol: umbridge, endpoints: ["{peer.address}"], keepalive: true, passthrough: false}}
  - {{name: standin, protocol: umbridge, endpoints: ["{standin.address}"], keepalive: true}}
  - {{name: local, protocol: builtin}}
routes:
  - {{match: {{model: square}}, upstream: peer}}
  - {{match: {{model: square_alias}}, upstream: peer, rewrite: {{model: square}}}}
  - {{match: {{model: square_off}}, upstream: peer_off, rewrite: {{model: square}}}}
  - {{match: {{model: {{regex: "evaluate_only|gradient_only"}}}}, upstream: peer}}
  - match: {{model: evaluate_swapped}}
    upstream: peer
    rewrite: {{model: evaluate_only}}
    options: {{umbridge: {{inputs: [input_1, input_0], outputs: [output_1, output_0]}}}}
  - match: {{model: evaluate_fd}}
    upstream: peer
    rewrite: {{model: evaluate_only}}
    options: {{umbridge: {{finite_differences: true}}}}
  - {{match: {{model: rec_alias}}, upstream: standin, rewrite: {{model: rec}}}}
  - {{match: {{model: {{regex: "rec|odd|wide|long"}}}}, upstream: standin}}
  - {{match: {{model: "*"}}, upstream: local}}
"""
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


def post(address: str, body: bytes, endpoint: str = "Evaluate") -> requests.Response:
    return requests.post(f"http://{address}/{endpoint}", data=body, timeout=30)


def evaluate(gateway: GatewayProcess, body: bytes) -> requests.Response:
    return post(gateway.url("umb"), body)


def error_of(response: requests.Response) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    return response.status_code, body["error"]["type"], body["error"]["message"]


def square_call(name: str, values: int, **extra: Any) -> bytes:
    return orjson.dumps({"name": name, "input": [np.linspace(0, 1, values).tolist()],
                         "config": {"n": values}, **extra})


class Counted:
    """The pass-through counter's change over a block, by (upstream, mode)."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.gateway = gateway

    def __enter__(self) -> Counted:
        self.before = passthrough_counts(self.gateway)
        return self

    def __exit__(self, *exc: Any) -> None:
        after = passthrough_counts(self.gateway)
        self.delta = {key: after[key] - self.before.get(key, 0.0) for key in after
                      if after[key] != self.before.get(key, 0.0)}


# --- the bytes, both ways ----------------------------------------------------------


def test_client_bytes_go_up_and_upstream_bytes_come_back(gateway: GatewayProcess, standin: UmbridgeStandin) -> None:
    before = len(standin.evaluations())
    with Counted(gateway) as counted:
        reply = evaluate(gateway, ODD_CALL)
    assert reply.status_code == 200, reply.text
    assert reply.content == ODD_ANSWER
    assert reply.headers["Content-Type"].startswith("application/json") and reply.headers["x-request-id"]
    assert standin.evaluations()[before:] == [ODD_CALL]
    assert counted.delta == {("standin", "verbatim"): 1}


@pytest.mark.parametrize("values", [1, 1000, BIG])
def test_reference_server_answer_is_relayed_unchanged(gateway: GatewayProcess, peer: UmbridgePeer,
                                                      values: int) -> None:
    """Bodies of every size (the fast reader reads those of 64 KiB and more)."""
    body = square_call("square", values)
    direct = post(peer.address, body)
    with Counted(gateway) as counted:
        reply = evaluate(gateway, body)
    assert reply.status_code == direct.status_code == 200
    assert reply.content == direct.content
    assert counted.delta == {("peer", "verbatim"): 1}


def test_passthrough_off_translates_to_the_same_values(gateway: GatewayProcess, peer: UmbridgePeer) -> None:
    body = square_call("square_off", BIG)
    with Counted(gateway) as counted:
        reply = evaluate(gateway, body)
    direct = post(peer.address, square_call("square", BIG))
    assert reply.status_code == 200
    assert reply.content != direct.content  # the gateway's own writing ...
    assert reply.json() == direct.json()  # ... of the same numbers
    assert counted.delta == {("peer_off", "translated"): 1}


def test_httpmodel_through_the_pass_through(gateway: GatewayProcess) -> None:
    model = umbridge.HTTPModel(f"http://{gateway.url('umb')}", "square")
    assert model([[1.0, 2.0, -3.0]], {"scale": 2.0}) == [[2.0, 8.0, 18.0]]


# --- a route's rewrite -------------------------------------------------------------------


def test_renamed_model_goes_up_with_the_upstream_name(gateway: GatewayProcess, peer: UmbridgePeer,
                                                      standin: UmbridgeStandin) -> None:
    body = square_call("square_alias", BIG)
    with Counted(gateway) as counted:
        reply = evaluate(gateway, body)
    assert reply.content == post(peer.address, square_call("square", BIG)).content
    assert counted.delta == {("peer", "renamed"): 1}

    odd = ODD_CALL.replace(b'"rec"', b'"rec_alias"')
    before = len(standin.evaluations())
    with Counted(gateway) as counted:
        reply = evaluate(gateway, odd)
    assert reply.content == ODD_ANSWER
    assert standin.evaluations()[before:] == [ODD_CALL]  # only the name changed, byte for byte
    assert counted.delta == {("standin", "renamed"): 1}


@pytest.mark.parametrize("config", [{"name": "rec_alias"}, {"note": "caf\u00e9 \\ backslash"}])
def test_rename_that_cannot_be_spliced_is_translated(gateway: GatewayProcess, standin: UmbridgeStandin,
                                                     config: dict[str, Any]) -> None:
    """A second "name" key, or escapes: the name is not found without a
    parse, so the call is written again (with the upstream's name)."""
    body = json.dumps({"name": "rec_alias", "input": [[1.0, 2.0]], "config": config}).encode()
    assert b"\\" in body or body.count(b'"name"') == 2
    before = len(standin.evaluations())
    with Counted(gateway) as counted:
        reply = evaluate(gateway, body)
    assert reply.status_code == 200 and reply.json() == {"output": [[1.0, 2.0]]}
    (sent,) = standin.evaluations()[before:]
    assert json.loads(sent) == {"name": "rec", "input": [[1.0, 2.0]], "config": config}
    assert counted.delta == {("standin", "translated"): 1}


def test_tensor_mapping_on_the_route_is_translated(gateway: GatewayProcess) -> None:
    """Inputs and outputs reordered by the route: the bytes cannot go as they are."""
    a, b, c, d = 1.0, 2.0, 0.5, 3.0
    with Counted(gateway) as counted:
        reply = evaluate(gateway, orjson.dumps({"name": "evaluate_swapped", "input": [[d], [a, b, c]]}))
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"output": [[a + b + c + d], [a * d + b * b, math.exp(c)]]}
    assert counted.delta == {("peer", "translated"): 1}


# --- what is translated instead ----------------------------------------------------


@pytest.mark.parametrize(("model", "vector"), [("rec", b"null, 2"), ("rec", b"NaN, 2"),
                                              ("long", b"1.5, " * 20_000 + b"null")])
def test_non_finite_inputs_are_translated(gateway: GatewayProcess, standin: UmbridgeStandin, model: str,
                                          vector: bytes) -> None:
    """null (NaN from the C++ clients) or NaN (Python's) is written by the
    upstream's own ``nonfinite`` policy (literal, default), as without the
    pass-through."""
    before = len(standin.evaluations())
    with Counted(gateway) as counted:
        reply = evaluate(gateway, b'{"name": "%s", "input": [[%s]]}' % (model.encode(), vector))
    assert reply.status_code == 200 and reply.content != ODD_ANSWER  # the answer is the gateway's writing too
    assert reply.json() == {"output": [[1.0, 2.0]]}
    (sent,) = standin.evaluations()[before:]
    assert b"NaN" in sent and b"null" not in sent
    assert counted.delta == {("standin", "translated"): 1}


def test_repeated_keys_are_translated(gateway: GatewayProcess, standin: UmbridgeStandin) -> None:
    """The gateway reads the last of two keys, an upstream may read the
    first: it gets what the gateway checked."""
    body = b'{"name": "rec", "input": [[7, 8]], "config": {"a": 1, "a": 2}, "input": [[1, 2]]}'
    before = len(standin.evaluations())
    with Counted(gateway) as counted:
        assert evaluate(gateway, body).status_code == 200
    (sent,) = standin.evaluations()[before:]
    assert json.loads(sent) == {"name": "rec", "input": [[1.0, 2.0]], "config": {"a": 2}}
    assert counted.delta == {("standin", "translated"): 1}


@pytest.mark.parametrize(("answer", "mode", "expected"), [
    (b'{"output": [[1, 2]], "extra": [3]}', "verbatim", None),
    (b'{"output": [[NaN, 2]]}', "request_only", [[None, 2.0]]),  # Python json's literal
    (b'{"output": [[nan, 2]]}', "request_only", [[None, 2.0]]),  # the Python reference server's repr
    (b'{"output": [[null, 2]]}', "request_only", [[None, 2.0]]),  # nlohmann's: NaN leaves by the listener's policy
    (b'{"output": [[5, 6]], "output": [[1, 2]]}', "request_only", [[1.0, 2.0]]),  # the client might read the first
    (b'{"output": [[1, 2], [3]]}', "request_only", [[1.0, 2.0]]),  # a vector beyond OutputSizes: dropped
])
def test_answers_that_are_written_again(gateway: GatewayProcess, standin: UmbridgeStandin, answer: bytes,
                                        mode: str, expected: list[list[float | None]] | None) -> None:
    standin.models["odd"].answers = [answer]
    with Counted(gateway) as counted:
        reply = evaluate(gateway, b'{"name": "odd", "input": [[1, 2]]}')
    assert reply.status_code == 200, reply.text
    if expected is None:
        assert reply.content == answer
    else:
        assert reply.json() == {"output": expected} and reply.content != answer
    assert counted.delta == {("standin", mode): 1}


# --- checks that stay -------------------------------------------------------------------

BAD_CALLS = [
    (b'{"name": "rec", "input": [[1, 2, 3]]}', "vector 0 has length 3 but the model expects 2"),
    (b'{"name": "rec", "input": [[1, true]]}', "must hold only numbers, found a boolean"),
    (b'{"name": "rec", "input": [[1, "2"]]}', "must hold only numbers, found a string"),
    (b'{"name": "rec", "input": [[1, [2]]]}', "must hold only numbers, found a list"),
    (b'{"name": "rec", "input": [[1, 2], [3]]}', "has 2 vectors but the model takes 1"),
    (b'{"name": "rec"}', "missing 'input'"),
    (b'{"name": "rec", "input": [[1, 2]], "config": []}', "'config' must be a JSON object"),
    (b'{"input": [[1, 2]]}', "no model 'name'"),
    (b'{"name": "rec", "input": [[1, 2]', "not valid JSON"),
    # Big: the fast reader hands such texts to the codec, which says what is wrong.
    (b'{"name": "long", "input": [[' + b"1.5, " * 20_000 + b'true]]}', "found a boolean"),
    (b'{"name": "long", "input": [[' + b"1.5, " * 20_000 + b'[1]]]}', "found a list"),
    (b'{"name": "long", "input": [[' + b"1.5, " * 20_000 + b'null], [1]]}', "has 2 vectors but the model takes 1"),
]


@pytest.mark.parametrize(("body", "message"), BAD_CALLS)
def test_bad_calls_are_refused_before_anything_goes_up(gateway: GatewayProcess, standin: UmbridgeStandin,
                                                       body: bytes, message: str) -> None:
    before = len(standin.evaluations())
    with Counted(gateway) as counted:
        reply = evaluate(gateway, body)
    status, kind, text = error_of(reply)
    assert (status, kind) == (400, "InvalidInput") and message in text, text
    assert standin.evaluations()[before:] == [] and counted.delta == {}


def test_unknown_model_and_feature_keep_the_reference_order(gateway: GatewayProcess) -> None:
    """Model, then feature, then inputs (all wrong here)."""
    assert error_of(evaluate(gateway, b'{"name": "nope", "input": [[true]]}'))[1] == "ModelNotFound"
    assert error_of(evaluate(gateway, b'{"name": "gradient_only", "input": [[true]]}'))[1] == "UnsupportedFeature"


@pytest.mark.parametrize(("body", "status", "message"), [
    (b'{"name": "rec", "input": [[' + b"1, " * 800_000 + b'1]]}', 413, "exceeds the limit"),  # max_request_bytes
    (b'{"name": "rec", "input": [[1, 2]], "config": ' + b'{"a": ' * 20 + b"1" + b"}" * 21,
     400, "max_json_depth"),
    (b'{"name": "rec", "input": [' + b"[1], " * 1200 + b'[1]]}', 413, "max_json_containers"),
    # 2 bytes a value: what parsing would build can never fit in the budget
    (b'{"name": "rec", "input": [[' + b"1," * 700_000 + b'1]]}', 413, "max_inflight_bytes"),
])
def test_limits_and_budget_refuse_before_anything_goes_up(gateway: GatewayProcess, standin: UmbridgeStandin,
                                                          body: bytes, status: int, message: str) -> None:
    before = len(standin.evaluations())
    reply = evaluate(gateway, body)
    code, kind, text = error_of(reply)
    assert code == status and kind == "InvalidInput" and message in text, (code, text)
    assert standin.evaluations()[before:] == []


MALFORMED_ANSWERS = [
    b'{"output": [[1, 2]',  # cut short
    b"<html>oops</html>",
    b'[[1, 2]]',  # not an object
    b'{"outputs": [[1, 2]]}',  # no 'output'
    b'{"output": [1, 2]}',  # not a list of lists
    b'{"output": [[1, "2"]]}',
    b'{"output": [[1, true]]}',
    b'{"output": [[1, [2]]]}',
    b'{"output": [[1, 2, 3]]}',  # not OutputSizes
    b'{"output": [[1, 2]], "x": "\\ud800"}',  # a lone surrogate: nothing could write it again
]


@pytest.mark.parametrize("answer", MALFORMED_ANSWERS)
def test_malformed_answers_are_invalid_output(gateway: GatewayProcess, standin: UmbridgeStandin,
                                              answer: bytes) -> None:
    standin.models["odd"].answers = [answer]
    status, kind, text = error_of(evaluate(gateway, b'{"name": "odd", "input": [[1, 2]]}'))
    assert (status, kind) == (500, "InvalidOutput"), text
    assert "127.0.0.1" not in text


@pytest.mark.parametrize("bad", [b'"x"', b"true", b"[1]"])
def test_big_malformed_answer_is_invalid_output(gateway: GatewayProcess, standin: UmbridgeStandin,
                                                bad: bytes) -> None:
    """An answer the fast reader reads (64 KiB and more) with one bad value."""
    answer = b'{"output": [[' + b"0.25, " * (BIG - 1) + bad + b"]]}"
    standin.models["wide"].answers = [answer]
    status, kind, text = error_of(evaluate(gateway, b'{"name": "wide", "input": [[1, 2]]}'))
    assert (status, kind) == (500, "InvalidOutput"), text
    good = b'{"output": [[' + b"0.25, " * (BIG - 1) + b"0.5]]}"
    standin.models["wide"].answers = [good]
    reply = evaluate(gateway, b'{"name": "wide", "input": [[1, 2]]}')
    assert reply.status_code == 200 and reply.content == good


def test_upstream_errors_keep_their_meaning(gateway: GatewayProcess, standin: UmbridgeStandin) -> None:
    """An error in a 200 answer is an error, as the reference client reads it."""
    standin.models["odd"].answers = [b'{"error": {"type": "InvalidInput", "message": "out of range"}}']
    status, kind, text = error_of(evaluate(gateway, b'{"name": "odd", "input": [[1, 2]]}'))
    assert (status, kind) == (400, "InvalidInput") and "out of range" in text


# --- everything else as before ------------------------------------------------------------


def test_derivatives_and_other_upstreams_are_unaffected(gateway: GatewayProcess, peer: UmbridgePeer) -> None:
    direct = umbridge.HTTPModel(f"http://{peer.address}", "square")
    via = umbridge.HTTPModel(f"http://{gateway.url('umb')}", "square")
    x = [[0.5, -1.0, 2.0]]
    with Counted(gateway) as counted:
        assert via.gradient(0, 0, x, [1.0, 2.0, 3.0]) == direct.gradient(0, 0, x, [1.0, 2.0, 3.0])
        assert via.apply_jacobian(0, 0, x, [1.0, 1.0, 1.0]) == direct.apply_jacobian(0, 0, x, [1.0, 1.0, 1.0])
        forward = umbridge.HTTPModel(f"http://{gateway.url('umb')}", "forward")  # a builtin model
        assert forward([[2.0, 5.0], [-1.0]]) == [[7.0, -2.0, 25.0]]
        # a V2 client of the UM-Bridge model
        infer = requests.post(f"http://{gateway.url('rest')}/v2/models/square/infer", timeout=30, json={
            "inputs": [{"name": "input_0", "datatype": "FP64", "shape": [3], "data": [1.0, 2.0, 3.0]}]})
        assert infer.status_code == 200 and infer.json()["outputs"][0]["data"] == [1.0, 4.0, 9.0]
        # a big derivative call: inputs read by the fast reader, the call re-encoded
        n = 20_000
        big = orjson.dumps({"name": "square", "input": [np.linspace(0, 1, n).tolist()], "config": {"n": n},
                            "outWrt": 0, "inWrt": 0, "sens": np.linspace(1, 2, n).tolist()})
        assert len(big) >= 64 << 10
        via_reply, direct_reply = post(gateway.url("umb"), big, "Gradient"), post(peer.address, big, "Gradient")
        assert via_reply.status_code == direct_reply.status_code == 200
        assert via_reply.json() == direct_reply.json()
    assert counted.delta == {}
    # Finite differences over a UM-Bridge Evaluate: the gateway's own rows, translated.
    fd = umbridge.HTTPModel(f"http://{gateway.url('umb')}", "evaluate_fd")
    gradient = fd.gradient(1, 1, [[1.0, 2.0, 0.5], [3.0]], [1.0])
    assert gradient == pytest.approx([1.0], rel=1e-6)


# --- the readers, in process: the same values and errors as the codec's --------------------


def _big_vectors(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    wide = rng.standard_normal(20_000) * 10.0 ** rng.integers(-300, 300, 20_000)
    special = np.array([0.0, -0.0, 5e-324, -2.2250738585072014e-308, 1.7976931348623157e308, 1 / 3, 2.0 ** 60])
    return [np.concatenate([wide, special]), rng.integers(-(2 ** 53), 2 ** 53, 9000).astype(np.float64)]


def _texts(vectors: list[np.ndarray], config: Any) -> list[bytes]:
    """The same call written by orjson, by Python's json, and with integers and odd spacing."""
    as_ints = "[" + ", ".join("[" + ",\n ".join(str(int(v)) if v.is_integer() and abs(v) < 2 ** 63 else repr(v)
                                                  for v in vector.tolist()) + "]" for vector in vectors) + "]"
    return [orjson.dumps({"name": "m", "input": vectors, "config": config}, option=orjson.OPT_SERIALIZE_NUMPY),
            json.dumps({"config": config, "input": [v.tolist() for v in vectors], "name": "m"}).encode(),
            b'{ "name" : "m", "config": ' + json.dumps(config).encode() + b', "input" : ' + as_ints.encode() + b"}"]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("config", [{}, {"caf\u00e9": [1, {"x": None}]}, {"s": "\\ud83d\\ude00 \"quoted\""}])
def test_fast_reader_reads_what_the_codec_reads(seed: int, config: Any) -> None:
    from gateway.protocols.umbridge import codec, passthrough

    vectors = _big_vectors(seed)
    for text in _texts(vectors, config):
        assert len(text) >= 64 << 10
        call, forwardable = passthrough.read_call(text)
        reference = codec.decode_call(text)
        assert (call.name, call.config) == (reference.name, reference.config) and forwardable
        sizes = [len(v) for v in vectors]
        for got, want in zip(codec.decode_inputs(call, sizes), codec.decode_inputs(reference, sizes), strict=True):
            assert got.dtype == want.dtype == np.float64 and got.tobytes() == want.tobytes()
        answer = text.replace(b'"input"', b'"output"').replace(b'"name"', b'"nom"')
        outputs, relayable = passthrough.read_outputs(200, answer, "up")
        expected = codec.decode_outputs(codec.decode_answer(answer, "up"), "up")
        assert relayable and [o.tobytes() for o in outputs] == [e.tobytes() for e in expected]


@pytest.mark.parametrize(("change", "forwardable"), [
    ((b"]]", b", NaN]]"), False),  # a literal: not strict JSON
    ((b"]]", b", 123456789012345678901234]]"), True),  # beyond 64 bits: a number, read as a double as orjson does
    ((b'"name"', b'"config": {"a": 1}, "name"'), False),  # config given twice
    ((b"]]", b", null]]"), True),  # strict; the listener translates it (not finite)
    ((b'"name"', b'"n\\u0061me2": "x", "name"'), True),  # escapes are fine
])
def test_fast_reader_hands_what_it_cannot_vouch_for_to_the_codec(change: tuple[bytes, bytes],
                                                                 forwardable: bool) -> None:
    from gateway.protocols.umbridge import codec, passthrough

    text = _texts(_big_vectors(3), {"a": 2})[0].replace(*change)
    call, ok = passthrough.read_call(text)
    reference = codec.decode_call(text)
    assert (call.name, call.config, ok) == (reference.name, reference.config, forwardable)
    sizes = [len(v) for v in reference.body["input"]]
    for got, want in zip(codec.decode_inputs(call, sizes), codec.decode_inputs(reference, sizes), strict=True):
        np.testing.assert_array_equal(got, want)


def test_renamed_changes_only_the_name() -> None:
    from gateway.protocols.umbridge import passthrough

    body = b'{"input": [[1]], "name" :\t"old", "config": {"nam": "name", "x": ["name"]}}'
    assert passthrough.renamed(body, "old", "n\u00e9w\"") == (
        b'{"input": [[1]], "name" :\t"n\xc3\xa9w\\"", "config": {"nam": "name", "x": ["name"]}}')
    assert passthrough.renamed(body, "other", "new") is None  # not the name the gateway read
    assert passthrough.renamed(body.replace(b'"nam"', b'"name"'), "old", "new") is None  # a second name key
    assert passthrough.renamed(body.replace(b'"old"', b'"o\\u006cd"'), "old", "new") is None  # escapes
