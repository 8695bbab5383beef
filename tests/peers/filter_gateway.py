"""The gateway with one more filter, defined here in the tests: proof that a
new filter is one class plus one registry line.

``python -m peers.filter_gateway serve ...`` (with ``tests`` on PYTHONPATH)
registers the ``stamp`` filter, then runs the gateway's CLI. A policy
``{name: P, stamp: {mark: N}}`` then:
- refuses a request whose parameter ``stamp_refuse`` is true (OVERLOADED, Retry-After 7 s),
- answers a request whose parameter ``stamp_early`` is true itself (an
  ``EARLY`` INT32 [1] output holding ``mark``), the upstream never called,
- adds a ``STAMP`` INT32 [1] output holding ``mark`` to every other answer,
- counts what it saw in the ``stamp`` response parameter as "<requests>/<responses>/<errors>".
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from gateway.config.node import Node
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import InferResponse, Tensor
from gateway.dataplane.filters.base import Filter, FilterCall

TESTS = Path(__file__).resolve().parent.parent


def filter_env() -> dict[str, str]:
    return {"PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


class Refused(GatewayError):
    retry_after = 7


class StampFilter(Filter):
    kind = "stamp"

    def __init__(self, name: str, options: Any, services: Any) -> None:
        super().__init__(name, options, services)
        self.seen = [0, 0, 0]  # requests, responses, errors

    @classmethod
    def parse_options(cls, node: Node) -> int:
        mark: int = node.integer("mark", 1)
        node.check_no_unknown_keys()
        return mark

    def _mark(self, name: str) -> Tensor:
        return Tensor.from_numpy(name, np.array([self.options], dtype=np.int32))

    async def on_request(self, call: FilterCall) -> InferResponse | None:
        self.seen[0] += 1
        parameters = call.request.parameters
        if parameters.get("stamp_refuse"):
            raise Refused(ErrorKind.OVERLOADED, f"policy {self.name} refused the request")
        if parameters.get("stamp_early"):
            return InferResponse(call.request.model_name, call.request.model_version, call.request.id,
                                 [self._mark("EARLY")], {"stamp": self._counts()})
        return None

    async def on_response(self, call: FilterCall, response: InferResponse) -> InferResponse:
        self.seen[1] += 1
        # A new answer: an upstream's own bytes (raw) would otherwise be relayed as they came.
        return dataclasses.replace(response, outputs=[*response.outputs, self._mark("STAMP")],
                                   parameters={**response.parameters, "stamp": self._counts()}, raw=None)

    def on_error(self, call: FilterCall, error: GatewayError) -> None:
        self.seen[2] += 1

    def _counts(self) -> str:
        return "/".join(str(n) for n in self.seen)


# The one registry line a new filter takes (here made at run time, from the tests).
REGISTRY_LINE = ("stamp", "peers.filter_gateway:StampFilter")


def main() -> int:
    from gateway.app.cli import main as gateway_main
    from gateway.dataplane.filters import registry

    registry.FILTERS[REGISTRY_LINE[0]] = REGISTRY_LINE[1]
    return gateway_main()


if __name__ == "__main__":
    sys.exit(main())
