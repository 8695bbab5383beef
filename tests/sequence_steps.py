"""Helpers for the sequence affinity tests: one step of a running-sum
sequence, which endpoint holds which sequence, and Triton's sequence example
clients run until both endpoints have held sequences."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from support import GatewayProcess, scrape_metrics, wait_for

EXAMPLES = Path(__file__).resolve().parent / "data" / "triton_examples"
RUNS = 10  # each run of an example has 1/4 odds of sending all its sequences to one endpoint


def step(client: httpclient.InferenceServerClient, sequence_id: int, value: int, *, start: bool = False,
         end: bool = False, headers: dict[str, str] | None = None) -> int:
    """One step of a ``simple_string_dyna_sequence`` sequence: its running sum."""
    item = httpclient.InferInput("INPUT", [1, 1], "INT32")
    item.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
    result = client.infer("simple_string_dyna_sequence", [item], sequence_id=str(sequence_id),
                          sequence_start=start, sequence_end=end, headers=headers)
    return int(result.as_numpy("OUTPUT")[0, 0])


def sequence_requests(gateway: GatewayProcess) -> float:
    """Requests to the sequence models that ``gateway`` served."""
    return sum(value for name, labels, value in scrape_metrics(gateway)
               if name == "gateway_requests_total" and "sequence" in labels.get("model", ""))


def unhealthy_endpoints(gateway: GatewayProcess, upstream: str) -> int:
    return sum(1 for name, labels, value in scrape_metrics(gateway)
               if name == "gateway_endpoint_healthy" and labels.get("upstream") == upstream and value == 0)


def start_on_each(client: httpclient.InferenceServerClient, backends: list[GatewayProcess], count: int,
                  first_id: int, headers: dict[str, str] | None = None) -> list[list[int]]:
    """Starts sequences (each at 1) until each of the two backends holds
    ``count``, told apart by the backends' request counts; ids past that are
    ended at once. The ids each backend holds."""
    held: list[list[int]] = [[], []]

    def counts_past(total: float) -> list[float] | None:
        counts = [sequence_requests(backend) for backend in backends]
        return counts if sum(counts) > total else None

    for sequence_id in range(first_id, first_id + 64):
        before = counts_past(-1)
        assert before is not None
        step(client, sequence_id, 1, start=True, headers=headers)
        total = sum(before)
        after = wait_for(lambda: counts_past(total), 5, "the START counted")  # noqa: B023 (called at once)
        side = held[1] if after[1] > before[1] else held[0]
        if len(side) < count:
            side.append(sequence_id)
        else:
            step(client, sequence_id, 0, end=True, headers=headers)
        if len(held[0]) == len(held[1]) == count:
            return held
    raise AssertionError(f"64 sequences did not give each endpoint {count}: {held}")


def run_example_over(example: str, url: str, backends: list[GatewayProcess], *args: str,
                     at_least: int = 1) -> list[float]:
    """Runs a Triton sequence example client against ``url``, ``at_least``
    times and with new ids (--offset) until both backends have held
    sequences (with one alone any routing would pass); every run must pass.
    The backends' request counts."""
    served: list[float] = []
    # Offsets 1 and 2 give the dyna string sequence the id of an int one
    # (1002 + k against 1000 + 2k, 1001 + 2k): the stream examples then mix
    # up their answers by id.
    for offset in (0, *range(3, 2 + RUNS)):
        command = [sys.executable, str(EXAMPLES / example), "-u", url, "-o", str(offset), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "PASS" in result.stdout, result.stdout + result.stderr
        served = [sequence_requests(b) for b in backends]
        at_least -= 1
        if at_least <= 0 and all(count > 0 for count in served):
            break
    return served
