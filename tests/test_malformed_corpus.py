"""A corpus of malformed requests across the six listeners (V2 REST, V2
gRPC, UM-Bridge, GraphStorm, V1 REST, OpenAI), each checked for the exact error form of its
protocol (status, shape of the error body, words of the message) and
followed by a good request on the same listener, which must still succeed.

One gateway process serves all six listeners. Cases kept elsewhere are not
repeated here: tests/test_v2_rest_bad_input.py, test_grpc_frontend.py,
test_umbridge_interop.py and test_graphstorm_gateway.py have their own; the
limits have tests/test_limits.py.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import orjson
import pytest
import requests
from graphstorm_payloads import MOVIELENS_SCHEMA, changed, movielens

from gateway.protocols.v2_grpc import messages as pb
from support import GatewayProcess, write_config

CONFIG = f"""
admin: {{address: null}}
limits: {{max_request_bytes: 1MiB, max_request_elements: 100000, max_bytes_element: 1KiB}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
  - {{name: v1, protocol: v1-rest, address: "127.0.0.1:0"}}
  - {{name: oai, protocol: openai, address: "127.0.0.1:0", max_messages: 8, max_tokens: 64,
      max_embedding_inputs: 4}}
upstreams:
  - {{name: local, protocol: builtin}}
routes:
  - match: {{model: gnn, listener: gs}}
    upstream: local
    options: {{graphstorm: {{graph_schema: "{MOVIELENS_SCHEMA}"}}}}
  - match: {{model: text_embedder}}
    upstream: local
    options: {{openai: {{api: embeddings}}}}
  - match: {{model: "*"}}
    upstream: local
"""


@dataclass(frozen=True)
class Case:
    """One malformed request and the answer it must get.

    HTTP listeners: ``request`` is (method, path, body, headers) and
    ``status`` the HTTP status. gRPC: ``request`` is (RPC name, message or
    raw bytes) and ``status`` the status code's name. ``detail``: the
    UM-Bridge error type, or GraphStorm's ``status_code``.
    """

    name: str
    listener: str
    request: Any
    status: int | str
    words: str
    detail: Any = None
    headers: dict[str, str] = field(default_factory=dict)


JSON = {"Content-Type": "application/json"}
IDENTITY = "/v2/models/identity/infer"


def rest(name: str, body: bytes | Any, status: int, words: str, path: str = IDENTITY,
         headers: dict[str, str] | None = None, method: str = "POST") -> Case:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return Case(name, "rest", (method, path, data, headers or {}), status, words)


def tensor(datatype: str = "FP32", shape: Any = (2,), data: Any = (1, 2), **extra: Any) -> dict[str, Any]:
    item = {"name": "INPUT0", "datatype": datatype, "shape": list(shape) if isinstance(shape, tuple) else shape}
    if data is not None:
        item["data"] = list(data) if isinstance(data, tuple) else data
    return {**item, **extra}


def rest_binary(name: str, head: dict[str, Any], tail: bytes, status: int, words: str,
                length: int | None = None) -> Case:
    """A binary-extension request: JSON head, tail, Inference-Header-Content-Length."""
    head_bytes = orjson.dumps(head)
    header = {"Inference-Header-Content-Length": str(len(head_bytes) if length is None else length)}
    return rest(name, head_bytes + tail, status, words, headers=header)


def nest(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


REST_CASES = [
    rest("empty body", b"", 400, "not valid JSON"),
    rest("not UTF-8", b"\xff\xfe{}", 400, "not valid JSON"),
    rest("trailing garbage", b'{"inputs": []} x', 400, "not valid JSON"),
    # (NaN/Infinity literals are accepted, as Triton writes them: docs/protocols.md)
    rest("NaN literal for an integer", b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], '
         b'"data": [NaN]}]}', 400, "must be integers"),
    rest("JSON null", b"null", 400, "must be a JSON object"),
    rest("no inputs", {"outputs": []}, 400, "request: missing 'inputs'"),
    rest("inputs null", {"inputs": None}, 400, "'inputs' must be a list"),
    rest("input a string", {"inputs": ["INPUT0"]}, 400, "input #0 must be an object"),
    rest("input without name", {"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}, 400,
         "input #0: missing 'name'"),
    rest("no datatype", {"inputs": [{"name": "INPUT0", "shape": [1], "data": [1]}]}, 400,
         "input 'INPUT0': missing 'datatype'"),
    rest("datatype a number", {"inputs": [tensor(datatype=11)]}, 400, "'datatype' must be a string"),
    rest("no shape", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1]}]}, 400,
         "input 'INPUT0': missing 'shape'"),
    rest("shape of booleans", {"inputs": [tensor(shape=[True, True])]}, 400, "shape must be a list of integers"),
    rest("shape of strings", {"inputs": [tensor(shape=["2"])]}, 400, "shape must be a list of integers"),
    rest("nested shape", {"inputs": [tensor(shape=[[2]])]}, 400, "shape must be a list of integers"),
    rest("tensor parameters a list", {"inputs": [tensor(parameters=[1])]}, 400, "'parameters' must be an object"),
    rest("request parameters a string", {"inputs": [tensor()], "parameters": "x"}, 400,
         "request: 'parameters' must be an object"),
    rest("id a number", {"id": 5, "inputs": [tensor()]}, 400, "request: 'id' must be a string"),
    rest("outputs an object", {"inputs": [tensor()], "outputs": {"name": "o"}}, 400, "'outputs' must be a list"),
    rest("output a string", {"inputs": [tensor()], "outputs": ["OUTPUT0"]}, 400, "output #0 must be an object"),
    rest("output without name", {"inputs": [tensor()], "outputs": [{}]}, 400, "output #0: missing 'name'"),
    rest("data and binary_data_size", {"inputs": [tensor(parameters={"binary_data_size": 8})]}, 400,
         "has both 'data' and 'binary_data_size'"),
    rest_binary("binary_data_size a string", {"inputs": [tensor(data=None, parameters={"binary_data_size": "8"})]},
                b"\0" * 8, 400, "must be a non-negative integer"),
    rest_binary("binary_data_size a boolean", {"inputs": [tensor(data=None, parameters={"binary_data_size": True})]},
                b"\0", 400, "must be a non-negative integer"),
    rest("data a number", {"inputs": [tensor(data=5)]}, 400, "'data' must be a list"),
    rest("data an object", {"inputs": [tensor(data={"a": 1})]}, 400, "'data' must be a list"),
    rest("BOOL from strings", {"inputs": [tensor("BOOL", data=["true", "false"])]}, 400,
         "BOOL data must be true/false"),
    rest("UINT8 negative", {"inputs": [tensor("UINT8", data=[1, -1])]}, 400, "out of range for UINT8"),
    rest("UINT64 over 2^64", b'{"inputs": [{"name": "INPUT0", "datatype": "UINT64", "shape": [1], '
                             b'"data": [18446744073709551616]}]}', 400, "out of range for UINT64"),
    rest("INT64 from a float", {"inputs": [tensor("INT64", data=[0.5, 1])]}, 400, "INT64 data must be integers"),
    # Numbers beyond their datatype (orjson reads integers beyond 64 bits as floats): never rounded to fit.
    rest("INT64 beyond 64 bits", b'{"inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [1], '
                                 b'"data": [123456789012345678901234567890]}]}', 400, "out of range for INT64"),
    rest("INT64 from 1e30", {"inputs": [tensor("INT64", data=[1e30, 1])]}, 400, "out of range for INT64"),
    rest("FP32 beyond its range", {"inputs": [tensor(data=[1.5, 1e39])]}, 400,
         "input 'INPUT0': a value is out of range for FP32"),
    rest("FP32 integer beyond its range", b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], '
                                          b'"data": [1' + b"0" * 39 + b']}]}', 400, "out of range for FP32"),
    rest("FP16 beyond its range", {"inputs": [tensor("FP16", data=[1, 70000])]}, 400, "out of range for FP16"),
    rest("FP32 beyond its range, fast reader", {"inputs": [tensor(shape=(20000,), data=[0.5] * 19999 + [1e39])]},
         400, "input 'INPUT0': a value is out of range for FP32"),
    # (null in floating-point data is NaN, as MLServer writes it: docs/protocols.md)
    rest("INT32 with null", {"inputs": [tensor("INT32", data=[None, 1])]}, 400, "INT32 data must be integers"),
    rest("FP32 from booleans", {"inputs": [tensor(data=[True, False])]}, 400, "FP32 data must be numbers"),
    rest("BYTES with null", {"inputs": [tensor("BYTES", data=["a", None])]}, 400,
         "BYTES data must be strings, got NoneType"),
    rest("BYTES count vs shape", {"inputs": [tensor("BYTES", shape=(3,), data=[["a"], ["b"]])]}, 400,
         "has 2 data elements but shape [3] needs 3"),
    rest_binary("FP16 binary size", {"inputs": [tensor("FP16", data=None, parameters={"binary_data_size": 6})]},
                b"\0" * 6, 400, "has 6 bytes of data but shape [2] of FP16 needs 4"),
    rest_binary("header length 0", {"inputs": []}, b"", 400, "not valid JSON", length=0),
    rest_binary("header length negative", {"inputs": []}, b"", 400, "outside the body", length=-1),
    rest("deflate header on gzip data", gzip.compress(orjson.dumps({"inputs": [tensor()]})), 400,
         "not valid deflate", headers={"Content-Encoding": "deflate"}),
    rest("truncated gzip", gzip.compress(orjson.dumps({"inputs": [tensor()]}))[:-8], 400,
         "truncated gzip stream", headers={"Content-Encoding": "gzip"}),
    rest("two encodings", b"{}", 501, "unsupported Content-Encoding 'gzip, br'",
         headers={"Content-Encoding": "gzip, br"}),
    rest("nested too deep", b'{"inputs": [], "parameters": {"a": ' + nest(100) + b"}}", 400,
         "over limits.max_json_depth (64)"),
    rest("deflate bomb", zlib.compress(b" " * (2 << 20)), 413, "inflates to more than the limit",
         headers={"Content-Encoding": "deflate"}),
    rest("elements over the request limit", {"inputs": [tensor("INT8", shape=(60000,), data=[0] * 60000),
                                                        {**tensor("INT8", shape=(60000,), data=[0] * 60000),
                                                         "name": "B"}]},
         413, "limits.max_request_elements (100000)"),
    rest("shape over the request limit, data disagrees", {"inputs": [tensor("INT8", shape=(60000,), data=[0]),
                                                                     {**tensor("INT8", shape=(60000,), data=[0]),
                                                                      "name": "B"}]},
         400, "has 1 data elements but shape [60000] needs 60000"),
    rest("BYTES element over the limit", {"inputs": [tensor("BYTES", shape=(1,), data=["x" * 1025])]}, 413,
         "a BYTES element of 1025 bytes is over limits.max_bytes_element (1024)"),
    rest("unknown model metadata", b"", 404, "unknown model: 'nope' is not found", path="/v2/models/nope",
         method="GET"),
    rest("unknown version metadata", b"", 404, "unknown model: 'identity' version '9' is not found",
         path="/v2/models/identity/versions/9", method="GET"),
    rest("unknown model readiness", b"", 404, "unknown model: 'nope' is not found", path="/v2/models/nope/ready",
         method="GET"),
    rest("DELETE server metadata", b"", 405, "method DELETE is not allowed on /v2", path="/v2", method="DELETE"),
    rest("POST liveness", b"{}", 405, "method POST is not allowed on /v2/health/live", path="/v2/health/live"),
    rest("PUT infer", b"{}", 405, "method PUT is not allowed", method="PUT"),
    rest("unversioned API", b"", 404, "no such endpoint: GET /v3", path="/v3", method="GET"),
    rest("unexpected input name", {"inputs": [{**tensor(), "name": "INPUT9"}]}, 400,
         "unexpected inference input 'INPUT9' for model 'identity'"),
    rest("input given twice", {"inputs": [tensor(), tensor()]}, 400, "input 'INPUT0' is given twice"),
    rest("trig batch sizes", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]},
                                         {"name": "y", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}, 400,
         "must have the same batch size, got 2 and 1", path="/v2/models/trig/infer"),
    rest("simple_string non-numeric", {"inputs": [
        {"name": n, "datatype": "BYTES", "shape": [1, 16], "data": ["x"] * 16} for n in ("INPUT0", "INPUT1")]},
         400, "must hold decimal integers as strings", path="/v2/models/simple_string/infer"),
    rest("forward wrong datatype", {"inputs": [
        {"name": "input_0", "datatype": "FP32", "shape": [2], "data": [1, 2]},
        {"name": "input_1", "datatype": "FP64", "shape": [1], "data": [1]}]}, 400,
         "input 'input_0' of model 'forward' must be FP64, got FP32", path="/v2/models/forward/infer"),
]

# Triton's generate extension (v2_rest/generate.py): the same body on both routes.
GENERATE, GENERATE_STREAM = "/v2/models/simple/generate", "/v2/models/simple/generate_stream"
ROW16 = list(range(16))
for route, label in ((GENERATE, "generate"), (GENERATE_STREAM, "generate_stream")):
    REST_CASES += [
        rest(f"{label} empty body", b"", 400, "the generate request is not valid JSON", path=route),
        rest(f"{label} a list", [1, 2], 400, "the generate request must be a JSON object", path=route),
        rest(f"{label} unknown model", {"INPUT0": 1}, 404, "unknown model: 'nope' is not found",
             path=route.replace("simple", "nope")),
        rest(f"{label} unknown version", {"INPUT0": 1}, 404, "unknown model: 'simple' version '9' is not found",
             path=route.replace("simple", "simple/versions/9")),
        rest(f"{label} names no input", {"PROMPT": "x"}, 400, "names none of the inputs of model 'simple'",
             path=route),
        rest(f"{label} INT32 from a string", {"INPUT0": "x", "INPUT1": ROW16}, 400,
             "input 'INPUT0': INT32 data must be integers", path=route),
        rest(f"{label} INT32 from booleans", {"INPUT0": [True] * 16, "INPUT1": ROW16}, 400,
             "input 'INPUT0': INT32 data must be integers", path=route),
        rest(f"{label} ragged input", {"INPUT0": [[1, 2], [3]], "INPUT1": ROW16}, 400,
             "input 'INPUT0': a ragged list", path=route),
        rest(f"{label} input holds an object", {"INPUT0": {"a": 1}, "INPUT1": ROW16}, 400,
             "input 'INPUT0': INT32 data must be integers", path=route),
        rest(f"{label} parameter an object", {"INPUT0": ROW16, "INPUT1": ROW16, "PARAMS": {"a": 1}}, 400,
             "parameter 'PARAMS' has invalid type", path=route),
        rest(f"{label} parameter null", {"INPUT0": ROW16, "INPUT1": ROW16, "p": None}, 400,
             "parameter 'p' has invalid type: null", path=route),
        rest(f"{label} parameters a list", {"INPUT0": ROW16, "INPUT1": ROW16, "parameters": [1]}, 400,
             "'parameters' must be an object", path=route),
        rest(f"{label} nested too deep", b'{"INPUT0": ' + nest(100) + b"}", 400, "over limits.max_json_depth (64)",
             path=route),
        rest(f"{label} deflate bomb", zlib.compress(b" " * (2 << 20)), 413, "inflates to more than the limit",
             headers={"Content-Encoding": "deflate"}, path=route),
        rest(f"{label} GET", b"", 405, f"method GET is not allowed on {route}", path=route, method="GET"),
        rest(f"{label} integer beyond 64 bits", b'{"INPUT0": 99999999999999999999999}', 400,
             "input 'INPUT0': a value is out of range for INT64", path=route.replace("simple", "identity")),
        rest(f"{label} null for a number", {"INPUT0": None}, 400, "input 'INPUT0': null is not a number",
             path=route.replace("simple", "identity")),
        rest(f"{label} null among numbers", {"INPUT0": [1.5, None]}, 400, "input 'INPUT0': null is not a number",
             path=route.replace("simple", "identity")),
        rest(f"{label} decoupled model, IN and DELAY differ", {"IN": [1, 2], "DELAY": [0], "WAIT": 0}, 400,
             "expected IN and DELAY shape to match", path=route.replace("simple", "repeat_int32")),
    ]
REST_CASES.append(rest("generate from a decoupled model answering twice", {"IN": [1, 2], "DELAY": [0, 0], "WAIT": 0},
                       400, "generate expects model to produce exactly 1 response",
                       path="/v2/models/repeat_int32/generate"))


# --- gRPC ------------------------------------------------------------------------------


def grpc_case(name: str, message: Any, code: str, words: str, method: str = "ModelInfer") -> Case:
    return Case(name, "grpc", (method, message), code, words)


def infer(*tensors: tuple[str, str, list[int]], model: str = "identity", version: str = "",
          raw: list[bytes] | None = None, outputs: tuple[str, ...] = ()) -> Any:
    message = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape in tensors:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
    message.raw_input_contents.extend(raw or [])
    for output in outputs:
        message.outputs.add(name=output)
    return message


def typed(datatype: str, shape: list[int], field_name: str, values: list[Any]) -> Any:
    message = infer(("INPUT0", datatype, shape))
    getattr(message.inputs[0].contents, field_name).extend(values)
    return message


GRPC_CASES = [
    grpc_case("unknown model metadata", pb.ModelMetadataRequest(name="nope"), "NOT_FOUND",
              "unknown model: 'nope' is not found", "ModelMetadata"),
    grpc_case("unknown version", infer(("INPUT0", "UINT8", [1]), version="9", raw=[b"\1"]), "NOT_FOUND",
              "version '9' is not found"),
    grpc_case("input without name", infer(("", "UINT8", [1]), raw=[b"\1"]), "INVALID_ARGUMENT", "input #0 has no name"),
    grpc_case("typed count vs shape", typed("INT32", [2], "int_contents", [1, 2, 3]), "INVALID_ARGUMENT",
              "has 3 elements in 'int_contents' but shape [2] needs 2"),
    grpc_case("no data", infer(("INPUT0", "INT32", [2])), "INVALID_ARGUMENT", "has no data"),
    grpc_case("BYTES in bool_contents", typed("BYTES", [1], "bool_contents", [True]), "INVALID_ARGUMENT",
              "BYTES data must be in 'bytes_contents', not 'bool_contents'"),
    grpc_case("UINT16 out of range", typed("UINT16", [1], "uint_contents", [70000]), "INVALID_ARGUMENT",
              "out of range for UINT16"),
    grpc_case("typed BF16", typed("BF16", [1], "fp32_contents", [1.0]), "INVALID_ARGUMENT",
              "BF16 has no typed contents field"),
    grpc_case("raw FP64 length", infer(("INPUT0", "FP64", [2]), raw=[b"\0" * 12]), "INVALID_ARGUMENT",
              "has 12 bytes of data but shape [2] of FP64 needs 16"),
    grpc_case("raw BOOL length", infer(("INPUT0", "BOOL", [3]), raw=[b"\1"]), "INVALID_ARGUMENT",
              "shape [3] of BOOL needs 3"),
    grpc_case("more raw entries than inputs", infer(("INPUT0", "UINT8", [1]), raw=[b"\1", b"\2"]),
              "INVALID_ARGUMENT", "2 raw_input_contents entries for 1 inputs"),
    grpc_case("shape over the tensor limit", infer(("INPUT0", "FP32", [1 << 40, 1 << 40]), raw=[b"\0" * 4]),
              "RESOURCE_EXHAUSTED", "over the limit of 2147483648 (limits.max_tensor_elements)"),
    grpc_case("elements over the request limit", infer(("A", "INT8", [60000]), ("B", "INT8", [60000]),
                                                       raw=[b"\0", b"\0"]), "RESOURCE_EXHAUSTED",
              "limits.max_request_elements (100000)"),
    grpc_case("BYTES element over the limit", typed("BYTES", [1], "bytes_contents", [b"x" * 1025]),
              "RESOURCE_EXHAUSTED", "over limits.max_bytes_element (1024)"),
    grpc_case("metadata request not protobuf", b"\xff\xff\xff", "INVALID_ARGUMENT",
              "not a valid inference.ModelMetadataRequest", "ModelMetadata"),
    grpc_case("ready request not protobuf", b"\x0a\xff\xff", "INVALID_ARGUMENT",
              "not a valid inference.ModelReadyRequest", "ModelReady"),
    grpc_case("model name not UTF-8", b"\x0a\x02\xff\xfe", "INVALID_ARGUMENT",
              "not a valid inference.ModelInferRequest"),
    grpc_case("truncated field", b"\x0a\x05ab", "INVALID_ARGUMENT", "not a valid inference.ModelInferRequest"),
    grpc_case("trig batch sizes", infer(("x", "FP32", [2, 2]), ("y", "FP32", [1, 1]), model="trig",
                                        raw=[b"\0" * 16, b"\0" * 4]), "INVALID_ARGUMENT", "same batch size"),
    grpc_case("unknown requested output", infer(("INPUT0", "UINT8", [1]), raw=[b"\1"], outputs=("NOPE",)),
              "INVALID_ARGUMENT", "unexpected inference output 'NOPE'"),
    grpc_case("forward wrong datatype", infer(("input_0", "FP32", [2]), ("input_1", "FP64", [1]), model="forward",
                                              raw=[b"\0" * 8, b"\0" * 8]), "INVALID_ARGUMENT",
              "input 'input_0' of model 'forward' must be FP64, got FP32"),
]


# --- UM-Bridge ------------------------------------------------------------------------------


def umb(name: str, endpoint: str, body: bytes | Any, status: int, error_type: str, words: str,
        headers: dict[str, str] | None = None, method: str = "POST") -> Case:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return Case(name, "umb", (method, f"/{endpoint}", data, headers or {}), status, words, error_type)


POINT = {"name": "forward", "input": [[1.0, 2.0], [3.0]]}
UMBRIDGE_CASES = [
    umb("JSON null", "Evaluate", b"null", 400, "InvalidInput", "must be a JSON object, got null"),
    umb("a number", "Evaluate", b"5", 400, "InvalidInput", "must be a JSON object, got a number"),
    umb("a list", "InputSizes", b"[]", 400, "InvalidInput", "must be a JSON object, got a list"),
    umb("name a number", "Evaluate", {"name": 5}, 400, "InvalidInput", "'name' must be a string, got a number"),
    umb("name null", "ModelInfo", {"name": None}, 400, "InvalidInput", "the request has no model 'name'"),
    umb("config a list", "OutputSizes", {"name": "forward", "config": [1]}, 400, "InvalidInput",
        "'config' must be a JSON object, got a list"),
    umb("trailing comma", "Evaluate", b'{"name": "forward",}', 400, "InvalidInput", "not valid JSON"),
    umb("not UTF-8", "Evaluate", b'{"name": "\xff"}', 400, "InvalidInput", "not valid JSON"),
    umb("input an object", "Evaluate", {**POINT, "input": {"a": 1}}, 400, "InvalidInput",
        "'input' must be a list of lists of numbers, got an object"),
    umb("input vector a string", "Evaluate", {**POINT, "input": ["ab", [3.0]]}, 400, "InvalidInput",
        "'input' vector 0 must be a list of numbers, got a string"),
    umb("boolean in a vector", "Evaluate", {**POINT, "input": [[1.0, True], [3.0]]}, 400, "InvalidInput",
        "must hold only numbers, found a boolean"),
    umb("nested list in a vector", "Evaluate", {**POINT, "input": [[1.0, [2.0]], [3.0]]}, 400, "InvalidInput",
        "must hold only numbers, found a list"),
    umb("integer beyond a double", "Evaluate", b'{"name": "forward", "input": [[1, 1' + b"0" * 400 + b'], [3]]}',
        400, "InvalidInput", "holds an integer too large for a double"),
    umb("no outWrt", "Gradient", {**POINT, "inWrt": 0, "sens": [1, 1, 1]}, 400, "InvalidInput", "missing 'outWrt'"),
    umb("outWrt a string", "Gradient", {**POINT, "outWrt": "0", "inWrt": 0, "sens": [1, 1, 1]}, 400, "InvalidInput",
        "'outWrt' must be an integer, got a string"),
    umb("outWrt a fraction", "Gradient", {**POINT, "outWrt": 0.5, "inWrt": 0, "sens": [1, 1, 1]}, 400,
        "InvalidInput", "'outWrt' must be an integer, got a number"),
    umb("no sens", "Gradient", {**POINT, "outWrt": 0, "inWrt": 0}, 400, "InvalidInput", "missing 'sens'"),
    umb("vec an object", "ApplyJacobian", {**POINT, "outWrt": 0, "inWrt": 0, "vec": {"a": 1}}, 400, "InvalidInput",
        "'vec' must be a list of numbers, got an object"),
    umb("no inWrt2", "ApplyHessian", {**POINT, "outWrt": 0, "inWrt1": 0, "sens": [1, 1, 1], "vec": [1, 1]}, 400,
        "InvalidInput", "missing 'inWrt2'"),
    umb("scale not a number", "Evaluate", {**POINT, "config": {"scale": [2]}}, 400, "InvalidInput",
        "config 'scale' of model 'forward' must be a number"),
    umb("unsupported encoding", "Evaluate", orjson.dumps(POINT), 400, "UnsupportedFeature",
        "unsupported Content-Encoding 'br'", headers={"Content-Encoding": "br"}),
    umb("broken gzip", "Evaluate", b"no gzip here", 400, "InvalidInput", "not valid gzip",
        headers={"Content-Encoding": "gzip"}),
    umb("gzip bomb", "Evaluate", gzip.compress(b" " * (2 << 20)), 413, "InvalidInput",
        "inflates to more than the limit", headers={"Content-Encoding": "gzip"}),
    umb("lower-case path", "evaluate", orjson.dumps(POINT), 404, "UnsupportedFeature",
        "no such endpoint: POST /evaluate"),
    umb("PUT Evaluate", "Evaluate", orjson.dumps(POINT), 405, "UnsupportedFeature", "method PUT is not allowed",
        method="PUT"),
]


# --- GraphStorm ---------------------------------------------------------------------------


def gs(name: str, body: bytes | Any, status_code: int, words: str, headers: dict[str, str] | None = None) -> Case:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return Case(name, "gs", ("POST", "/invocations", data, {**JSON, **(headers or {})}), 200, words, status_code)


def nodes(change: Any) -> dict[str, Any]:
    return changed(movielens(), lambda p: change(p["graph"]["nodes"]))


def edges(change: Any) -> dict[str, Any]:
    return changed(movielens(), lambda p: change(p["graph"]["edges"]))


def _set(items: list[dict[str, Any]], index: int, **values: Any) -> None:
    items[index].update(values)


def _drop(items: list[dict[str, Any]], index: int, key: str) -> None:
    items[index].pop(key)


GRAPHSTORM_CASES = [
    gs("empty body", b"", 400, "General JSON format error"),
    gs("task a number", changed(movielens(), lambda p: p.update(gml_task=3)), 421, "Task Mismatch"),
    gs("targets an empty object", changed(movielens(), lambda p: p.update(targets={})), 401, "'targets'"),
    gs("targets a string", changed(movielens(), lambda p: p.update(targets="m1")), 400,
       "the 'targets' field must be a list of target objects"),
    gs("target a number", changed(movielens(), lambda p: p.update(targets=[5])), 400,
       "targets[0] must be an object, got int"),
    gs("target node_type null", changed(movielens(), lambda p: p.update(targets=[{"node_type": None,
                                                                                  "node_id": "m1"}])),
       403, "Mismatched target node type"),
    gs("target node_id a boolean", changed(movielens(), lambda p: p.update(targets=[{"node_type": "movie",
                                                                                     "node_id": True}])),
       404, "the target node ID True does not exist"),
    gs("no graph", changed(movielens(), lambda p: p.pop("graph")), 411, "the payload has no 'graph' field"),
    gs("graph a list", changed(movielens(), lambda p: p.update(graph=[])), 411,
       "'graph' must be an object with 'nodes' and 'edges'"),
    gs("no nodes", changed(movielens(), lambda p: p["graph"].pop("nodes")), 411, "the graph has no 'nodes' field"),
    gs("edges an object", changed(movielens(), lambda p: p["graph"].update(edges={})), 411,
       "graph.edges must be a list"),
    gs("node a string", nodes(lambda n: n.__setitem__(0, "m1")), 411, "graph.nodes[0] must be an object"),
    gs("node without node_type", nodes(lambda n: _drop(n, 0, "node_type")), 411,
       "graph.nodes[0] has no 'node_type'"),
    gs("node_type a number", nodes(lambda n: _set(n, 0, node_type=1)), 411, "'node_type' that is not a string"),
    gs("node type outside the schema", nodes(lambda n: _set(n, 0, node_type="genre")), 411,
       "node type 'genre' is not in the model's graph schema"),
    gs("node id a list", nodes(lambda n: _set(n, 0, node_id=[1])), 411, "node ids must be strings or integers"),
    gs("node without node_id", nodes(lambda n: _drop(n, 0, "node_id")), 411, "has no 'node_id'"),
    gs("edge without edge_type", edges(lambda e: _drop(e, 0, "edge_type")), 411, "graph.edges[0] has no 'edge_type'"),
    gs("relation outside the schema", edges(lambda e: _set(e, 0, edge_type=["user", "likes", "movie"])), 411,
       "edge type ['user', 'likes', 'movie'] is not in the model's graph schema"),
    gs("edge to an unknown node", edges(lambda e: _set(e, 0, dest_node_id="m404")), 411,
       "refers to node id 'm404'"),
    gs("edge without src_node_id", edges(lambda e: _drop(e, 0, "src_node_id")), 411, "has no 'src_node_id'"),
    gs("features a list", nodes(lambda n: [_set(n, i, features=[1]) for i in range(len(n))]), 411,
       "must be objects"),
    gs("features on some nodes only", nodes(lambda n: _drop(n, 1, "features")), 411,
       "have 'features' and others do not"),
    gs("ragged feature", nodes(lambda n: n[0]["features"].update(feat=[[1.0], [2.0, 3.0]])), 411,
       "not a regular list of numbers"),
    gs("unsupported encoding", orjson.dumps(movielens()), 400, "unsupported Content-Encoding 'br'",
       headers={"Content-Encoding": "br"}),
    gs("gzip bomb", gzip.compress(b" " * (2 << 20)), 400, "inflates to more than the limit",
       headers={"Content-Encoding": "gzip"}),
]


# --- V1 REST (TF Serving / KServe V1) ----------------------------------------------------

V1_SIMPLE = "/v1/models/simple:predict"
V1_IDENTITY = "/v1/models/identity:predict"
ROW = {"INPUT0": list(range(16)), "INPUT1": [1] * 16}


def v1(name: str, body: bytes | Any, status: int, words: str, path: str = V1_SIMPLE,
       headers: dict[str, str] | None = None, method: str = "POST") -> Case:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return Case(name, "v1", (method, path, data, headers or {}), status, words)


V1_CASES = [
    v1("empty body", b"", 400, "not valid JSON"),
    v1("not UTF-8", b'{"instances": ["\xff"]}', 400, "not valid JSON"),
    v1("trailing garbage", b'{"instances": [1]} x', 400, "not valid JSON"),
    v1("a list", [ROW], 400, "must be a JSON object"),
    v1("a string", "instances", 400, "must be a JSON object"),
    v1("neither form", {"instance": [ROW]}, 400, "exactly one of 'instances'"),
    v1("both forms", {"instances": [ROW], "inputs": ROW}, 400, "exactly one of 'instances'"),
    v1("instances an object", {"instances": ROW}, 400, "'instances' must be a non-empty list"),
    v1("instances a number", {"instances": 3}, 400, "'instances' must be a non-empty list"),
    v1("instances empty", {"instances": []}, 400, "'instances' must be a non-empty list"),
    v1("empty instance object", {"instances": [{}]}, 400, "empty object"),
    v1("inputs an empty object", {"inputs": {}}, 400, "empty object"),
    v1("objects mixed with values", {"instances": [ROW, 1]}, 400, "mixes objects"),
    v1("instances name different inputs", {"instances": [ROW, {"INPUT0": ROW["INPUT0"]}]}, 400,
       "must name the same inputs"),
    v1("unnamed input of a two-input model", {"instances": [list(range(16))]}, 400, "takes 2 inputs"),
    v1("unknown input", {"instances": [{**ROW, "INPUT9": [1]}]}, 400, "no input 'INPUT9'"),
    v1("ragged rows", {"instances": [ROW, {**ROW, "INPUT0": [1, 2]}]}, 400, "ragged values"),
    v1("list beside a value", {"inputs": {**ROW, "INPUT0": [[1] * 16, 1]}}, 400, "ragged values"),
    v1("value beside a list", {"inputs": {**ROW, "INPUT0": [1, [1] * 16]}}, 400, "ragged values"),
    v1("wrong shape", {"instances": [{**ROW, "INPUT0": [1] * 15}]}, 400, "do not fit the model's shape"),
    v1("strings for INT32", {"instances": [{**ROW, "INPUT0": ["a"] * 16}]}, 400, "INT32 data must be integers"),
    v1("floats for INT32", {"instances": [{**ROW, "INPUT0": [0.5] * 16}]}, 400, "INT32 data must be integers"),
    v1("out of range for INT32", {"instances": [{**ROW, "INPUT0": [2 ** 40] * 16}]}, 400, "out of range"),
    # An integer literal is INT64 when no datatype is declared (identity), however large.
    v1("integer beyond 64 bits", b'{"instances": [1, 123456789012345678901234567890]}', 400,
       "input 'INPUT0': a value is out of range for INT64", path=V1_IDENTITY),
    v1("integer below INT64", b'{"instances": [-9223372036854775809]}', 400,
       "input 'INPUT0': a value is out of range for INT64", path=V1_IDENTITY),
    v1("integer beyond INT64", b'{"instances": [18446744073709551615]}', 400,
       "input 'INPUT0': a value is out of range for INT64", path=V1_IDENTITY),
    v1("integer beyond 64 bits, fast reader", b'{"inputs": [' + b"1, " * 30000 + b'123456789012345678901234567890]}',
       400, "input 'INPUT0': a value is out of range for INT64", path=V1_IDENTITY),
    v1("number beyond FP32", {"instances": [1.5, 1e39]}, 400, "input 'INPUT0': a value is out of range for FP32",
       path=V1_IDENTITY),
    v1("null for INT32", {"instances": [{**ROW, "INPUT0": [None] * 16}]}, 400, "INT32 data must be integers"),
    v1("parameters a list", {"instances": [ROW], "parameters": [1]}, 400, "'parameters' must be a JSON object"),
    v1("parameter an object", {"instances": [ROW], "parameters": {"p": {}}}, 400, "must be a string, number"),
    v1("mixed value types", {"instances": [1, "a"]}, 400, "values must be all numbers", path=V1_IDENTITY),
    v1("null values", {"instances": [None]}, 400, "values must be all numbers", path=V1_IDENTITY),
    v1("bad base64", {"instances": [{"b64": "***"}]}, 400, "not valid base64", path=V1_IDENTITY),
    v1("b64 a number", {"instances": [{"b64": 5}]}, 400, "BYTES values must be strings", path=V1_IDENTITY),
    v1("lone surrogate", b'{"instances": ["\\ud800"]}', 400, "not valid JSON", path=V1_IDENTITY),
    v1("too deep", b'{"instances": ' + nest(200) + b"}", 400, "max_json_depth", path=V1_IDENTITY),
    v1("too many elements", {"inputs": [0] * 200_000}, 413, "max_", path=V1_IDENTITY),
    v1("BYTES element too long", {"instances": ["x" * 2000]}, 413, "max_bytes_element", path=V1_IDENTITY),
    v1("unknown model", {"instances": [1]}, 404, "unknown model", path="/v1/models/nope:predict"),
    v1("unknown version", {"instances": [ROW]}, 404, "unknown model", path="/v1/models/simple/versions/9:predict"),
    v1("explain without explainer", {"instances": [1]}, 501, "no explainer", path="/v1/models/simple:explain"),
    v1("classify", {"examples": []}, 501, ":classify is not offered", path="/v1/models/simple:classify"),
    v1("regress", {"examples": []}, 501, ":regress is not offered", path="/v1/models/simple/versions/1:regress"),
    v1("GET predict", b"", 404, "unknown model: 'simple:predict'", method="GET"),
    v1("PUT predict", b"", 405, "method PUT is not allowed", method="PUT"),
    v1("unsupported encoding", orjson.dumps({"instances": [ROW]}), 501, "unsupported Content-Encoding 'br'",
       headers={"Content-Encoding": "br"}),
    v1("gzip bomb", gzip.compress(b" " * (2 << 20)), 413, "inflates to more than the limit",
       headers={"Content-Encoding": "gzip"}),
]

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


def oai(name: str, body: bytes | Any, status: int, words: str, param: str | None = None, path: str = CHAT,
        headers: dict[str, str] | None = None, method: str = "POST") -> Case:
    """An OpenAI case; ``detail``: the error's ``param``."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return Case(name, "oai", (method, path, data, headers or {}), status, words, param)


OPENAI_CASES = [
    oai("empty body", b"", 400, "not valid JSON"),
    oai("not UTF-8", b'{"model": "text_generator", "messages": ["\xff"]}', 400, "not valid JSON"),
    oai("a list", [HELLO], 400, "must be a JSON object"),
    oai("no model", {"messages": HELLO}, 400, "you must provide a model parameter", "model"),
    oai("model a number", {"model": 3, "messages": HELLO}, 400, "'model' must be a non-empty string", "model"),
    oai("no messages", {"model": "text_generator"}, 400, "you must provide a messages parameter", "messages"),
    oai("messages a string", {"model": "text_generator", "messages": "hi"}, 400, "non-empty array", "messages"),
    oai("messages empty", {"model": "text_generator", "messages": []}, 400, "non-empty array", "messages"),
    oai("message a number", {"model": "text_generator", "messages": [1]}, 400, "must be an object",
        "messages[0]"),
    oai("message without role", {"model": "text_generator", "messages": [{"content": "x"}]}, 400,
        "'messages[0].role' must be a non-empty string", "messages[0].role"),
    oai("content a number", {"model": "text_generator", "messages": [{"role": "user", "content": 5}]}, 400,
        "must be a string or an array of text parts", "messages[0].content"),
    oai("image content", {"model": "text_generator", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "only text is supported",
        "messages[0].content"),
    oai("too many messages", {"model": "text_generator", "messages": HELLO * 9}, 400, "max_messages", "messages"),
    oai("max_tokens a string", {"model": "text_generator", "messages": HELLO, "max_tokens": "5"}, 400,
        "'max_tokens' must be an integer", "max_tokens"),
    oai("max_tokens a boolean", {"model": "text_generator", "messages": HELLO, "max_tokens": True}, 400,
        "'max_tokens' must be an integer", "max_tokens"),
    oai("max_tokens over the bound", {"model": "text_generator", "messages": HELLO, "max_tokens": 65}, 400,
        "the listener's max_tokens", "max_tokens"),
    oai("max_tokens zero", {"model": "text_generator", "messages": HELLO, "max_tokens": 0}, 400,
        "between 1 and 64", "max_tokens"),
    oai("temperature a string", {"model": "text_generator", "messages": HELLO, "temperature": "hot"}, 400,
        "'temperature' must be a number", "temperature"),
    oai("temperature out of range", {"model": "text_generator", "messages": HELLO, "temperature": 3}, 400,
        "between 0 and 2", "temperature"),
    oai("stream a string", {"model": "text_generator", "messages": HELLO, "stream": "yes"}, 400,
        "'stream' must be a boolean", "stream"),
    oai("stop a number", {"model": "text_generator", "messages": HELLO, "stop": 5}, 400,
        "'stop' must be a string or an array", "stop"),
    oai("five stops", {"model": "text_generator", "messages": HELLO, "stop": list("abcde")}, 400,
        "at most 4", "stop"),
    oai("n of 2", {"model": "text_generator", "messages": HELLO, "n": 2}, 400, "only n=1", "n"),
    oai("stream_options a list", {"model": "text_generator", "messages": HELLO, "stream_options": []}, 400,
        "'stream_options' must be an object", "stream_options"),
    oai("too deep", b'{"model": "text_generator", "messages": ' + nest(200) + b"}", 400, "max_json_depth"),
    oai("unknown model", {"model": "nope", "messages": HELLO}, 404, "unknown model"),
    oai("embeddings model for chat", {"model": "text_embedder", "messages": HELLO}, 400,
        "is an embeddings model"),
    oai("no prompt", {"model": "text_generator"}, 400, "you must provide a prompt parameter", "prompt",
        path="/v1/completions"),
    oai("two prompts", {"model": "text_generator", "prompt": ["a", "b"]}, 400, "one prompt per request",
        "prompt", path="/v1/completions"),
    oai("token prompt", {"model": "text_generator", "prompt": [1, 2]}, 400, "one prompt per request", "prompt",
        path="/v1/completions"),
    oai("no input", {"model": "text_embedder"}, 400, "you must provide an input parameter", "input",
        path="/v1/embeddings"),
    oai("input numbers", {"model": "text_embedder", "input": [1, 2]}, 400, "array of strings", "input",
        path="/v1/embeddings"),
    oai("too many inputs", {"model": "text_embedder", "input": ["a"] * 5}, 400, "max_embedding_inputs", "input",
        path="/v1/embeddings"),
    oai("unknown encoding", {"model": "text_embedder", "input": "a", "encoding_format": "int8"}, 400,
        "'encoding_format' must be", "encoding_format", path="/v1/embeddings"),
    oai("other dimensions", {"model": "text_embedder", "input": "a", "dimensions": 3}, 400,
        "answers 8 dimensions", "dimensions", path="/v1/embeddings"),
    oai("unknown model listed", b"", 404, "unknown model", path="/v1/models/nope", method="GET"),
    oai("unknown path", b"", 404, "", path="/v1/nothing", method="GET"),
    oai("GET chat", b"", 405, "method GET is not allowed", method="GET"),
    oai("too large", {"model": "text_generator", "prompt": "x" * (2 << 20)}, 413, "limit",
        path="/v1/completions"),
    oai("gzip bomb", gzip.compress(b" " * (2 << 20)), 413, "inflates to more than the limit",
        headers={"Content-Encoding": "gzip"}),
]

CASES = REST_CASES + GRPC_CASES + UMBRIDGE_CASES + GRAPHSTORM_CASES + V1_CASES + OPENAI_CASES


def test_the_corpus_is_large_and_unique() -> None:
    assert len(CASES) >= 100
    assert len({(c.listener, c.name) for c in CASES}) == len(CASES)
    assert {c.listener for c in CASES} == {"rest", "grpc", "umb", "gs", "v1", "oai"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("corpus")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


@pytest.fixture(scope="module")
def channel(gateway: GatewayProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gateway.url("grpc")) as ch:
        yield ch


def _grpc_call(channel: grpc.Channel, method: str, message: Any) -> Any:
    _, response_class = pb.METHODS.get(method, (pb.ModelInferRequest, pb.ModelInferResponse))
    call = channel.unary_unary(pb.method_path(method),
                               request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
                               response_deserializer=response_class.FromString)
    return call(message, timeout=10)


def _still_serves(case: Case, gateway: GatewayProcess, http: requests.Session, channel: grpc.Channel) -> None:
    if case.listener == "grpc":
        reply = _grpc_call(channel, "ModelInfer", infer(("INPUT0", "UINT8", [2]), raw=[b"\1\2"]))
        assert reply.raw_output_contents[0] == b"\1\2"
    elif case.listener == "rest":
        reply = http.post(f"http://{gateway.url('rest')}{IDENTITY}", json={"inputs": [tensor()]}, timeout=10)
        assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [1, 2]
    elif case.listener == "v1":
        reply = http.post(f"http://{gateway.url('v1')}{V1_SIMPLE}", json={"instances": [ROW]}, timeout=10)
        assert reply.status_code == 200 and reply.json()["predictions"][0]["OUTPUT1"] == list(range(-1, 15))
    elif case.listener == "oai":
        reply = http.post(f"http://{gateway.url('oai')}{CHAT}", json={"model": "text_generator", "messages": HELLO,
                                                                      "max_tokens": 3}, timeout=10)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3, reply.text
    elif case.listener == "umb":
        reply = http.post(f"http://{gateway.url('umb')}/Evaluate", json=POINT, timeout=10)
        assert reply.json() == {"output": [[3.0, 3.0, 4.0]]}
    else:
        reply = http.post(f"http://{gateway.url('gs')}/invocations", data=orjson.dumps(movielens()), headers=JSON,
                          timeout=10)
        assert reply.json()["status_code"] == 200


@pytest.mark.parametrize("case", CASES, ids=[f"{c.listener}-{c.name}" for c in CASES])
def test_malformed_request(case: Case, gateway: GatewayProcess, http: requests.Session,
                           channel: grpc.Channel) -> None:
    if case.listener == "grpc":
        method, message = case.request
        with pytest.raises(grpc.RpcError) as info:
            _grpc_call(channel, method, message)
        assert info.value.code().name == case.status, info.value.details()
        assert case.words in (info.value.details() or "")
    else:
        method, path, body, headers = case.request
        reply = http.request(method, f"http://{gateway.url(case.listener)}{path}", data=body, headers=headers,
                             timeout=10)
        assert reply.status_code == case.status, reply.text
        assert reply.headers["Content-Type"].startswith("application/json")
        answer = reply.json()
        if case.listener in ("rest", "v1"):
            assert set(answer) == {"error"} and case.words in answer["error"], answer
        elif case.listener == "oai":
            assert set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param", "code"}
            assert case.words in answer["error"]["message"] and answer["error"]["param"] == case.detail, answer
            assert answer["error"]["type"] == ("invalid_request_error" if case.status < 500 else "server_error")
        elif case.listener == "umb":
            assert set(answer) == {"error"} and set(answer["error"]) == {"type", "message"}
            assert answer["error"]["type"] == case.detail and case.words in answer["error"]["message"], answer
        else:
            assert list(answer) == ["status_code", "request_uid", "message", "error", "data"]
            assert (answer["status_code"], answer["message"], answer["data"]) == (case.detail, "", {}), answer
            assert case.words in answer["error"], answer
    _still_serves(case, gateway, http, channel)


STREAM_CASES = [c for c in GRPC_CASES if c.request[0] == "ModelInfer"]


@pytest.mark.parametrize("case", STREAM_CASES, ids=[f"stream-{c.name}" for c in STREAM_CASES])
def test_malformed_stream_message(case: Case, gateway: GatewayProcess, channel: grpc.Channel) -> None:
    """Every bad ModelInfer message, sent in a ModelStreamInfer call between
    two good ones: its error comes back in the stream (``error_message``,
    the same words as the unary error), and the stream goes on."""
    good = infer(("INPUT0", "UINT8", [2]), raw=[b"\1\2"])
    call = channel.stream_stream(pb.method_path("ModelStreamInfer"),
                                 request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
                                 response_deserializer=pb.ModelStreamInferResponse.FromString)
    replies = list(call(iter([good, case.request[1], good]), timeout=10))
    assert len(replies) == 3, replies
    errors = [r.error_message for r in replies if r.error_message]
    assert len(errors) == 1 and case.words in errors[0], errors
    answered = [r.infer_response.raw_output_contents[0] for r in replies if not r.error_message]
    assert answered == [b"\1\2", b"\1\2"]


def test_no_traceback_in_the_log(gateway: GatewayProcess) -> None:
    assert "Traceback" not in gateway.log()
