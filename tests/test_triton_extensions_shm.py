"""Triton's system shared-memory extension through the gateway, with
unmodified tritonclient (HTTP and gRPC) and Triton's own example clients:
inputs read from a region and outputs written to one, for the builtin
models and for a real MLServer behind the gateway (REST and gRPC); the
registry seen by every worker; bad keys, windows and regions answered in
each protocol's error form; CUDA shared memory's answers."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from peers.mlserver import MLServerPeer
from peers.shm_attack import held
from support import REPO, GatewayProcess, write_config

EXAMPLES = REPO / "tests" / "data" / "triton_examples"

CONFIG = """
admin: {{address: "127.0.0.1:0"}}
server:
  extensions: [classification, model_configuration, model_repository, statistics, system_shared_memory]
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
{upstreams}
routes:
{routes}
  - match: {{model: "*"}}
    upstream: local
"""

MLSERVER_UPSTREAMS = """
  - {{name: ml-rest, protocol: v2-rest, endpoints: ["{rest}"], timeout: 30s}}
  - {{name: ml-grpc, protocol: v2-grpc, endpoints: ["{grpc}"], timeout: 30s}}
"""
MLSERVER_ROUTES = """
  - match: {model: ml-rest}
    upstream: ml-rest
    rewrite: {model: simple}
  - match: {model: ml-grpc}
    upstream: ml-grpc
    rewrite: {model: simple}
"""


def _config(upstreams: str = "", routes: str = "") -> str:
    return CONFIG.format(upstreams=upstreams, routes=routes)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("shm")
    with GatewayProcess(write_config(directory, _config()), directory / "gw.log") as gw:
        yield gw


def _key() -> str:
    return f"/gw-test-{uuid.uuid4().hex[:12]}"


class Regions:
    """Shared-memory objects a test creates, destroyed after it."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def create(self, size: int, name: str | None = None) -> tuple[str, str, Any]:
        name = name or f"r-{uuid.uuid4().hex[:8]}"
        key = _key()
        handle = shm.create_shared_memory_region(name, key, size)
        self.handles.append(handle)
        return name, key, handle

    def close(self) -> None:
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    made.close()


def _client(module: Any, gw: GatewayProcess) -> Any:
    return module.InferenceServerClient(gw.url("rest" if module is httpclient else "grpc"))


def _simple_round_trip(module: Any, client: Any, regions: Regions, model: str, rows: int = 1) -> None:
    """Two INT32 inputs from one region, both outputs into another."""
    a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    b = np.full((rows, 16), 7, dtype=np.int32)
    size = a.nbytes
    in_name, in_key, in_handle = regions.create(2 * size)
    out_name, out_key, out_handle = regions.create(2 * size)
    shm.set_shared_memory_region(in_handle, [a, b])
    client.register_system_shared_memory(in_name, in_key, 2 * size)
    client.register_system_shared_memory(out_name, out_key, 2 * size)
    inputs = [module.InferInput("INPUT0", [rows, 16], "INT32"), module.InferInput("INPUT1", [rows, 16], "INT32")]
    inputs[0].set_shared_memory(in_name, size)
    inputs[1].set_shared_memory(in_name, size, offset=size)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(out_name, size)
    outputs[1].set_shared_memory(out_name, size, offset=size)
    result = client.infer(model, inputs, outputs=outputs)
    _assert_answered_in_regions(module, result, {"OUTPUT0": [rows, 16], "OUTPUT1": [rows, 16]}, "INT32")
    total = shm.get_contents_as_numpy(out_handle, np.int32, [rows, 16])
    diff = shm.get_contents_as_numpy(out_handle, np.int32, [rows, 16], offset=size)
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(diff, a - b)
    client.unregister_system_shared_memory(in_name)
    client.unregister_system_shared_memory(out_name)


def _assert_answered_in_regions(module: Any, result: Any, shapes: dict[str, list[int]], datatype: str) -> None:
    """Triton's answer for outputs in shared memory: name, datatype and
    shape; no data, no parameters (gRPC: an empty raw contents entry)."""
    if module is httpclient:
        outputs = result.get_response()["outputs"]
        assert outputs == [{"name": n, "datatype": datatype, "shape": shape} for n, shape in shapes.items()]
    else:
        response = result.get_response()
        assert [(o.name, o.datatype, list(o.shape), len(o.parameters)) for o in response.outputs] == [
            (n, datatype, shape, 0) for n, shape in shapes.items()]
        assert list(response.raw_output_contents) == [b""] * len(shapes)


