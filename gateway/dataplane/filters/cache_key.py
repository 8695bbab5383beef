"""The response cache's key: what makes two inference requests the same
question (Triton's response cache semantics), whatever protocol they came in.

A key covers the route (its name and where it sends: the client's model name
and version mean what the route makes of them), the model name and version
the client asked for, the request's parameters, every input's name,
datatype, shape, parameters and bytes, and the requested outputs with their
parameters. Left out: the request id, and the parameters that only say how
an answer is written on the wire or scheduled (V2 REST's binary extension,
priority, timeout): a hit is encoded for the request that asks.

Inputs are taken in name order (they are named: the order on the wire says
nothing), outputs in the order asked (the answer's order follows it).
Tensor bytes are hashed where they lie (numpy buffers, no copy); a request
whose tensors are big is hashed in the offload pool (hashlib releases the
GIL for big updates).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from gateway.core.types import InferRequest, Tensor
from gateway.runtime.offload import Offloader

# Parameters that change how an answer is encoded or scheduled, not what it is.
NOT_KEYED = frozenset({"binary_data_output", "binary_data", "binary_data_size", "priority", "timeout"})
DIGEST_BYTES = 16
# What a BYTES element is taken to weigh when choosing where to work on it (its
# length prefix and a Python call); exact sizes would cost a pass of their own.
BYTES_ELEMENT_WEIGHT = 64


def route_salt(name: str, target_model: str | None, target_version: str | None, upstreams: tuple[str, ...]) -> bytes:
    """What a route adds to its keys: its name and where it sends, so that a
    reload pointing the route elsewhere serves no answer of the old target."""
    return repr((name, target_model, target_version, upstreams)).encode()


def rough_size(tensors: list[Tensor]) -> int:
    """About how many bytes a pass over ``tensors`` reads (where to run it)."""
    return sum(t.data.size * BYTES_ELEMENT_WEIGHT if t.datatype == "BYTES" else t.data.nbytes for t in tensors)


async def request_key(request: InferRequest, salt: bytes, offload: Offloader) -> bytes:
    """The key of ``request`` (a digest), hashed in the pool when big."""
    return await offload.run(rough_size(request.inputs), key_of, request, salt)


def key_of(request: InferRequest, salt: bytes) -> bytes:
    inputs = sorted(request.inputs, key=_name) if len(request.inputs) > 1 else request.inputs
    head = (request.model_name, request.model_version, _keyed(request.parameters),
            [(t.name, t.datatype, t.shape, _keyed(t.parameters)) for t in inputs],
            [(o.name, _keyed(o.parameters)) for o in request.outputs])
    digest = hashlib.blake2b(salt, digest_size=DIGEST_BYTES)
    digest.update(repr(head).encode())
    for tensor in inputs:
        _hash_data(digest, tensor)
    return digest.digest()


def _name(tensor: Tensor) -> str:
    return tensor.name


def _keyed(parameters: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    if not parameters:
        return ()
    return tuple(sorted((k, v) for k, v in parameters.items() if k not in NOT_KEYED))


def _hash_data(digest: Any, tensor: Tensor) -> None:
    data = tensor.data
    if tensor.datatype != "BYTES":
        # The shape (in the head) fixes the length; the buffer as it lies.
        digest.update(data if data.flags.c_contiguous else np.ascontiguousarray(data))
        return
    for item in data.reshape(-1):  # each element with its length: ["ab", "c"] is not ["a", "bc"]
        digest.update(len(item).to_bytes(8, "little"))
        digest.update(item)
