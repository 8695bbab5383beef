"""GraphStorm's error table and the gateway's errors that carry its codes.

A GraphStorm endpoint answers HTTP 200 and puts the outcome in the body's
``status_code``. Validation raises :class:`GraphStormError` with the exact
code GraphStorm uses; any other :class:`GatewayError` is encoded through
:data:`STATUS_OF_KIND`; an upstream endpoint's code is read through
:data:`KIND_OF_STATUS`. The leading phrases of the messages follow
GraphStorm's categories so logs read alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.core.errors import ErrorKind, ErrorTable, GatewayError

OK = 200
JSON_FORMAT = 400  # wrong content type, invalid JSON, malformed target
MISSING_FIELD = 401  # targets missing or empty
TARGET_TYPE = 403  # a target's node type is not in the graph
NOT_FOUND = 404  # a target's node id is not in the graph, or a model feature is absent
CONSTRUCTION = 411  # the graph cannot be built (structure, types, features)
TASK_MISMATCH = 421  # gml_task not served by this endpoint
INTERNAL = 500  # anything failing after validation (inference, upstream)

# Every kind has a code (a test checks). Failures after validation are
# reported as 500 by the frontend whatever their kind (GraphStorm reports
# any inference failure so); this table serves failures before inference.
STATUS_OF_KIND: Mapping[ErrorKind, int] = MappingProxyType({
    ErrorKind.MALFORMED_REQUEST: JSON_FORMAT,
    ErrorKind.INVALID_INPUT: CONSTRUCTION,
    ErrorKind.MODEL_NOT_FOUND: INTERNAL,  # a gateway configuration problem, not the client's
    ErrorKind.UNSUPPORTED: TASK_MISMATCH,
    ErrorKind.UNAUTHENTICATED: JSON_FORMAT,
    ErrorKind.TOO_LARGE: JSON_FORMAT,
    ErrorKind.OVERLOADED: INTERNAL,
    ErrorKind.UPSTREAM_OVERLOADED: INTERNAL,
    ErrorKind.NOT_READY: INTERNAL,
    ErrorKind.UPSTREAM_UNAVAILABLE: INTERNAL,
    ErrorKind.UPSTREAM_TIMEOUT: INTERNAL,
    ErrorKind.UPSTREAM_BAD_RESPONSE: INTERNAL,
    ErrorKind.INTERNAL: INTERNAL,
})

# An upstream GraphStorm endpoint's code as a kind, for other frontends.
KIND_OF_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    JSON_FORMAT: ErrorKind.MALFORMED_REQUEST,
    MISSING_FIELD: ErrorKind.MALFORMED_REQUEST,
    402: ErrorKind.MALFORMED_REQUEST,  # "missing data in field": defined, never emitted
    TARGET_TYPE: ErrorKind.INVALID_INPUT,
    NOT_FOUND: ErrorKind.INVALID_INPUT,
    CONSTRUCTION: ErrorKind.INVALID_INPUT,
    TASK_MISMATCH: ErrorKind.UNSUPPORTED,
})


# The HTTP status of refusals made before an invocation is read (overload);
# every other answer is HTTP 200 with the code in the envelope.
HTTP_STATUS_OF_KIND: Mapping[ErrorKind, int] = MappingProxyType({ErrorKind.OVERLOADED: 429})

# What the frontend's HTTP statuses stand for when no handler noted an error
# (metrics' outcome): its refusals before an invocation is read.
KIND_OF_HTTP_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    400: ErrorKind.MALFORMED_REQUEST, 401: ErrorKind.UNAUTHENTICATED, 404: ErrorKind.UNSUPPORTED,
    405: ErrorKind.UNSUPPORTED, 413: ErrorKind.TOO_LARGE, 429: ErrorKind.OVERLOADED,
})

# An endpoint's HTTP status other than 200 (no envelope to read), as a kind;
# other statuses: UPSTREAM_BAD_RESPONSE.
KIND_OF_UPSTREAM_HTTP_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    429: ErrorKind.UPSTREAM_OVERLOADED,  # its own limit (SageMaker throttling), as for every protocol
    502: ErrorKind.UPSTREAM_UNAVAILABLE, 503: ErrorKind.UPSTREAM_UNAVAILABLE, 504: ErrorKind.UPSTREAM_UNAVAILABLE,
})


class GraphStormError(GatewayError):
    """A failure with GraphStorm's own ``status_code``."""

    def __init__(self, status_code: int, kind: ErrorKind, message: str) -> None:
        super().__init__(kind, message)
        self.status_code = status_code