def _status_names(module: Any, client: Any) -> set[str]:
    status = client.get_system_shared_memory_status()
    return {r["name"] for r in status} if module is httpclient else set(status.regions)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_simple_through_regions(gateway: GatewayProcess, regions: Regions, module: Any) -> None:
    client = _client(module, gateway)
    _simple_round_trip(module, client, regions, "simple", rows=3)
    assert not _status_names(module, client)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_status_register_unregister(gateway: GatewayProcess, regions: Regions, module: Any) -> None:
    client = _client(module, gateway)
    client.unregister_system_shared_memory()
    name, key, _ = regions.create(256)
    client.register_system_shared_memory(name, key, 128, offset=64)
    if module is httpclient:
        assert client.get_system_shared_memory_status(name) == [
            {"name": name, "key": key, "offset": 64, "byte_size": 128}]
    else:
        region = client.get_system_shared_memory_status(name).regions[name]
        assert (region.name, region.key, region.offset, region.byte_size) == (name, key, 64, 128)
    with pytest.raises(InferenceServerException, match="already in manager"):
        client.register_system_shared_memory(name, key, 128)
    client.unregister_system_shared_memory(name)
    client.unregister_system_shared_memory(name)  # not registered: no error, as on Triton
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region"):
        client.get_system_shared_memory_status(name)
    assert name not in _status_names(module, client)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bytes_tensors_in_length_prefixed_form(gateway: GatewayProcess, regions: Regions, module: Any) -> None:
    client = _client(module, gateway)
    a = serialize_byte_tensor(np.array([str(i).encode() for i in range(16)], dtype=np.object_))
    b = serialize_byte_tensor(np.array([b"1"] * 16, dtype=np.object_))
    size_a, size_b = serialized_byte_size(a), serialized_byte_size(b)
    in_name, in_key, in_handle = regions.create(size_a + size_b)
    out_name, out_key, out_handle = regions.create(1024)
    shm.set_shared_memory_region(in_handle, [a, b])
    client.register_system_shared_memory(in_name, in_key, size_a + size_b)
    client.register_system_shared_memory(out_name, out_key, 1024)
    inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"), module.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_shared_memory(in_name, size_a)
    inputs[1].set_shared_memory(in_name, size_b, offset=size_a)
    output = module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(out_name, 1024)
    result = client.infer("simple_string", inputs, outputs=[output])
    _assert_answered_in_regions(module, result, {"OUTPUT0": [1, 16]}, "BYTES")
    total = shm.get_contents_as_numpy(out_handle, np.object_, [1, 16])
    assert [int(x) for x in total.reshape(-1)] == [i + 1 for i in range(16)]
    client.unregister_system_shared_memory()


def test_mixed_inputs_and_plain_outputs(gateway: GatewayProcess, regions: Regions) -> None:
    """One input in a region, one in the body (gRPC raw contents), outputs
    in the answer."""
    client = grpcclient.InferenceServerClient(gateway.url("grpc"))
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    name, key, handle = regions.create(a.nbytes)
    shm.set_shared_memory_region(handle, [a])
    client.register_system_shared_memory(name, key, a.nbytes)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_shared_memory(name, a.nbytes)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    client.unregister_system_shared_memory(name)


# --- Triton's example clients, unmodified ---------------------------------------------------


@pytest.mark.parametrize("example, listener", [("simple_http_shm_client.py", "rest"),
                                               ("simple_grpc_shm_client.py", "grpc")])
