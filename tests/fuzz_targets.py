"""Coverage-guided fuzz targets (atheris) for every frontend decoder.

Run one:  python tests/fuzz_targets.py TARGET [libFuzzer flags...] [CORPUS_DIR]
e.g.      python tests/fuzz_targets.py v2_rest_json -runs=20000 -max_total_time=60

Each target feeds arbitrary bytes to what a listener does with a request
body (or gRPC message) and lets only the protocol's own errors escape:
GatewayError (the gRPC codec turns protobuf's DecodeError into one, which
the listener answers as INVALID_ARGUMENT). Anything else is a crash libFuzzer reports (and
tests/test_fuzz.py fails on). ``seeds(target)`` gives valid starting inputs.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports(include=["gateway"]):

    from gateway.config.limits import Limits
    from gateway.core.errors import GatewayError
    from gateway.core.graphtensors import EDGE_TASKS, NODE_TASKS
    from gateway.core.limits import TensorAllowance, check_json_depth
    from gateway.core.types import TensorSpec
    from gateway.protocols.graphstorm import codec as graphstorm
    from gateway.protocols.graphstorm.schema import parse_schema
    from gateway.protocols.openai import codec as openai
    from gateway.protocols.openai import mapping as openai_mapping
    from gateway.protocols.umbridge import codec as umbridge
    from gateway.protocols.umbridge import passthrough as umbridge_passthrough
    from gateway.protocols.v1_rest import codec as v1_rest
    from gateway.protocols.v2_grpc import codec as v2_grpc
    from gateway.protocols.v2_grpc import messages as pb
    from gateway.protocols.v2_rest import codec as v2_rest

LIMITS = Limits(max_request_bytes=1 << 20, max_tensor_elements=1 << 20, max_request_elements=1 << 20,
                max_request_tensor_bytes=8 << 20, max_bytes_element=1 << 16)
DATA = Path(__file__).resolve().parent / "data" / "graphstorm"


def v2_rest_json(data: bytes) -> None:
    v2_rest.decode_infer_request(data, None, "m", "", LIMITS.max_tensor_elements, LIMITS)


def v2_rest_binary(data: bytes) -> None:
    """The first two bytes give Inference-Header-Content-Length."""
    if len(data) < 2:
        return
    (length,) = struct.unpack_from("<H", data)
    v2_rest.decode_infer_request(data[2:], str(length), "m", "", LIMITS.max_tensor_elements, LIMITS)


def v2_grpc_message(data: bytes) -> None:
    # The listener hands the codec the message bytes: its own wire walk
    # (rawwire) and protobuf's parse of the rest are both under test.
    v2_grpc.decode_infer_request(data, LIMITS.max_tensor_elements, LIMITS)


def umbridge_call(data: bytes) -> None:
    """What the listener does for Evaluate and each derivative of a model
    with inputs of sizes [2, 1] and outputs of size [3]."""
    check_json_depth(data, LIMITS.max_json_depth, "the request body")
    call, _ = umbridge_passthrough.read_call(data)
    umbridge.decode_inputs(call, (2, 1))
    for kind in ("Gradient", "ApplyJacobian", "ApplyHessian"):
        try:
            umbridge.decode_derivative(kind, call, (2, 1), (3,))
        except GatewayError:
            pass


SCHEMA = parse_schema(json.loads((DATA / "movielens_gconstruct_runtime.json").read_text()), "movielens", [])


def graphstorm_invocation(data: bytes) -> None:
    check_json_depth(data, LIMITS.max_json_depth, "the body")
    payload = graphstorm.parse_json(data)
    for schema in (SCHEMA, None):
        try:
            invocation = graphstorm.decode_invocation(payload, schema, NODE_TASKS + EDGE_TASKS)
        except GatewayError:
            continue
        invocation.graph.to_tensors()


# The V1 listener's model knowledge: none, two named inputs, a fixed shape
# without batch dimension, an input of any datatype.
V1_SPECS = ((), (TensorSpec("a", "INT32", (-1, 2)), TensorSpec("b", "BYTES", (-1,))),
            (TensorSpec("x", "FP32", (2, 2)),), (TensorSpec("i", "BYTES", (-1,), {"any_datatype": True}),))


def _v1_decoded(data: bytes, specs: tuple[TensorSpec, ...], fast_min_bytes: int) -> Any:
    """The decoded request's tensors (name, datatype, shape, values), or its error message."""
    try:
        predict = v1_rest.decode_predict(data, specs, TensorAllowance.of(LIMITS), fast_min_bytes)
    except GatewayError as error:
        return error.message
    return predict, [(t.name, t.datatype, t.shape, t.data.tolist()) for t in predict.inputs]


