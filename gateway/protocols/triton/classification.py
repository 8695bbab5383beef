"""Triton's classification extension, computed by the gateway.

An output requested with the parameter ``classification: N`` comes back as
BYTES holding the N highest values as ``"value:index"`` (``":label"``
appended when the model has a label for that index). For a batching model
each batch row is classified on its own (shape ``[batch, N]``); otherwise the
whole tensor is one row (shape ``[N]``). N larger than a row is cut to the
row. Values read as Triton writes them (C's ``%f`` for floating types, the
integer otherwise); equal values rank by lower index; NaN ranks last.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.core.errors import invalid
from gateway.core.types import InferRequest, RequestedOutput, Tensor

PARAMETER = "classification"


def requested(request: InferRequest) -> dict[str, int]:
    """Output name -> class count, for outputs that ask for classification
    (a count of 0 means none, as tritonclient's default ``class_count=0``)."""
    wanted: dict[str, int] = {}
    for output in request.outputs:
        if PARAMETER not in output.parameters:
            continue
        count = output.parameters[PARAMETER]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise invalid(f"output '{output.name}': parameter '{PARAMETER}' must be a non-negative integer "
                          f"(the number of classes to return), got {str(count)[:40]!r}")
        if count:
            wanted[output.name] = count
    return wanted


def without_parameter(request: InferRequest) -> InferRequest:
    """The request with the classification parameters removed: the gateway
    classifies, so an upstream Triton must return the raw tensor. The
    client's own bytes still ask for classification: they are dropped."""
    outputs = [RequestedOutput(o.name, {k: v for k, v in o.parameters.items() if k != PARAMETER})
               for o in request.outputs]
    return dataclasses.replace(request, outputs=outputs, raw=None)


def _ascending_keys(rows: np.ndarray) -> np.ndarray:
    """Keys whose ascending order is the values' descending order, NaN last:
    negated floats, bitwise-inverted integers (no overflow, signed or not)."""
    if rows.dtype.kind == "f":
        return np.where(np.isnan(rows), np.inf, -rows)
    return np.invert(rows)


def _top_indices(keys: np.ndarray, top: int) -> np.ndarray:
    """Indices of the ``top`` smallest keys of a row, ties by lower index:
    a partition finds the cut, then only the candidates are sorted."""
    cut = np.partition(keys, top - 1)[top - 1]
    candidates = np.flatnonzero(keys <= cut)  # ascending indices; a stable sort keeps them so on ties
    return candidates[np.argsort(keys[candidates], kind="stable")][:top]


def _format(value: Any, floating: bool) -> str:
    return f"{float(value):f}" if floating else str(int(value))


def classify(tensor: Tensor, count: int, batched: bool, labels: Sequence[str] = ()) -> Tensor:
    """The top ``count`` classes of ``tensor`` as a BYTES tensor."""
    if tensor.datatype in ("BYTES", "BOOL"):
        raise invalid(f"output '{tensor.name}' is {tensor.datatype}; classification needs a numeric output")
    data = tensor.data
    if tensor.datatype == "BF16":
        data = (data.astype(np.uint32) << 16).view(np.float32)
    batched = batched and len(tensor.shape) >= 1
    rows = data.reshape((tensor.shape[0], math.prod(tensor.shape[1:])) if batched else (1, tensor.element_count))
    top = min(count, rows.shape[1])
    floating = rows.dtype.kind == "f"
    keys = _ascending_keys(rows)
    order = np.empty((rows.shape[0], top), dtype=np.intp)
    for r, row in enumerate(keys if top else ()):
        order[r] = _top_indices(row, top)
    out = np.empty(order.shape, dtype=object)
    for r, row_order in enumerate(order):
        for k, index in enumerate(row_order.tolist()):
            text = f"{_format(rows[r, index], floating)}:{index}"
            if index < len(labels):
                text += f":{labels[index]}"
            out[r, k] = text.encode()
    shape = (rows.shape[0], top) if batched else (top,)
    return Tensor(tensor.name, "BYTES", shape, out.reshape(shape))
