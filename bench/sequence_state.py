"""What live sequences cost a gateway process: start N sequences of a
builtin sequence model with R rows each (binary HTTP, never ended) and
print the gateway's RSS and ``gateway_inflight_bytes`` before and after,
and how the starts were answered.

    cd <repo> && .venv/bin/python bench/sequence_state.py \\
        --model simple_sequence --sequences 60 --rows 4000000

Runs the default limits against a builtin upstream on 127.0.0.1, port 0.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from peers.stall_attack import rss_bytes
from support import BUILTIN_REST_CONFIG, GatewayProcess, metric_value, scrape_metrics, write_config


def figures(gw: GatewayProcess) -> str:
    assert gw.proc is not None
    time.sleep(1.5)  # the gauge is sampled by the loop-lag monitor
    inflight = metric_value(scrape_metrics(gw), "gateway_inflight_bytes")
    return f"RSS {rss_bytes(gw.proc.pid) / 2**20:.0f} MiB, gateway_inflight_bytes {inflight / 2**10:.1f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="simple_sequence")
    parser.add_argument("--sequences", type=int, default=60)
    parser.add_argument("--rows", type=int, default=4_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, \
            GatewayProcess(write_config(Path(directory), BUILTIN_REST_CONFIG), Path(directory) / "gateway.log") as gw:
        print("before:", figures(gw))
        data = np.ones((args.rows, 1), np.int32)
        answers: collections.Counter[str] = collections.Counter()
        with httpclient.InferenceServerClient(gw.url("rest"), network_timeout=120) as client:
            for i in range(args.sequences):
                item = httpclient.InferInput("INPUT", list(data.shape), "INT32")
                item.set_data_from_numpy(data, binary_data=True)
                try:
                    client.infer(args.model, [item], sequence_id=str(1000 + i), sequence_start=True,
                                 outputs=[httpclient.InferRequestedOutput("OUTPUT", binary_data=True)])
                    answers["200"] += 1
                except InferenceServerException as exc:
                    answers[f"{exc.status()} {(exc.message() or '')[:80]}"] += 1
        print(f"after {args.sequences} sequences of {args.model}, {args.rows} rows each:", figures(gw))
        print("answers:", dict(answers))


if __name__ == "__main__":
    main()
