"""UM-Bridge client -> gateway -> V2 models over real V2 hops.

``umbridge.HTTPModel`` talks to the gateway (its own process). Behind it:

- a real MLServer (the session's peer, its own virtualenv and process)
  hosting ``trig_fp32``, the builtin ``trig`` formulas in float32, reached
  over a ``v2-rest`` and a ``v2-grpc`` upstream with finite differences
  enabled; the model logs the batch size of every request it receives, so
  each derivative is seen to arrive as ONE batched request;
- the builtin ``forward`` model behind a V2 hop (the gateway's own REST and
  gRPC listeners as upstreams): its native derivatives cannot cross a V2
  hop, so over one it offers Evaluate, plus finite differences when the
  route enables them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import requests
import umbridge
from trig_reference import POINTS, check_httpmodel

from peers.mlserver import MLServerPeer
from support import GatewayProcess, free_port, write_config

UPSTREAMS = ["rest", "grpc"]


def config(peer: MLServerPeer, rest_port: int, grpc_port: int) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:{rest_port}"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:{grpc_port}"}}
upstreams:
  - {{name: mls-rest, protocol: v2-rest, endpoints: ["{peer.rest_address}"]}}
  - {{name: mls-grpc, protocol: v2-grpc, endpoints: ["{peer.grpc_address}"]}}
  - {{name: local, protocol: builtin}}
  - {{name: hop-rest, protocol: v2-rest, endpoints: ["127.0.0.1:{rest_port}"]}}
  - {{name: hop-grpc, protocol: v2-grpc, endpoints: ["127.0.0.1:{grpc_port}"]}}
routes:
  - match: {{model: trig_rest, listener: umb}}
    upstream: mls-rest
    rewrite: {{model: trig_fp32}}
    options: {{umbridge: {{finite_differences: true}}}}
  - match: {{model: trig_grpc, listener: umb}}
    upstream: mls-grpc
    rewrite: {{model: trig_fp32}}
    options: {{umbridge: {{finite_differences: true}}}}
  - match: {{model: swapped_rest, listener: umb}}
    upstream: mls-rest
    rewrite: {{model: trig_fp32}}
    options: {{umbridge: {{inputs: [y, x], outputs: [g, f], finite_differences: true}}}}
  - match: {{model: swapped_grpc, listener: umb}}
    upstream: mls-grpc
    rewrite: {{model: trig_fp32}}
    options: {{umbridge: {{inputs: [y, x], outputs: [g, f], finite_differences: true}}}}
  - {{match: {{model: forward, listener: umb}}, upstream: local}}
  - {{match: {{model: forward_rest, listener: umb}}, upstream: hop-rest, rewrite: {{model: forward}}}}
  - {{match: {{model: forward_grpc, listener: umb}}, upstream: hop-grpc, rewrite: {{model: forward}}}}
  - match: {{model: forward_rest_fd, listener: umb}}
    upstream: hop-rest
    rewrite: {{model: forward}}
    options: {{umbridge: {{finite_differences: true}}}}
  - match: {{model: forward_grpc_fd, listener: umb}}
    upstream: hop-grpc
    rewrite: {{model: forward}}
    options: {{umbridge: {{finite_differences: true}}}}
  - {{match: {{listener: rest}}, upstream: local}}
  - {{match: {{listener: grpc}}, upstream: local}}
"""


@pytest.fixture(scope="module")
def gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("umbridge-mlserver")
    text = config(mlserver, free_port(), free_port())
    with GatewayProcess(write_config(directory, text), directory / "gateway.log") as gw:
        yield gw


def url(gateway: GatewayProcess) -> str:
    return f"http://{gateway.url('umb')}"


def new_calls(peer: MLServerPeer, model: str) -> Callable[[], list[dict[str, Any]]]:
    """Each call returns what ``model`` logged since the previous call."""
    seen = len(peer.calls(model))

    def since() -> list[dict[str, Any]]:
        nonlocal seen
        calls = peer.calls(model)
        fresh, seen = calls[seen:], len(calls)
        return fresh

    return since


# --- trig on MLServer, over REST and gRPC ------------------------------------------------