def test_triton_example_client(gateway: GatewayProcess, example: str, listener: str) -> None:
    result = subprocess.run([sys.executable, str(EXAMPLES / example), "-u", gateway.url(listener)],
                            capture_output=True, text=True, timeout=60, cwd=EXAMPLES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS: system shared memory" in result.stdout


# --- bad input, in each protocol's error form -------------------------------------------------


def test_rest_errors(gateway: GatewayProcess, regions: Regions) -> None:
    base = f"http://{gateway.url('rest')}/v2/systemsharedmemory"
    name, key, _ = regions.create(64)

    def register(region: str, body: Any) -> requests.Response:
        return requests.post(f"{base}/region/{region}/register", json=body, timeout=10)

    cases = {
        "bad key ../": ({"key": "/../../etc/passwd", "byte_size": 8}, "not a POSIX shared memory name"),
        "bad key slash": ({"key": "/a/b", "byte_size": 8}, "not a POSIX shared memory name"),
        "empty key": ({"key": "", "byte_size": 8}, "not a POSIX shared memory name"),
        "unknown key": ({"key": _key(), "byte_size": 8}, "no such object"),
        "key not a string": ({"key": 5, "byte_size": 8}, "'key' must be a string"),
        "no byte size": ({"key": key}, "no 'byte_size'"),
        "negative offset": ({"key": key, "offset": -1, "byte_size": 8}, "non-negative integer"),
        "too big": ({"key": key, "byte_size": 65}, "outside the object"),
        "offset past end": ({"key": key, "offset": 60, "byte_size": 8}, "outside the object"),
    }
    for case, (body, message) in cases.items():
        answer = register(name, body)
        assert answer.status_code == 400, case
        assert message in answer.json()["error"], (case, answer.json())
    # a symlink planted in /dev/shm is not followed
    link = f"gw-test-link-{uuid.uuid4().hex[:8]}"
    os.symlink(f"/dev/shm{key}", f"/dev/shm/{link}")
    try:
        answer = register(name, {"key": f"/{link}", "byte_size": 8})
        assert answer.status_code == 400 and "not a shared memory object" in answer.json()["error"]
    finally:
        os.unlink(f"/dev/shm/{link}")
    assert requests.post(f"{base}/region/{name}/register", data=b"{", timeout=10).status_code == 400
    assert requests.get(f"{base}/region/{name}/status", timeout=10).status_code == 400
    assert requests.get(f"{base}/status", timeout=10).json() == []


def _infer_body(parameters: dict[str, Any], output: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": parameters},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}]}
    if output is not None:
        body["outputs"] = [{"name": "OUTPUT0", "parameters": output}]
    return body


def test_rest_infer_errors(gateway: GatewayProcess, regions: Regions) -> None:
    name, key, _ = regions.create(64)
    client = httpclient.InferenceServerClient(gateway.url("rest"))
    client.register_system_shared_memory(name, key, 64)
    url = f"http://{gateway.url('rest')}/v2/models/simple/infer"
    region = {"shared_memory_region": name, "shared_memory_byte_size": 64}
    cases = {
        "unknown region": ({"shared_memory_region": "nope", "shared_memory_byte_size": 64}, None,
                           "Unable to find system shared memory region: 'nope'"),
        "offset past end": ({**region, "shared_memory_offset": 8}, None, "outside shared memory region"),
        "byte size off shape": ({**region, "shared_memory_byte_size": 32}, None, "needs 64"),
        "no byte size": ({"shared_memory_region": name}, None, "needs 'shared_memory_byte_size'"),
        "output region too small": (region, {"shared_memory_region": name, "shared_memory_byte_size": 16,
                                             "shared_memory_offset": 48},
                                    "should be at least 64 bytes"),
    }
    for case, (parameters, output, message) in cases.items():
        answer = requests.post(url, json=_infer_body(parameters, output), timeout=10)
        assert answer.status_code == 400, (case, answer.text)
        assert message in answer.json()["error"], (case, answer.json())
    both = _infer_body(region)
    both["inputs"][0]["data"] = list(range(16))
    answer = requests.post(url, json=both, timeout=10)
    assert answer.status_code == 400 and "both 'shared_memory_region' and 'data'" in answer.json()["error"]
    client.unregister_system_shared_memory(name)


def test_object_shrunk_after_registering(gateway: GatewayProcess, regions: Regions) -> None:
    """A client that truncates its object gets an error, for an input and
    for an output (never a SIGBUS in the gateway)."""
    client = httpclient.InferenceServerClient(gateway.url("rest"))
    url = f"http://{gateway.url('rest')}/v2/models/simple/infer"
    name, key, _ = regions.create(64)
    client.register_system_shared_memory(name, key, 64)
    body = _infer_body({"shared_memory_region": name, "shared_memory_byte_size": 64})
    assert requests.post(url, json=body, timeout=10).status_code == 200
    os.truncate(f"/dev/shm{key}", 16)
    answer = requests.post(url, json=body, timeout=10)
    assert answer.status_code == 400 and "shrank" in answer.json()["error"]
    output = {"shared_memory_region": name, "shared_memory_byte_size": 64}
    plain = [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))} for n in ("INPUT0", "INPUT1")]
    answer = requests.post(url, json={"inputs": plain, "outputs": [{"name": "OUTPUT0", "parameters": output}]},
                           timeout=10)
    assert answer.status_code == 400 and "shrank" in answer.json()["error"]
    client.unregister_system_shared_memory(name)


