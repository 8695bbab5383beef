"""GraphStorm real-time inference codec (gs-realtime-v0.1), both directions.

Pure functions, no server imports. Downstream: check the content type, parse
the body, compute ``request_uid``, validate the payload into an
:class:`~gateway.protocols.graphstorm.payload.Invocation` and encode the
answer envelope. Upstream: build a payload from graph tensors and read an
endpoint's envelope back into prediction tensors.

Every answer is HTTP 200 with ``{status_code, request_uid, message, error,
data}`` in this key order; on errors ``message`` is "" and ``data`` is {}.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from gateway.core.errors import ErrorKind, GatewayError, bounded
from gateway.core.graphtensors import GraphTensors, Relation, output_rows, prediction_name
from gateway.core.types import Tensor
from gateway.protocols.graphstorm import errors
from gateway.protocols.graphstorm.errors import GraphStormError, shown
from gateway.protocols.graphstorm.payload import Invocation, decode_payload, encode_payload
from gateway.protocols.graphstorm.schema import GraphSchema

JSON_TYPE = "application/json"
# SageMaker's multi-model header; when present it names the model to route.
TARGET_MODEL_HEADER = "X-Amzn-SageMaker-Target-Model"
SUCCESS_MESSAGE = "Request processed successfully."
# On an endpoint's unchanged answer (InferResponse.raw): its status_code.
STATUS_PARAMETER = "graphstorm_status_code"
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def request_uid(body: bytes) -> str:
    """GraphStorm's request id: the last 16 hex digits of sha256(body)."""
    return hashlib.sha256(body).hexdigest()[-16:]


# --- downstream: request ------------------------------------------------------------


def check_content_type(content_type: str | None) -> None:
    # Exactly application/json, as GraphStorm's entry point compares it:
    # "application/json; charset=utf-8" is refused there too.
    if content_type != JSON_TYPE:
        raise errors.json_format(f"unsupported content type {shown(content_type)}; the endpoint accepts exactly "
                                 f"'{JSON_TYPE}'")


def parse_json(body: bytes) -> Any:
    """The body as JSON. orjson first; when it refuses, Python's json module,
    which GraphStorm uses and which also takes NaN, Infinity and lone
    surrogate escapes. A body that is not UTF-8 is a JSON format error."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.json_format(f"the body is not UTF-8 text (invalid byte at offset {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.json_format(f"{exc.msg}: line {exc.lineno} column {exc.colno} (char {exc.pos})") from None
    except RecursionError:
        raise errors.json_format("the JSON is nested too deeply") from None


def decode_invocation(payload: Any, schema: GraphSchema | None, tasks: tuple[str, ...]) -> Invocation:
    if not isinstance(payload, dict):
        raise errors.json_format(f"the payload must be a JSON object, got {type(payload).__name__}")
    return decode_payload(payload, schema, tasks)


# --- downstream: answer ----------------------------------------------------------------


def encode_envelope(status_code: int, uid: str, message: str = "", error: str = "",
                    data: Mapping[str, Any] | None = None) -> bytes:
    envelope = {"status_code": status_code, "request_uid": uid, "message": message, "error": error,
                "data": data if data is not None else {}}
    try:
        return orjson.dumps(envelope, option=_JSON_OPTIONS)
    except orjson.JSONEncodeError:
        # Ids and names echoed from a payload may hold what Python's json
        # reads and orjson cannot write (lone surrogates, integers beyond 64
        # bits): written as GraphStorm's own json.dumps writes them.
        return json.dumps(envelope, default=_json_default, separators=(",", ":")).encode()


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode_error(error: GatewayError, uid: str) -> bytes:
    return encode_envelope(errors.status_code_of(error), uid, error=error.message)


def encode_results(invocation: Invocation, outputs: list[Tensor], uid: str) -> bytes:
    """The success envelope: one result per target, grouped by type in graph
    order. INVALID_INPUT when the model's outputs do not fit the targets."""
    by_name = {tensor.name: tensor for tensor in outputs}
    results: list[dict[str, Any]] = []
    for node_type, ids in invocation.node_targets.items():
        rows = output_rows(by_name, node_type, len(ids)).tolist()
        results += [{"node_type": node_type, "node_id": node_id, "prediction": row}
                    for node_id, row in zip(ids, rows, strict=True)]
    for relation, pairs in invocation.edge_targets.items():
        rows = output_rows(by_name, relation, len(pairs)).tolist()
        edge_type = list(relation)
        results += [{"edge_type": edge_type, "src_node_id": src, "dest_node_id": dst, "prediction": row}
                    for (src, dst), row in zip(pairs, rows, strict=True)]
    return encode_envelope(errors.OK, uid, SUCCESS_MESSAGE, data={"results": results})