def v1_rest_predict(data: bytes) -> None:
    """A :predict body against each kind of model knowledge, read by orjson
    and by the fast reader (which must give the same tensors, or leave the
    body to orjson), and its tensors encoded back as an answer (rows or
    columns, as the body asked)."""
    check_json_depth(data, LIMITS.max_json_depth, "the request body")
    for specs in V1_SPECS:
        reference = _v1_decoded(data, specs, len(data) + 1)
        fast = _v1_decoded(data, specs, 0)
        if isinstance(reference, str) or isinstance(fast, str):
            assert reference == fast, (reference, fast)
            continue
        assert repr(reference[1]) == repr(fast[1]), (reference[1], fast[1])  # repr: NaN equals NaN
        predict = reference[0]
        try:
            v1_rest.encode_answer(predict.inputs, predict.rows)
        except GatewayError:
            pass


OPENAI_LIMITS = openai.Limits(max_messages=64, max_tokens=4096, default_max_tokens=16, max_embedding_inputs=64)
OPENAI_ROUTES = [openai_mapping.DEFAULT_OPTIONS, *(
    openai_mapping.RouteOptions(preset=preset, fields=dict(preset.fields))
    for preset in openai_mapping.PRESETS.values())]


def openai_request(data: bytes) -> None:
    """A body as each OpenAI call reads it (chat, completion, embeddings),
    mapped to a V2 request by each preset."""
    check_json_depth(data, LIMITS.max_json_depth, "the request body")
    for decode in (openai.decode_chat, openai.decode_completion):
        try:
            asked = decode(data, OPENAI_LIMITS)
        except GatewayError:
            continue
        for route in OPENAI_ROUTES:
            prompt = openai_mapping.render_prompt(asked.messages, route) if asked.messages is not None else asked.prompt
            openai_mapping.text_request(asked, prompt, route, "id")
    try:
        embeddings = openai.decode_embeddings(data, OPENAI_LIMITS)
    except GatewayError:
        return
    openai_mapping.embeddings_request(embeddings.model, embeddings.texts, openai_mapping.DEFAULT_OPTIONS, "id")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "v2_rest_json": v2_rest_json,
    "v2_rest_binary": v2_rest_binary,
    "v2_grpc": v2_grpc_message,
    "umbridge": umbridge_call,
    "graphstorm": graphstorm_invocation,
    "v1_rest": v1_rest_predict,
    "openai": openai_request,
}


