"""tritonclient.grpc's bidirectional stream as the stream tests drive it:
results in a queue, the builtin repeat model's inputs, and the final flag
Triton sets on a response."""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient


class Stream:
    """A tritonclient.grpc stream whose results land in a queue; ``hold``
    (when set) blocks the client's reading thread until released."""

    def __init__(self, url: str, hold: threading.Event | None = None) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.hold = hold

        def callback(result: Any, error: Any) -> None:
            self.results.put((result, error))
            if self.hold is not None:
                self.hold.wait(60)

        self.client.start_stream(callback=callback)

    def next(self, timeout: float = 20.0) -> tuple[Any, Any]:
        return self.results.get(timeout=timeout)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def repeat_inputs(values: list[int], delay_ms: int | list[int] = 0, wait_ms: int = 0,
                  module: Any = grpcclient) -> list[Any]:
    """IN, DELAY (one per value, or one for all) and WAIT of the repeat models."""
    delays = delay_ms if isinstance(delay_ms, list) else [delay_ms] * len(values)
    inputs = [module.InferInput("IN", [len(values)], "INT32"), module.InferInput("DELAY", [len(values)], "UINT32"),
              module.InferInput("WAIT", [1], "UINT32")]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array(delays, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([wait_ms], dtype=np.uint32))
    return inputs


def final_flag(result: Any) -> bool | None:
    """The response's triton_final_response parameter, or None without one."""
    parameters = result.get_response().parameters
    return parameters["triton_final_response"].bool_param if "triton_final_response" in parameters else None