def test_big_tensors_through_regions(gateway: GatewayProcess, regions: Regions) -> None:
    """Copies over the offload threshold (64 KiB), both directions."""
    client = grpcclient.InferenceServerClient(gateway.url("grpc"))
    a = np.random.default_rng(1).random(1 << 18, dtype=np.float32)  # 1 MiB
    in_name, in_key, in_handle = regions.create(a.nbytes)
    out_name, out_key, out_handle = regions.create(a.nbytes)
    shm.set_shared_memory_region(in_handle, [a])
    client.register_system_shared_memory(in_name, in_key, a.nbytes)
    client.register_system_shared_memory(out_name, out_key, a.nbytes)
    item = grpcclient.InferInput("INPUT0", [a.size], "FP32")
    item.set_shared_memory(in_name, a.nbytes)
    output = grpcclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(out_name, a.nbytes)
    client.infer("identity", [item], outputs=[output])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [a.size]), a)
    client.unregister_system_shared_memory()


def test_grpc_errors(gateway: GatewayProcess, regions: Regions) -> None:
    client = grpcclient.InferenceServerClient(gateway.url("grpc"))
    name, key, _ = regions.create(64)
    for bad_key, message in (("/../x", "not a POSIX shared memory name"), (_key(), "no such object")):
        with pytest.raises(InferenceServerException, match=message) as raised:
            client.register_system_shared_memory(name, bad_key, 8)
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="outside the object"):
        client.register_system_shared_memory(name, key, 8, offset=64)
    client.register_system_shared_memory(name, key, 64)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("nope", 64)
    inputs[1].set_shared_memory(name, 64, offset=32)
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region") as raised:
        client.infer("simple", inputs)
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    inputs[0].set_shared_memory(name, 64)
    with pytest.raises(InferenceServerException, match="outside shared memory region"):
        client.infer("simple", inputs)
    client.unregister_system_shared_memory(name)


def test_cuda_shared_memory_answers(gateway: GatewayProcess) -> None:
    base = f"http://{gateway.url('rest')}/v2/cudasharedmemory"
    answer = requests.post(f"{base}/region/gpu/register", json={"raw_handle": {"b64": ""}, "device_id": 0,
                                                                 "byte_size": 8}, timeout=10)
    assert answer.status_code == 501 and "cuda_shared_memory" in answer.json()["error"]
    assert requests.get(f"{base}/status", timeout=10).json() == []
    assert requests.post(f"{base}/unregister", timeout=10).status_code == 200
    assert requests.post(f"{base}/region/gpu/unregister", timeout=10).status_code == 200
    assert requests.get(f"{base}/region/gpu/status", timeout=10).status_code == 400
    client = grpcclient.InferenceServerClient(gateway.url("grpc"))
    assert not client.get_cuda_shared_memory_status().regions
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("gpu")
    with pytest.raises(InferenceServerException, match="cuda_shared_memory") as raised:
        client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 8)
    assert raised.value.status() == "StatusCode.UNIMPLEMENTED"