def seeds(target: str) -> list[bytes]:
    """Valid inputs the fuzzer mutates from."""
    if target == "v2_rest_json":
        return [b'{"id": "1", "inputs": [{"name": "a", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},'
                b' {"name": "b", "datatype": "BYTES", "shape": [1], "data": ["x"]}], "outputs": [{"name": "o"}]}',
                b'{"inputs": [{"name": "a", "datatype": "FP16", "shape": [1], "data": [1.5]}], "parameters": {"p": 1}}',
                # what only Python's json reads (NaN sends it there), and shapes numpy cannot hold
                b'{"inputs": [{"name": "\\ud800", "datatype": "FP32", "shape": [1], "data": [NaN]}], "id": "a"}',
                b'{"inputs": [{"name": "a", "datatype": "INT8", "shape": [2, 0, 4611686018427387904], "data": []}]}',
                b'{"inputs": [{"name": "a", "datatype": "BOOL", "shape": [' + b"1, " * 40 + b'1], "data": [true]}]}']
    if target == "v2_rest_binary":
        head = (b'{"inputs": [{"name": "a", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 10}},'
                b' {"name": "b", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]}')
        tail = struct.pack("<I", 1) + b"x" + struct.pack("<I", 1) + b"y" + b"\0\0\x80?"
        return [struct.pack("<H", len(head)) + head + tail]
    if target == "v2_grpc":
        request = pb.ModelInferRequest(model_name="m", id="1")
        request.inputs.add(name="a", datatype="INT32", shape=[2]).contents.int_contents.extend([1, 2])
        raw = pb.ModelInferRequest(model_name="m")
        raw.inputs.add(name="b", datatype="BYTES", shape=[1])
        raw.raw_input_contents.append(struct.pack("<I", 2) + b"hi")
        return [request.SerializeToString(), raw.SerializeToString()]
    if target == "umbridge":
        return [b'{"name": "f", "input": [[1.0, 2.0], [3.0]], "config": {"a": [1]}, "outWrt": 0, "inWrt": 1, '
                b'"inWrt1": 0, "inWrt2": 1, "sens": [1, 2, 3], "vec": [1.0]}',
                b'{"name": "\\udc00", "input": [[NaN, 2.0], [Infinity]], "config": {"\\ud800": 123456789012345678901}}']
    if target == "graphstorm":
        return [(DATA / "movielens_realtime_payload.json").read_bytes().replace(
            b'"graph"', b'"targets": [{"node_type": "movie", "node_id": "m1"}], "graph"', 1)]
    if target == "v1_rest":
        return [b'{"instances": [{"a": [1, 2], "b": {"b64": "aGk="}}, {"a": [3, 4], "b": "x"}], '
                b'"parameters": {"p": 1}}',
                b'{"inputs": {"a": [[1, 2]], "b": ["\\u00e9"]}, "signature_name": "s"}',
                b'{"instances": [[[1.5, 2], [3, 4]]]}', b'{"inputs": [true, false]}',
                b'{"instances": ["a", {"b64": "/w=="}]}', b'{"inputs": 3}',
                b'{"inputs": {"a": [[1, 2], [3, 4]], "b": [1.5]}, "instances": [[1e400, -0.0], [2, 3]]}',
                b'{"instances": [[0.5, 1, 2], [3, 4, 5]], "parameters": {}}']
    if target == "openai":
        return [b'{"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": '
                b'[{"type": "text", "text": "\\u00e9"}]}], "max_tokens": 5, "stop": ["a", "b"], "temperature": 0.5, '
                b'"top_p": 1, "seed": 3, "stream": true, "stream_options": {"include_usage": true}, "n": 1}',
                b'{"model": "m", "prompt": ["once"], "max_completion_tokens": 7, "stop": "x", "logit_bias": {}}',
                b'{"model": "m", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 8}']
    raise KeyError(target)


def _checked(target: Callable[[bytes], None]) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        try:
            target(data)
        except GatewayError as error:  # the protocol's own error: the listener encodes it, so it must encode
            v2_rest.encode_error(error)
            v2_grpc.encode_error(error)[1].encode("utf-8")
            umbridge.encode_error(error)
            graphstorm.encode_error(error, "")
            v1_rest.encode_error(error)
            openai.encode_error(error)

    return run


def main(argv: list[str]) -> Any:
    name = argv[1]
    corpus = [arg for arg in argv[2:] if not arg.startswith("-")]
    for directory in corpus:  # seed the corpus directory once
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        for index, seed in enumerate(seeds(name)):
            (path / f"seed-{index}").write_bytes(seed)
    atheris.Setup([argv[0], *argv[2:]], _checked(TARGETS[name]))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
