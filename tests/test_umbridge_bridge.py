"""The UM-Bridge <-> V2 bridge on the canonical interface, in process: model
views from V2 metadata, datatype casting, batching, and finite-difference
derivatives checked against analytic ones (builtin models, real DataPlane)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from trig_reference import POINTS, TRIG_SLICES, hessian_action, trig_jacobians, trig_second

from gateway.app.configure import parse_config
from gateway.config.node import ConfigError
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import (
    DERIVATIVE_OPERATION,
    Derivative,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestContext,
    Tensor,
    TensorSpec,
)
from gateway.dataplane.plane import DataPlane
from gateway.protocols import registry
from gateway.protocols.umbridge.bridge import Bridge
from gateway.protocols.umbridge.mapping import Slot, build_view, to_datatype
from gateway.protocols.umbridge.options import FiniteDifferences, RouteOptions
from gateway.runtime.services import GatewayServices

CONFIG = """
listeners: [{name: umb, protocol: umbridge, address: "127.0.0.1:0"}]
upstreams: [{name: local, protocol: builtin}]
routes: [{match: {model: "*"}, upstream: local}]
"""


@pytest.fixture
async def dataplane() -> Any:
    config = parse_config(__import__("yaml").safe_load(CONFIG))
    plane = DataPlane(config, GatewayServices(config, config.server), backends=registry.backend)
    await plane.start()
    yield plane
    await plane.close()


@pytest.fixture
def calls(dataplane: DataPlane) -> Iterator[list[InferRequest]]:
    """Every infer request the builtin upstream receives."""
    client = dataplane.clusters["local"].clients[0]
    seen: list[InferRequest] = []
    original = client.infer

    async def counting(request: InferRequest, ctx: RequestContext) -> InferResponse:
        seen.append(request)
        return await original(request, ctx)

    client.infer = counting  # type: ignore[method-assign]
    yield seen


def ctx() -> RequestContext:
    return RequestContext("umb", "umbridge", "rid")


async def _trig_bridge(dataplane: DataPlane, fd: FiniteDifferences, options: RouteOptions | None = None) -> Bridge:
    metadata = await dataplane.model_metadata("trig", "", ctx())
    view = build_view("trig", metadata, dataclasses.replace(options or RouteOptions(), finite_differences=fd))
    return Bridge(dataplane, ctx(), view, "")


# --- views ---------------------------------------------------------------------------


async def test_views_of_builtin_models(dataplane: DataPlane) -> None:
    trig = build_view("trig", await dataplane.model_metadata("trig", "", ctx()), None)
    assert (trig.input_sizes, trig.output_sizes, trig.batched) == ((2, 1), (2, 1), True)
    assert trig.support == {"Evaluate"}  # no derivatives unless the route enables them
    with pytest.raises(GatewayError, match="finite_differences") as info:
        trig.require("Gradient")
    assert info.value.kind == ErrorKind.UNSUPPORTED

    forward = build_view("forward", await dataplane.model_metadata("forward", "", ctx()), None)
    assert (forward.input_sizes, forward.output_sizes, forward.batched) == ((2, 1), (3,), False)
    assert forward.support == forward.native | {"Evaluate"} == {"Evaluate", "Gradient", "ApplyJacobian",
                                                                 "ApplyHessian"}
    simple = build_view("simple", await dataplane.model_metadata("simple", "", ctx()), None)
    assert (simple.input_sizes, simple.output_sizes) == ((16, 16), (16, 16))
    # Finite differences are never offered for integer inputs.
    simple_fd = build_view("simple", await dataplane.model_metadata("simple", "", ctx()),
                           RouteOptions(finite_differences=FiniteDifferences()))
    assert simple_fd.support == {"Evaluate"}


async def test_declared_derivatives_need_an_upstream_that_computes_them(dataplane: DataPlane) -> None:
    """``forward``'s metadata declares native derivatives; behind an upstream
    that cannot be asked for them (a V2 hop) they are not offered, and
    finite differences stand in when the route enables them."""
    metadata = await dataplane.model_metadata("forward", "", ctx())
    hopped = build_view("forward", metadata, None, native_derivatives=False)
    assert (hopped.support, hopped.native) == ({"Evaluate"}, frozenset())
    with pytest.raises(GatewayError, match="finite_differences"):
        hopped.require("Gradient")
    fd = build_view("forward", metadata, RouteOptions(finite_differences=FiniteDifferences()), native_derivatives=False)
    assert fd.native == frozenset() and fd.support == {"Evaluate", "Gradient", "ApplyJacobian", "ApplyHessian"}
    route = dataplane.resolve("forward", "", ctx())
    assert dataplane.offers(route, DERIVATIVE_OPERATION)  # the builtin upstream computes them itself


@pytest.mark.parametrize(("model", "needle"), [("simple_string", "is BYTES"), ("identity", "is BYTES")])
async def test_models_without_a_umbridge_view(dataplane: DataPlane, model: str, needle: str) -> None:
    with pytest.raises(GatewayError, match=needle) as info:
        build_view(model, await dataplane.model_metadata(model, "", ctx()), None)
    assert info.value.kind == ErrorKind.UNSUPPORTED


def test_view_problems() -> None:
    variable = ModelMetadata("m", inputs=(TensorSpec("a", "FP32", (-1, -1)),),
                             outputs=(TensorSpec("b", "FP32", (-1, 2)),))
    with pytest.raises(GatewayError, match="variable dimension"):
        build_view("m", variable, None)
    fixed = ModelMetadata("m", inputs=(TensorSpec("a", "FP32", (2, 3)),), outputs=(TensorSpec("b", "INT8", ()),))
    view = build_view("m", fixed, None)
    assert (view.input_sizes, view.output_sizes, view.batched) == ((6,), (1,), False)
    with pytest.raises(GatewayError, match="names c, which model 'm' does not have; its inputs: a"):
        build_view("m", fixed, RouteOptions(inputs=("a", "c")))
    with pytest.raises(GatewayError, match="declares no outputs"):
        build_view("m", ModelMetadata("m", inputs=fixed.inputs), None)


def test_casting_to_model_datatypes() -> None:
    def cast(datatype: str, *values: float) -> np.ndarray:
        return to_datatype(np.array(values), Slot("t", datatype, (len(values),), len(values)), 0)

    assert cast("INT32", 1.0, -2.0).dtype == np.int32
    assert cast("UINT8", 255.0).tolist() == [255]
    assert cast("BOOL", 0.0, 1.0).tolist() == [False, True]
    assert cast("FP16", 0.5).dtype == np.float16
    assert cast("BF16", 1.0).tolist() == [0x3F80]
    for datatype, values, needle in [("INT32", (1.5,), "takes integers"), ("INT8", (300.0,), "out of range"),
                                     ("UINT8", (-1.0,), "out of range"), ("INT64", (float("nan"),), "NaN"),
                                     ("BOOL", (2.0,), "0 or 1"), ("FP32", (1e39,), "too large for FP32")]:
        with pytest.raises(GatewayError, match=needle) as info:
            cast(datatype, *values)
        assert info.value.kind == ErrorKind.INVALID_INPUT
    assert np.isinf(cast("FP32", float("inf"))[0])  # infinity stays infinity


def test_rows_of_checks_the_answer() -> None:
    metadata = ModelMetadata("m", inputs=(TensorSpec("a", "FP32", (-1, 2)),),
                             outputs=(TensorSpec("b", "FP32", (-1, 3)),))
    view = build_view("m", metadata, None)
    good = InferResponse("m", outputs=[Tensor.from_numpy("b", np.arange(6, dtype=np.float32).reshape(2, 3))])
    rows = view.rows_of(good, 2)
    assert [r[0].tolist() for r in rows] == [[0, 1, 2], [3, 4, 5]] and rows[0][0].dtype == np.float64
    with pytest.raises(GatewayError, match="6 elements; 3 row") as info:
        view.rows_of(good, 3)
    assert info.value.kind == ErrorKind.UPSTREAM_BAD_RESPONSE
    with pytest.raises(GatewayError, match="returned no 'b'"):
        view.rows_of(InferResponse("m"), 1)


# --- evaluation --------------------------------------------------------------------------


async def test_evaluate_batched_fp32_model(dataplane: DataPlane, calls: list[InferRequest]) -> None:
    bridge = await _trig_bridge(dataplane, FiniteDifferences())
    x, y = np.array([0.3, -1.2]), np.array([2.0])
    (f, g), = await bridge.evaluate([[x, y]])
    np.testing.assert_allclose(f, [np.sin(0.3) * 2, 0.3 * 1.44], rtol=1e-6)
    np.testing.assert_allclose(g, [np.exp(-0.6) + 4], rtol=1e-6)
    (request,) = calls
    assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [("x", "FP32", (1, 2)), ("y", "FP32", (1, 1))]
    assert [o.name for o in request.outputs] == ["f", "g"]


async def test_route_order_and_names(dataplane: DataPlane) -> None:
    options = RouteOptions(inputs=("y", "x"), outputs=("g",))
    bridge = await _trig_bridge(dataplane, FiniteDifferences(), options)
    assert (bridge.view.input_sizes, bridge.view.output_sizes) == ((1, 2), (1,))
    (g,), = await bridge.evaluate([[np.array([2.0]), np.array([0.3, -1.2])]])
    np.testing.assert_allclose(g, [np.exp(-0.6) + 4], rtol=1e-6)
    d = Derivative("Gradient", 0, 1, sens=np.array([1.0]))  # ∂g/∂x through the swapped order
    grad = await bridge.derivative([np.array([2.0]), np.array([0.3, -1.2])], d)
    np.testing.assert_allclose(grad, [0.0, 0.5 * np.exp(-0.6)], atol=2e-3)


# --- finite differences against analytic derivatives ---------------------------------------


@pytest.mark.parametrize(("x", "y"), POINTS)
async def test_fd_gradient_and_jacobian_one_batched_request(dataplane: DataPlane, calls: list[InferRequest],
                                                            x: np.ndarray, y: np.ndarray) -> None:
    bridge = await _trig_bridge(dataplane, FiniteDifferences())
    rng = np.random.default_rng(7)
    jacobians = trig_jacobians(x, y)
    for (out_wrt, in_wrt), jacobian in jacobians.items():
        sens = rng.normal(size=jacobian.shape[0])
        vec = rng.normal(size=jacobian.shape[1])
        calls.clear()
        grad = await bridge.derivative([x, y], Derivative("Gradient", out_wrt, in_wrt, sens=sens))
        np.testing.assert_allclose(grad, jacobian.T @ sens, rtol=2e-3, atol=2e-3)
        # All 2n perturbations in ONE batched request.
        assert len(calls) == 1 and calls[0].inputs[0].shape == (2 * jacobian.shape[1], 2)
        calls.clear()
        jv = await bridge.derivative([x, y], Derivative("ApplyJacobian", out_wrt, in_wrt, vec=vec))
        np.testing.assert_allclose(jv, jacobian @ vec, rtol=2e-3, atol=2e-3)
        assert len(calls) == 1 and calls[0].inputs[0].shape == (2, 2)


@pytest.mark.parametrize(("x", "y"), POINTS)
async def test_fd_hessian(dataplane: DataPlane, calls: list[InferRequest], x: np.ndarray, y: np.ndarray) -> None:
    bridge = await _trig_bridge(dataplane, FiniteDifferences())
    second = trig_second(x, y)
    rng = np.random.default_rng(11)
    for out_wrt, in1, in2 in itertools.product((0, 1), (0, 1), (0, 1)):
        sens = rng.normal(size=len(second[out_wrt]))
        vec = rng.normal(size=(2, 1)[in2])
        calls.clear()
        result = await bridge.derivative([x, y], Derivative("ApplyHessian", out_wrt, in1, in2, sens, vec))
        expected = hessian_action(second[out_wrt], sens, in1, in2, vec, TRIG_SLICES)
        np.testing.assert_allclose(result, expected, rtol=3e-2, atol=3e-2)
        assert len(calls) == 1 and calls[0].inputs[0].shape[0] == 4 * (2, 1)[in1]


async def test_fd_max_batch_splits_requests(dataplane: DataPlane, calls: list[InferRequest]) -> None:
    bridge = await _trig_bridge(dataplane, FiniteDifferences(max_batch=3))
    x, y = POINTS[0]
    grad = await bridge.derivative([x, y], Derivative("Gradient", 0, 0, sens=np.array([1.0, 0.0])))
    np.testing.assert_allclose(grad, trig_jacobians(x, y)[(0, 0)][0], rtol=2e-3, atol=2e-3)
    assert sorted(c.inputs[0].shape[0] for c in calls) == [1, 3]


async def test_fd_configured_step_is_used(dataplane: DataPlane) -> None:
    x, y = POINTS[0]
    exact = trig_jacobians(x, y)[(0, 0)].T @ np.array([1.0, 1.0])
    d = Derivative("Gradient", 0, 0, sens=np.array([1.0, 1.0]))
    coarse = await (await _trig_bridge(dataplane, FiniteDifferences(step=0.3))).derivative([x, y], d)
    fine = await (await _trig_bridge(dataplane, FiniteDifferences())).derivative([x, y], d)
    assert np.abs(coarse - exact).max() > 10 * np.abs(fine - exact).max()


async def test_fd_step_too_small_for_fp32_is_a_clear_error(dataplane: DataPlane) -> None:
    bridge = await _trig_bridge(dataplane, FiniteDifferences(step=1e-9))
    with pytest.raises(GatewayError, match="step 1e-09 vanishes") as info:
        await bridge.derivative(list(POINTS[0]), Derivative("Gradient", 0, 0, sens=np.ones(2)))
    assert info.value.kind == ErrorKind.INVALID_INPUT


async def test_fd_unbatched_model_one_request_per_row(dataplane: DataPlane, calls: list[InferRequest]) -> None:
    """``forward`` without its native derivatives: a V2 model lacking a batch dimension."""
    metadata = await dataplane.model_metadata("forward", "", ctx())
    view = build_view("forward", dataclasses.replace(metadata, parameters={}),
                      RouteOptions(finite_differences=FiniteDifferences()))
    assert not view.batched and not view.native and "Gradient" in view.support
    native_view = build_view("forward", metadata, None)
    fd, native = Bridge(dataplane, ctx(), view, '{"scale":2}'), Bridge(dataplane, ctx(), native_view, '{"scale":2}')
    inputs = [np.array([0.7, -0.4]), np.array([1.5])]
    sens, vec2, vec1 = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.9]), np.array([-1.0])
    for d in [Derivative("Gradient", 0, 0, sens=sens), Derivative("Gradient", 0, 1, sens=sens),
              Derivative("ApplyJacobian", 0, 0, vec=vec2), Derivative("ApplyJacobian", 0, 1, vec=vec1),
              Derivative("ApplyHessian", 0, 0, 1, sens, vec1), Derivative("ApplyHessian", 0, 0, 0, sens, vec2)]:
        calls.clear()
        expected = await native.derivative(inputs, d)
        assert not calls  # native derivatives are no evaluations
        np.testing.assert_allclose(await fd.derivative(inputs, d), expected, rtol=1e-5, atol=1e-6)
        assert calls and all(c.inputs[0].shape == (2,) for c in calls)


async def test_native_forward_derivatives(dataplane: DataPlane) -> None:
    """The builtin ``forward`` model against its formulas, with config scale."""
    view = build_view("forward", await dataplane.model_metadata("forward", "", ctx()), None)
    bridge = Bridge(dataplane, ctx(), view, '{"scale":3}')
    x, y = np.array([2.0, 5.0]), np.array([-1.0])
    (out,), = await bridge.evaluate([[x, y]])
    assert out.tolist() == [3 * 7.0, 3 * -2.0, 3 * 25.0]
    sens = np.array([1.0, 2.0, 3.0])
    assert (await bridge.derivative([x, y], Derivative("Gradient", 0, 0, sens=sens))).tolist() == [
        3 * (1 + 2 * -1.0), 3 * (1 + 3 * 10.0)]
    assert (await bridge.derivative([x, y], Derivative("Gradient", 0, 1, sens=sens))).tolist() == [3 * 2 * 2.0]
    assert (await bridge.derivative([x, y], Derivative("ApplyJacobian", 0, 1, vec=np.array([2.0])))).tolist() == [
        0.0, 3 * 2 * 2.0, 0.0]
    assert (await bridge.derivative([x, y], Derivative("ApplyHessian", 0, 0, 0, sens, np.array([1.0, 1.0])))
            ).tolist() == [0.0, 3 * 2 * 3.0]
    assert (await bridge.derivative([x, y], Derivative("ApplyHessian", 0, 1, 0, sens, np.array([1.0, 0.0])))
            ).tolist() == [3 * 2.0]


async def test_zero_direction_and_zero_size(dataplane: DataPlane) -> None:
    bridge = await _trig_bridge(dataplane, FiniteDifferences())
    x, y = POINTS[0]
    jv = await bridge.derivative([x, y], Derivative("ApplyJacobian", 0, 0, vec=np.zeros(2)))
    assert jv.tolist() == [0.0, 0.0]
    hv = await bridge.derivative([x, y], Derivative("ApplyHessian", 0, 0, 1, np.ones(2), np.zeros(1)))
    assert hv.tolist() == [0.0, 0.0]


# --- route options in the YAML ----------------------------------------------------------------


def _route_options(options: str) -> Any:
    text = CONFIG.replace('routes: [{match: {model: "*"}, upstream: local}]',
                          f'routes: [{{match: {{model: "*"}}, upstream: local, options: {options}}}]')
    return parse_config(__import__("yaml").safe_load(text)).routes[0].options


def test_route_options_parse() -> None:
    options = _route_options("{umbridge: {inputs: [y, x], outputs: [g], finite_differences: "
                             "{step: 1e-4, hessian_step: 1e-3, max_batch: 64}}, other: {kept: 1}}")
    assert options["umbridge"] == RouteOptions(("y", "x"), ("g",), FiniteDifferences(1e-4, 1e-3, 64))
    assert options["other"] == {"kept": 1}  # sections of other protocols stay as written
    assert _route_options("{umbridge: {finite_differences: true}}")["umbridge"].finite_differences == \
        FiniteDifferences()
    assert _route_options("{umbridge: {finite_differences: {enabled: false}}}")["umbridge"].finite_differences \
        is None


@pytest.mark.parametrize(("options", "problem"), [
    ("{umbridge: {finite_differences: {step: 2}}}", "routes[0].options.umbridge.finite_differences.step: must be"),
    ("{umbridge: {finite_differences: {stepp: 0.1}}}", "finite_differences.stepp: unknown key"),
    ("{umbridge: {finite_differences: yes_please}}", "finite_differences: must be true, false or a mapping"),
    ("{umbridge: {finite_differences: {max_batch: -1}}}", "max_batch: must be at least 0"),
    ("{umbridge: {inputs: [a, a]}}", "umbridge.inputs: must be a non-empty list of distinct"),
    ("{umbridge: {outputs: x}}", "umbridge.outputs: must be a list"),
    ("{umbridge: {input: [a]}}", "umbridge.input: unknown key"),
    ("{umbridge: 3}", "routes[0].options.umbridge: must be a mapping"),
])
def test_route_option_problems_name_the_yaml_path(options: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        _route_options(options)
    assert any(problem in p for p in info.value.problems), info.value.problems
