"""What a payload_log policy costs a request on its path: the filter's
on_request and on_response for Triton's ``simple`` request (two INT32
[1, 16] inputs, two outputs), writing both events and queueing them, in
CPU µs per request. The senders are held back (what they do runs off the
request path), and the queue is emptied between rounds. Also the cost when
the queue is full (each event dropped) and when sampled out.

    cd <repo> && .venv/bin/python bench/payload_log_cost.py --requests 20000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gateway.config.model import GatewayConfig, ServerIdentity
from gateway.core.types import InferRequest, InferResponse, RequestContext, Tensor
from gateway.dataplane.filters.base import INFER, FilterCall
from gateway.dataplane.filters.payload_log import PayloadLogFilter, PayloadLogOptions
from gateway.runtime.services import GatewayServices


class _Route:
    name = "simple-route"


def _call(n: int) -> tuple[FilterCall, InferResponse]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    request = InferRequest("simple", "", f"id-{n}", [Tensor.from_numpy("INPUT0", a), Tensor.from_numpy("INPUT1", a)])
    response = InferResponse("simple", "1", f"id-{n}", [Tensor.from_numpy("OUTPUT0", a + a),
                                                         Tensor.from_numpy("OUTPUT1", a - a)])
    ctx = RequestContext("rest", "v2-rest", request_id=f"req-{n:08d}")
    return FilterCall(request, ctx, _Route(), INFER), response


async def request_path_cost(options: PayloadLogOptions, requests: int, full: bool) -> float:
    services = GatewayServices(GatewayConfig.__new__(GatewayConfig), ServerIdentity())
    step = PayloadLogFilter("audit", options, services)
    step.sink._senders = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # held back
    calls = [_call(n) for n in range(1000)]
    if full:
        step.sink.max_queue = 0
    spent = 0.0
    for done in range(0, requests, len(calls)):
        started = time.process_time()
        for call, response in calls[: requests - done]:
            await step.on_request(call)
            await step.on_response(call, response)
        spent += time.process_time() - started
        while (event := step.sink._take()) is not None:  # what the senders do, off the path
            step.sink._done(event)
    await step.sink.close()
    return spent / requests * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    base = PayloadLogOptions("http://127.0.0.1:9/")
    print(f"queued both events: {await request_path_cost(base, args.requests, False):.1f} µs CPU per request")
    print(f"queue full (dropped): {await request_path_cost(base, args.requests, True):.1f} µs CPU per request")
    sampled_out = PayloadLogOptions("http://127.0.0.1:9/", sample=0.0)
    print(f"sampled out: {await request_path_cost(sampled_out, args.requests, False):.1f} µs CPU per request")


if __name__ == "__main__":
    asyncio.run(main())