@pytest.mark.parametrize("point", range(len(POINTS)))
@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_trig_on_mlserver(gateway: GatewayProcess, mlserver: MLServerPeer, upstream: str, point: int) -> None:
    calls = new_calls(mlserver, "trig_fp32")
    model = umbridge.HTTPModel(url(gateway), f"trig_{upstream}")
    check_httpmodel(model, *POINTS[point], upstream_rows=lambda: [c["rows"] for c in calls()])


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_swapped_route_on_mlserver(gateway: GatewayProcess, mlserver: MLServerPeer, upstream: str) -> None:
    """inputs [y, x], outputs [g, f]: the UM-Bridge order is the route's."""
    calls = new_calls(mlserver, "trig_fp32")
    model = umbridge.HTTPModel(url(gateway), f"swapped_{upstream}")
    check_httpmodel(model, *POINTS[1], inputs=(1, 0), outputs=(1, 0),
                    upstream_rows=lambda: [c["rows"] for c in calls()])


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_what_mlserver_receives(gateway: GatewayProcess, mlserver: MLServerPeer, upstream: str) -> None:
    """float64 vectors arrive as FP32 rows of the model's own tensors, in the
    request order the route gives; a Gradient by x is 2·2 rows in one request."""
    calls = new_calls(mlserver, "trig_fp32")
    model = umbridge.HTTPModel(url(gateway), f"swapped_{upstream}")
    model([[2.0], [0.3, -1.2]])
    model.gradient(1, 1, [[2.0], [0.3, -1.2]], [1.0, 0.0])
    evaluate, gradient = calls()
    assert evaluate["inputs"] == [["y", "FP32", [1, 1]], ["x", "FP32", [1, 2]]]
    assert gradient["inputs"] == [["y", "FP32", [4, 1]], ["x", "FP32", [4, 2]]]
    assert gradient["rows"] == 4


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_overflow_in_the_model(gateway: GatewayProcess, upstream: str) -> None:
    """FP32 overflow: infinities reach the client per the listener's policy
    (null). MLServer's REST side itself writes them as null."""
    reply = requests.post(f"{url(gateway)}/Evaluate", timeout=30,
                          json={"name": f"trig_{upstream}", "input": [[1e30, 1e30], [1e30]]})
    assert reply.status_code == 200, reply.text
    (f0, f1), (g0,) = reply.json()["output"]
    assert isinstance(f0, float) and (f1, g0) == (None, None)


def test_nan_through_mlserver_rest(gateway: GatewayProcess) -> None:
    """A NaN input travels to MLServer as null and its NaN outputs come back as
    null (over gRPC, MLServer 1.7.1 cannot answer NaN outputs at all)."""
    reply = requests.post(f"{url(gateway)}/Evaluate", timeout=30,
                          data=b'{"name": "trig_rest", "input": [[NaN, 1.0], [2.0]]}')
    assert reply.status_code == 200, reply.text
    (f0, f1), (g0,) = reply.json()["output"]
    assert (f0, f1) == (None, None)
    assert g0 == pytest.approx(np.exp(0.5) + 4, rel=1e-6)


def test_info_lists_the_mlserver_routes(gateway: GatewayProcess) -> None:
    models = umbridge.supported_models(url(gateway))
    for name in ("trig_rest", "trig_grpc", "swapped_rest", "swapped_grpc"):
        assert name in models


# --- a native-derivative model behind a V2 hop --------------------------------------------------


FORWARD_POINT = [[0.7, -0.4], [1.5]]


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_native_derivatives_do_not_cross_a_v2_hop(gateway: GatewayProcess, upstream: str) -> None:
    """``forward`` declares native derivatives, which only its own upstream
    (builtin, UM-Bridge) can compute; a V2 hop can only evaluate. ModelInfo
    must not promise what a call would then refuse."""
    native = umbridge.HTTPModel(url(gateway), "forward")
    hopped = umbridge.HTTPModel(url(gateway), f"forward_{upstream}")
    assert native.supports_gradient()
    assert hopped.supports_evaluate()
    assert not (hopped.supports_gradient() or hopped.supports_apply_jacobian() or hopped.supports_apply_hessian())
    # Evaluate with config crosses the hop (config travels as a V2 parameter).
    assert hopped(FORWARD_POINT, {"scale": 3}) == native(FORWARD_POINT, {"scale": 3})
    reply = requests.post(f"{url(gateway)}/Gradient", timeout=30, json={
        "name": f"forward_{upstream}", "outWrt": 0, "inWrt": 0, "input": FORWARD_POINT, "sens": [1.0, 1.0, 1.0]})
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "UnsupportedFeature", reply.text


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_finite_differences_behind_a_v2_hop(gateway: GatewayProcess, upstream: str) -> None:
    """With finite differences on the route, the hopped model's derivatives
    match the native ones (FP64 model: about 6 digits)."""
    native = umbridge.HTTPModel(url(gateway), "forward")
    hopped = umbridge.HTTPModel(url(gateway), f"forward_{upstream}_fd")
    assert hopped.supports_gradient() and hopped.supports_apply_hessian()
    config = {"scale": 2}
    sens, vec = [1.0, -2.0, 0.5], [0.3, 0.9]
    pairs = [(native.gradient(0, i, FORWARD_POINT, sens, config), hopped.gradient(0, i, FORWARD_POINT, sens, config))
             for i in (0, 1)]
    pairs.append((native.apply_jacobian(0, 0, FORWARD_POINT, vec, config),
                  hopped.apply_jacobian(0, 0, FORWARD_POINT, vec, config)))
    pairs.append((native.apply_hessian(0, 0, 0, FORWARD_POINT, sens, vec, config),
                  hopped.apply_hessian(0, 0, 0, FORWARD_POINT, sens, vec, config)))
    pairs.append((native.apply_hessian(0, 1, 0, FORWARD_POINT, sens, vec, config),
                  hopped.apply_hessian(0, 1, 0, FORWARD_POINT, sens, vec, config)))
    for expected, got in pairs:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_gateway_log_is_clean(gateway: GatewayProcess) -> None:
    assert "Traceback" not in gateway.log()