def kind_of_status(code: int) -> ErrorKind:
    """An endpoint's ``status_code`` as a kind (codes it has no validation
    meaning for, 500 included: a bad response)."""
    return KIND_OF_STATUS.get(code, ErrorKind.UPSTREAM_BAD_RESPONSE)


# The codes an endpoint answers (docs/graphstorm.md), 402 included (defined, never emitted).
ERRORS = ErrorTable(STATUS_OF_KIND, kind_of_status, frozenset({400, 401, 402, 403, 404, 411, 421, 500}))


def kind_of_http_status(status: int) -> ErrorKind:
    """An endpoint's HTTP status other than 200 as a kind."""
    return KIND_OF_UPSTREAM_HTTP_STATUS.get(status, ErrorKind.UPSTREAM_BAD_RESPONSE)


def status_code_of(error: GatewayError) -> int:
    if isinstance(error, GraphStormError):
        return error.status_code
    return STATUS_OF_KIND[error.kind]


def json_format(detail: str) -> GraphStormError:
    return GraphStormError(JSON_FORMAT, ErrorKind.MALFORMED_REQUEST,
                           f"General JSON format error: the input payload has a JSON format error. Details: {detail}")


def missing_field(name: str) -> GraphStormError:
    return GraphStormError(MISSING_FIELD, ErrorKind.MALFORMED_REQUEST,
                           f"Missing Required Field: the input payload misses the '{name}' field (or it is empty). "
                           "See the GraphStorm real-time inference payload specification.")


def target_type_absent(node_type: str) -> GraphStormError:
    return GraphStormError(TARGET_TYPE, ErrorKind.INVALID_INPUT,
                           f"Mismatched target node type: the target node type {shown(node_type)} does not exist "
                           "in the payload graph.")


def target_id_absent(node_id: object) -> GraphStormError:
    return GraphStormError(NOT_FOUND, ErrorKind.INVALID_INPUT,
                           f"Mismatched target node IDs: the target node ID {shown(node_id)} does not exist "
                           "in the payload graph.")


def feature_absent(entity: str, type_name: object, feature: str) -> GraphStormError:
    return GraphStormError(NOT_FOUND, ErrorKind.INVALID_INPUT,
                           f"Missing {entity} feature: the {shown(type_name)} {entity}s do not contain the "
                           f"feature {shown(feature)} the model requires.")


def construction(detail: str) -> GraphStormError:
    return GraphStormError(CONSTRUCTION, ErrorKind.INVALID_INPUT,
                           "Graph Construction Failure: failed to construct a graph from the payload. "
                           f"Details: {detail}")


def task_mismatch(task: object, supported: tuple[str, ...]) -> GraphStormError:
    return GraphStormError(TASK_MISMATCH, ErrorKind.UNSUPPORTED,
                           f"Task Mismatch: the payload's task mismatches the endpoint model. Details: this endpoint "
                           f"serves {', '.join(supported)}, but the payload asks for {shown(task)}.")


def internal(detail: str, kind: ErrorKind = ErrorKind.INTERNAL) -> GraphStormError:
    """Status 500; ``kind`` keeps the cause (upstream down, unknown model)
    for metrics and the access log."""
    return GraphStormError(INTERNAL, kind,
                           "Internal Server Error: please contact your endpoint administrators about this error. "
                           f"Details: {detail}")


def shown(value: object, limit: int = 80) -> str:
    """A short, quoted rendering of a client value for messages (never the
    whole payload)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
