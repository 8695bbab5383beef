"""Evaluate and differentiate a model for a UM-Bridge client, through the
data plane's canonical interface only (infer, call_operation), so it works
the same for builtin, V2 and UM-Bridge upstreams."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import numpy as np

from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import DERIVATIVE_OPERATION, Derivative, RawPayload, RequestContext
from gateway.protocols.base import DataPlaneApi
from gateway.protocols.umbridge import codec, finite_differences
from gateway.protocols.umbridge.mapping import ModelView

# Rows of an unbatched model are separate requests; at most this many at once.
MAX_CONCURRENT_ROWS = 8


class Bridge:
    def __init__(self, dataplane: DataPlaneApi, ctx: RequestContext, view: ModelView, config_text: str) -> None:
        self.dataplane = dataplane
        self.ctx = ctx
        self.view = view
        self.config_text = config_text

    async def _evaluate_batch(self, rows: finite_differences.Rows) -> finite_differences.Rows:
        request = self.view.request(rows, self.config_text, self.ctx.request_id)
        response = await self.dataplane.infer(request, self.ctx)
        return self.view.rows_of(response, len(rows))

    async def evaluate_point(self, inputs: Sequence[np.ndarray],
                             raw: RawPayload | None) -> tuple[list[np.ndarray], bytes | bytearray | None]:
        """The outputs of one point; with ``raw`` (the client's call, fit to
        go upstream as it is) also the upstream's own answer when the
        client may have it as it is: a UM-Bridge upstream's checked answer
        holding exactly the vectors asked for (the view's), in its order."""
        request = self.view.request([inputs], self.config_text, self.ctx.request_id)
        request.raw = raw
        response = await self.dataplane.infer(request, self.ctx)
        (outputs,) = self.view.rows_of(response, 1)
        relayed = response.raw
        if raw is None or relayed is None or relayed.protocol != codec.PROTOCOL or not self.view.in_upstream_order:
            return outputs, None
        return outputs, relayed.body

    async def evaluate(self, rows: finite_differences.Rows) -> finite_differences.Rows:
        """Outputs of every row: batched requests when the model has a batch
        dimension (one unless ``max_batch`` splits them), else one per row."""
        if self.view.batched:
            fd = self.view.finite_differences
            size = (fd.max_batch if fd and fd.max_batch else 0) or max(len(rows), 1)
            chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
        else:
            chunks = [[row] for row in rows]
        if len(chunks) == 1:
            return await self._evaluate_batch(chunks[0])
        limit = asyncio.Semaphore(MAX_CONCURRENT_ROWS)

        async def bounded(chunk: finite_differences.Rows) -> finite_differences.Rows:
            async with limit:
                return await self._evaluate_batch(chunk)

        results = await asyncio.gather(*(bounded(chunk) for chunk in chunks))
        return [row for result in results for row in result]

    async def derivative(self, inputs: Sequence[np.ndarray], d: Derivative) -> np.ndarray:
        view = self.view
        if d.kind in view.native:
            result = await self._native(inputs, d)
        else:
            fd = view.finite_differences
            assert fd is not None  # view.require() let the call through
            hessian = d.kind == "ApplyHessian"
            step = (fd.hessian_step if hessian else fd.step) or finite_differences.default_step(
                view.epsilon(d.in_wrt), hessian)
            result = await finite_differences.derivative(self.evaluate, view.round_trip, inputs, d, step)
        expected = view.output_sizes[d.out_wrt] if d.kind == "ApplyJacobian" else view.input_sizes[d.in_wrt]
        if result.size != expected:
            raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                               f"{d.kind} of model '{view.name}' returned {result.size} values; expected {expected}")
        return result

    async def _native(self, inputs: Sequence[np.ndarray], d: Derivative) -> np.ndarray:
        """The upstream's own derivative, indices translated to its tensor order."""
        view = self.view
        assert view.input_positions is not None and view.output_positions is not None
        upstream_d = dataclasses.replace(d, out_wrt=view.output_positions[d.out_wrt],
                                         in_wrt=view.input_positions[d.in_wrt],
                                         in_wrt2=view.input_positions[d.in_wrt2])
        request = view.request([list(inputs)], self.config_text, self.ctx.request_id)
        result = await self.dataplane.call_operation(DERIVATIVE_OPERATION, request, self.ctx, upstream_d)
        return np.asarray(result, dtype=np.float64).reshape(-1)
