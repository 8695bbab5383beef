"""Triton's extensions in front of real upstreams, with unmodified
tritonclient: a real MLServer (which has no model configuration and no
statistics of this form) over REST and gRPC, and a second gateway standing in
for a Triton-like upstream that does serve configurations and an index."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from peers.mlserver import MLServerPeer
from support import GatewayProcess, write_config


def _simple_inputs(module: Any, batch: int, seed: int = 0) -> tuple[list[Any], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-100, 100, (batch, 16), dtype=np.int32)
    b = rng.integers(-100, 100, (batch, 16), dtype=np.int32)
    inputs = [module.InferInput("INPUT0", [batch, 16], "INT32"), module.InferInput("INPUT1", [batch, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def _top(values: np.ndarray, count: int) -> list[list[str]]:
    return [[f"{row[i]}:{i}" for i in sorted(range(row.size), key=lambda i: (-row[i], i))[:count]]
            for row in values]


def _decoded(array: np.ndarray) -> list[list[str]]:
    return [[x.decode() if isinstance(x, bytes) else x for x in row] for row in array]


# --- MLServer behind the gateway ------------------------------------------------------------

MLSERVER_CONFIG = """
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: ml-rest, protocol: v2-rest, endpoints: ["{rest}"], timeout: 30s}}
  - {{name: ml-grpc, protocol: v2-grpc, endpoints: ["{grpc}"], timeout: 30s}}
routes:
  - match: {{model: simple-grpc}}
    upstream: ml-grpc
    rewrite: {{model: simple}}
  - match: {{model: "*"}}
    upstream: ml-rest
"""


@pytest.fixture(scope="module")
def gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("ext-mlserver")
    config = MLSERVER_CONFIG.format(rest=mlserver.rest_address, grpc=mlserver.grpc_address)
    with GatewayProcess(write_config(directory, config), directory / "gw.log") as gw:
        yield gw


def test_config_is_synthesized_from_mlserver_metadata(gateway: GatewayProcess) -> None:
    """MLServer keeps no model configuration (REST 404, gRPC UNIMPLEMENTED):
    the gateway writes one from its metadata, over both upstream kinds."""
    with httpclient.InferenceServerClient(gateway.url("rest")) as http, \
            grpcclient.InferenceServerClient(gateway.url("grpc")) as grpc_client:
        for model in ("simple", "simple-grpc"):
            config = http.get_model_config(model)
            assert config["name"] == model and config["max_batch_size"] > 0
            assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
                ("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
            assert "synthesized" in config["parameters"]
            over_grpc = grpc_client.get_model_config(model).config
            assert (over_grpc.name, [list(o.dims) for o in over_grpc.output]) == (model, [[16], [16]])


def test_index_lists_mlserver_models(gateway: GatewayProcess, mlserver: MLServerPeer) -> None:
    with httpclient.InferenceServerClient(gateway.url("rest")) as http:
        index = {e["name"]: e["state"] for e in http.get_model_repository_index()}
    assert index == {**{name: "READY" for name in mlserver.models}, "simple-grpc": "READY"}


def test_statistics_and_classification_over_mlserver(gateway: GatewayProcess) -> None:
    with httpclient.InferenceServerClient(gateway.url("rest")) as http, \
            grpcclient.InferenceServerClient(gateway.url("grpc")) as grpc_client:
        before = {m: http.get_inference_statistics(m)["model_stats"][0] for m in ("simple", "simple-grpc")}
        sent = {"simple": 0, "simple-grpc": 0}
        for seed, (module, client, model) in enumerate([
                (httpclient, http, "simple"), (grpcclient, grpc_client, "simple"),
                (httpclient, http, "simple-grpc"), (grpcclient, grpc_client, "simple-grpc")]):
            inputs, a, b = _simple_inputs(module, 2, seed)
            result = client.infer(model, inputs, outputs=[module.InferRequestedOutput("OUTPUT0", class_count=3)])
            assert _decoded(result.as_numpy("OUTPUT0")) == _top(a + b, 3), (model, client)
            sent[model] += 1
        for model, count in sent.items():
            (stats,) = grpc_client.get_inference_statistics(model, as_json=True)["model_stats"]
            assert int(stats["execution_count"]) - before[model]["execution_count"] == count
            assert int(stats["inference_count"]) - before[model]["inference_count"] == 2 * count


# --- a Triton-like upstream: another gateway, which serves configurations ----------------------

UPSTREAM_CONFIG = """
admin: {address: null}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - upstream: local
classification:
  labels: {simple: labels.txt}