# --- upstream -----------------------------------------------------------------------------


def encode_request(graph: GraphTensors, task: str) -> bytes:
    return orjson.dumps(encode_payload(graph, task))


def decode_envelope(body: bytes | bytearray, upstream: str) -> dict[str, Any]:
    """An endpoint's answer; UPSTREAM_BAD_RESPONSE unless it is an envelope."""
    try:
        envelope = orjson.loads(body)
    except orjson.JSONDecodeError:
        envelope = None
    if not isinstance(envelope, dict) or type(envelope.get("status_code")) is not int:
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                           f"upstream '{upstream}' did not answer a GraphStorm response envelope")
    return envelope


def upstream_error(envelope: dict[str, Any], upstream: str) -> GraphStormError:
    code = envelope["status_code"]
    kind = errors.kind_of_status(code)
    detail = str(envelope.get("error", ""))[:512]
    return GraphStormError(code, kind, bounded(f"upstream '{upstream}' answered status_code {code}: {detail}"))


def decode_predictions(envelope: dict[str, Any], graph: GraphTensors, upstream: str) -> list[Tensor]:
    """A success envelope's results as ``prediction/...`` tensors, one per
    target tensor of ``graph``, rows in target order."""
    data = envelope.get("data")
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise _bad(upstream, "its answer has no data.results list")
    expected: dict[str | Relation, list[Any]] = {}
    for node_type, positions in graph.node_targets.items():
        ids = graph.node_ids[node_type]
        expected[node_type] = [ids[p].decode("utf-8", "replace") for p in positions.tolist()]
    for relation, pairs in graph.edge_targets.items():
        src, dst = graph.node_ids[relation[0]], graph.node_ids[relation[2]]
        expected[relation] = [(src[s].decode("utf-8", "replace"), dst[d].decode("utf-8", "replace"))
                              for s, d in zip(*pairs.tolist(), strict=True)]
    rows: dict[str | Relation, list[Any]] = {key: [] for key in expected}
    for result in results:
        key, ident = _result_key(result)
        found = rows.get(key) if key is not None else None
        if found is None or len(found) >= len(expected[key]) or expected[key][len(found)] != ident:  # type: ignore[index]
            raise _bad(upstream, f"it answered a result for a target it was not asked about ({shown(ident)})")
        found.append(result.get("prediction"))
    outputs: list[Tensor] = []
    for key, predictions in rows.items():
        if len(predictions) != len(expected[key]):
            raise _bad(upstream, f"it answered {len(predictions)} results for {len(expected[key])} targets")
        try:
            array = np.array(predictions, dtype=np.float32).reshape(len(predictions), -1)
        except (ValueError, TypeError):
            raise _bad(upstream, "its predictions are not lists of numbers of one length") from None
        outputs.append(Tensor(prediction_name(key), "FP32", tuple(array.shape), array))
    return outputs


def _result_key(result: Any) -> tuple[str | Relation | None, Any]:
    if not isinstance(result, dict):
        return None, result
    if "edge_type" in result:
        edge_type = result.get("edge_type")
        relation = tuple(edge_type) if isinstance(edge_type, list) and len(edge_type) == 3 else None
        ident = (str(result.get("src_node_id")), str(result.get("dest_node_id")))
        return relation, ident  # type: ignore[return-value]
    node_type = result.get("node_type")
    return (node_type if isinstance(node_type, str) else None), str(result.get("node_id"))


def _bad(upstream: str, detail: str) -> GatewayError:
    return GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"upstream '{upstream}' answered badly: {detail}")