def test_turned_off_by_default(builtin_gateway: GatewayProcess, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(builtin_gateway.url("rest"))
    name, key, _ = regions.create(64)
    with pytest.raises(InferenceServerException, match="system_shared_memory: this extension is turned off"):
        client.register_system_shared_memory(name, key, 64)
    body = _infer_body({"shared_memory_region": name, "shared_memory_byte_size": 64})
    answer = requests.post(f"http://{builtin_gateway.url('rest')}/v2/models/simple/infer", json=body, timeout=10)
    assert answer.status_code == 501 and "turned off" in answer.json()["error"]
    assert "system_shared_memory" not in client.get_server_metadata()["extensions"]


# --- workers: a registration is seen by every worker ----------------------------------------


def test_registration_seen_by_every_worker(tmp_path: Any, regions: Regions) -> None:
    with GatewayProcess(write_config(tmp_path, _config()), tmp_path / "gw.log", extra_args=["--workers", "2"]) as gw:
        with httpclient.InferenceServerClient(gw.url("rest")) as client:
            assert "system_shared_memory" in client.get_server_metadata()["extensions"]
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            name, key, handle = regions.create(a.nbytes)
            shm.set_shared_memory_region(handle, [a])
            client.register_system_shared_memory(name, key, a.nbytes)
        body = _infer_body({"shared_memory_region": name, "shared_memory_byte_size": a.nbytes})
        for _ in range(12):  # a new connection each: the kernel spreads them over both workers
            with requests.Session() as session:
                answer = session.post(f"http://{gw.url('rest')}/v2/models/simple/infer", json=body, timeout=10)
                assert answer.status_code == 200, answer.text
                assert answer.json()["outputs"][0]["data"] == [2 * i for i in range(16)]
        # Regions belong to the listener that registered them: the gRPC one sees none.
        assert not grpcclient.InferenceServerClient(gw.url("grpc")).get_system_shared_memory_status().regions
        for _ in range(4):  # new connections: status and unregister in any worker
            with httpclient.InferenceServerClient(gw.url("rest")) as other:
                assert {r["name"] for r in other.get_system_shared_memory_status()} == {name}
        with httpclient.InferenceServerClient(gw.url("rest")) as other:
            other.unregister_system_shared_memory()
        with httpclient.InferenceServerClient(gw.url("rest")) as other:
            assert other.get_system_shared_memory_status() == []


# --- a real MLServer behind the gateway -----------------------------------------------------


@pytest.fixture(scope="module")
def ml_gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("shm-mlserver")
    upstreams = MLSERVER_UPSTREAMS.format(rest=mlserver.rest_address, grpc=mlserver.grpc_address)
    config = _config(upstreams, MLSERVER_ROUTES)
    with GatewayProcess(write_config(directory, config), directory / "gw.log") as gw:
        yield gw


@pytest.mark.slow
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
@pytest.mark.parametrize("model", ["ml-rest", "ml-grpc"])
def test_mlserver_through_regions(ml_gateway: GatewayProcess, regions: Regions, module: Any, model: str) -> None:
    _simple_round_trip(module, _client(module, ml_gateway), regions, model, rows=2)


# --- a key deleted and created again ---------------------------------------------------------


def _object(key: str, data: bytes) -> None:
    """Create the shared-memory object ``key`` holding ``data``."""
    fd = os.open(f"/dev/shm{key}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_recreated_key_is_refused_until_registered_again(gateway: GatewayProcess) -> None:
    """The client deletes its object and creates another under the same key:
    the gateway refuses to read it (and holds nothing of the old one) until
    the region is registered again."""
    assert gateway.proc is not None
    client = httpclient.InferenceServerClient(gateway.url("rest"))
    url = f"http://{gateway.url('rest')}/v2/models/simple/infer"
    name, key = f"r-{uuid.uuid4().hex[:8]}", _key()
    old, new = np.arange(16, dtype=np.int32), np.full(16, 100, dtype=np.int32)
    _object(key, old.tobytes())
    try:
        client.register_system_shared_memory(name, key, old.nbytes)
        body = _infer_body({"shared_memory_region": name, "shared_memory_byte_size": old.nbytes})
        answer = requests.post(url, json=body, timeout=10)
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [2 * i for i in range(16)]
        os.unlink(f"/dev/shm{key}")
        _object(key, new.tobytes())
        answer = requests.post(url, json=body, timeout=10)
        assert answer.status_code == 400, answer.text
        assert "replaced since it was registered; register the region again" in answer.json()["error"]
        assert held(gateway.proc.pid, key) == []  # the deleted object is not kept alive
        client.unregister_system_shared_memory(name)
        client.register_system_shared_memory(name, key, new.nbytes)
        answer = requests.post(url, json=body, timeout=10)
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [100 + i for i in range(16)]
        client.unregister_system_shared_memory(name)
    finally:
        os.unlink(f"/dev/shm{key}")


# --- tenants: a region belongs to the listener and credential that registered it --------------


TENANT_CONFIG = """
admin: {address: "127.0.0.1:0"}
server:
  extensions: [system_shared_memory]
  max_shared_memory_regions: 3
listeners:
  - {name: a, protocol: v2-rest, address: "127.0.0.1:0", auth: {token: {env: GW_TEST_TOKEN_A}}}
  - {name: b, protocol: v2-rest, address: "127.0.0.1:0", auth: {token: {env: GW_TEST_TOKEN_B}}}
  - {name: b-grpc, protocol: v2-grpc, address: "127.0.0.1:0", auth: {token: {env: GW_TEST_TOKEN_B}}}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - match: {model: "*"}
    upstream: local
"""


class WithToken:
    """A client whose every call sends ``token``."""

    def __init__(self, client: Any, token: str) -> None:
        self.client, self.headers = client, {"authorization": f"Bearer {token}"}

    def __getattr__(self, name: str) -> Any:
        return functools.partial(getattr(self.client, name), headers=self.headers)


def test_tenants_see_only_their_own_regions(tmp_path: Any, regions: Regions) -> None:
    tokens = {"a": f"token-a-{uuid.uuid4().hex}", "b": f"token-b-{uuid.uuid4().hex}"}
    env = {"GW_TEST_TOKEN_A": tokens["a"], "GW_TEST_TOKEN_B": tokens["b"]}
    with GatewayProcess(write_config(tmp_path, TENANT_CONFIG), tmp_path / "gw.log", env) as gw:
        http = {t: WithToken(httpclient.InferenceServerClient(gw.url(t)), tokens[t]) for t in tokens}
        data = {"a": np.arange(16, dtype=np.int32), "b": np.full(16, 1000, dtype=np.int32)}
        keys = {}
        for tenant, array in data.items():
            _, keys[tenant], handle = regions.create(array.nbytes)
            shm.set_shared_memory_region(handle, [array])
        name = "shared-name"
        http["a"].register_system_shared_memory(name, keys["a"], 64)

        def infer(tenant: str) -> requests.Response:
            body = _infer_body({"shared_memory_region": name, "shared_memory_byte_size": 64})
            return requests.post(f"http://{gw.url(tenant)}/v2/models/simple/infer", json=body, timeout=10,
                                 headers={"Authorization": f"Bearer {tokens[tenant]}"})

        # B sees nothing of A's region: not listed, not found, not used, not removed
        assert http["b"].get_system_shared_memory_status() == []
        with pytest.raises(InferenceServerException, match=f"Unable to find system shared memory region: '{name}'"):
            http["b"].get_system_shared_memory_status(name)
        answer = infer("b")
        assert answer.status_code == 400 and "Unable to find system shared memory region" in answer.json()["error"]
        http["b"].unregister_system_shared_memory(name)
        http["b"].unregister_system_shared_memory()
        assert [r["name"] for r in http["a"].get_system_shared_memory_status()] == [name]
        # the same token on B's gRPC listener is another owner too
        grpc_b = WithToken(grpcclient.InferenceServerClient(gw.url("b-grpc")), tokens["b"])
        assert not grpc_b.get_system_shared_memory_status().regions
        # B may use the same name for its own object; each reads its own
        http["b"].register_system_shared_memory(name, keys["b"], 64)
        assert infer("a").json()["outputs"][0]["data"] == [2 * i for i in range(16)]
        assert infer("b").json()["outputs"][0]["data"] == [1000 + i for i in range(16)]
        # the limit is per owner: B fills its own, A is not affected
        for i in range(2):
            http["b"].register_system_shared_memory(f"more-{i}", keys["b"], 64)
        with pytest.raises(InferenceServerException, match=r"server\.max_shared_memory_regions") as raised:
            http["b"].register_system_shared_memory("one-too-many", keys["b"], 64)
        assert raised.value.status() == "429"
        for i in range(3):
            grpc_b.register_system_shared_memory(f"grpc-{i}", keys["b"], 64)
        with pytest.raises(InferenceServerException, match=r"server\.max_shared_memory_regions") as raised:
            grpc_b.register_system_shared_memory("one-too-many", keys["b"], 64)
        assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        http["a"].register_system_shared_memory("second", keys["a"], 64)
        assert {r["name"] for r in http["a"].get_system_shared_memory_status()} == {name, "second"}


def test_limit_holds_across_workers(tmp_path: Any, regions: Regions) -> None:
    config = _config().replace("  extensions:", "  max_shared_memory_regions: 3\n  extensions:")
    with GatewayProcess(write_config(tmp_path, config), tmp_path / "gw.log", extra_args=["--workers", "2"]) as gw:
        _, key, _ = regions.create(64)
        statuses = []
        for i in range(8):  # a new connection each: the kernel spreads them over both workers
            with requests.Session() as session:
                answer = session.post(f"http://{gw.url('rest')}/v2/systemsharedmemory/region/r{i}/register",
                                      json={"key": key, "byte_size": 64}, timeout=10)
                statuses.append(answer.status_code)
        assert statuses == [200] * 3 + [429] * 5
        with httpclient.InferenceServerClient(gw.url("rest")) as client:
            assert {r["name"] for r in client.get_system_shared_memory_status()} == {"r0", "r1", "r2"}