"""

FRONT_CONFIG = """
admin: {{address: null}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: b-rest, protocol: v2-rest, endpoints: ["{rest}"]}}
  - {{name: b-grpc, protocol: v2-grpc, endpoints: ["{grpc}"]}}
routes:
  - match: {{model: via-rest}}
    upstream: b-rest
    rewrite: {{model: simple}}
  - match: {{model: via-grpc}}
    upstream: b-grpc
    rewrite: {{model: simple}}
  - upstream: b-grpc
"""


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    directory = tmp_path_factory.mktemp("ext-chain")
    (directory / "labels.txt").write_text("".join(f"label-{i}\n" for i in range(16)))
    with GatewayProcess(write_config(directory, UPSTREAM_CONFIG, "upstream.yaml"), directory / "b.log") as b:
        front = FRONT_CONFIG.format(rest=b.url("rest"), grpc=b.url("grpc"))
        with GatewayProcess(write_config(directory, front, "front.yaml"), directory / "a.log") as a:
            yield a, b


def test_config_of_an_upstream_that_keeps_one_is_forwarded(chain: tuple[GatewayProcess, GatewayProcess]) -> None:
    """The upstream's own configuration (its label file names, which the
    front gateway does not know) arrives over REST and gRPC upstreams,
    renamed as the client asked."""
    front, _ = chain
    with httpclient.InferenceServerClient(front.url("rest")) as http, \
            grpcclient.InferenceServerClient(front.url("grpc")) as grpc_client:
        for model in ("via-rest", "via-grpc"):
            config = http.get_model_config(model)
            assert config["name"] == model
            assert [o["label_filename"] for o in config["output"]] == ["labels.txt", "labels.txt"]
            assert [o.label_filename for o in grpc_client.get_model_config(model).config.output] == [
                "labels.txt", "labels.txt"]


def test_index_comes_from_the_upstream_repository_index(chain: tuple[GatewayProcess, GatewayProcess]) -> None:
    front, _ = chain
    with grpcclient.InferenceServerClient(front.url("grpc")) as grpc_client:
        names = {m.name for m in grpc_client.get_model_repository_index().models}
    assert names == {"via-rest", "via-grpc", "simple", "simple_string", "identity", "forward", "trig", "gnn",
                     "simple_sequence", "simple_dyna_sequence", "simple_string_dyna_sequence", "repeat_int32",
                     "text_generator", "text_embedder"}


def test_front_classifies_and_each_gateway_counts_its_own(chain: tuple[GatewayProcess, GatewayProcess]) -> None:
    """The front computes classification (the upstream gets the raw output:
    no upstream labels appear) and keeps its own statistics; the upstream's
    statistics count what reached it, under its own model name."""
    front, upstream = chain
    with httpclient.InferenceServerClient(front.url("rest")) as http, \
            httpclient.InferenceServerClient(upstream.url("rest")) as behind:
        before_front = http.get_inference_statistics("via-rest")["model_stats"][0]["execution_count"]
        before_behind = behind.get_inference_statistics("simple")["model_stats"][0]["execution_count"]
        for seed in range(3):
            inputs, a, b = _simple_inputs(httpclient, 1, seed)
            result = http.infer("via-rest", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1", class_count=2)])
            assert _decoded(result.as_numpy("OUTPUT1")) == _top(a - b, 2)
        assert http.get_inference_statistics("via-rest")["model_stats"][0]["execution_count"] == before_front + 3
        assert behind.get_inference_statistics("simple")["model_stats"][0]["execution_count"] == before_behind + 3

