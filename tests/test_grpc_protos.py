"""The gateway's V2 gRPC messages: reproducible, wire-compatible, and
importable next to tritonclient.grpc in one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor

from support import REPO

GENERATED = REPO / "gateway" / "protocols" / "v2_grpc" / "generated" / "inference_descriptor.py"


def test_regenerating_gives_identical_output(tmp_path: Path) -> None:
    out = tmp_path / "inference_descriptor.py"
    subprocess.run([sys.executable, str(REPO / "protos" / "generate.py"), "--output", str(out)],
                   check=True, timeout=60, capture_output=True)
    assert out.read_text() == GENERATED.read_text(), "generated code is stale: run `make protos` and commit"


def test_importable_next_to_tritonclient_grpc() -> None:
    """Both orders, in fresh interpreters: tritonclient registers inference.*
    in the default pool; ours lives in a private one, so neither import fails."""
    ours = "from gateway.protocols.v2_grpc import messages, frontend, backend"
    theirs = "import tritonclient.grpc, tritonclient.grpc.service_pb2"
    for code in (f"{theirs}\n{ours}", f"{ours}\n{theirs}"):
        result = subprocess.run([sys.executable, "-c", code + "\nprint('ok')"], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert result.stdout.strip() == "ok", result.stderr


def _fields(descriptor: Descriptor) -> dict[str, tuple[int, int, bool, str | None]]:
    return {f.name: (f.number, f.type, f.is_repeated,
                     f.message_type.full_name if f.message_type else None) for f in descriptor.fields}


def _compare(ours: Descriptor, theirs: Descriptor) -> None:
    assert _fields(ours) == _fields(theirs), ours.full_name
    for nested in ours.nested_types:
        _compare(nested, theirs.nested_types_by_name[nested.name])


MESSAGES = ["ServerLiveRequest", "ServerLiveResponse", "ServerReadyRequest", "ServerReadyResponse",
            "ModelReadyRequest", "ModelReadyResponse", "ServerMetadataRequest", "ServerMetadataResponse",
            "ModelMetadataRequest", "ModelMetadataResponse", "ModelInferRequest", "ModelInferResponse",
            "InferParameter", "InferTensorContents"]


@pytest.mark.parametrize("name", MESSAGES)
def test_same_wire_contract_as_tritonclient(name: str) -> None:
    """Field names, numbers, types and nesting equal Triton's published ones."""
    from tritonclient.grpc import service_pb2

    from gateway.protocols.v2_grpc import messages

    ours = messages.POOL.FindMessageTypeByName(f"inference.{name}")
    _compare(ours, service_pb2.DESCRIPTOR.message_types_by_name[name])


def test_service_methods_match_tritonclient() -> None:
    from tritonclient.grpc import service_pb2

    from gateway.protocols.v2_grpc import messages

    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = messages.POOL.FindServiceByName(messages.SERVICE)
    assert [m.name for m in ours.methods] == list(messages.METHODS)
    for method in ours.methods:
        other = theirs.methods_by_name[method.name]
        assert (method.input_type.full_name, method.output_type.full_name) == (
            other.input_type.full_name, other.output_type.full_name)


def test_messages_cross_parse_with_tritonclient() -> None:
    """Bytes we write, tritonclient reads, including the uint64/double parameters."""
    from tritonclient.grpc import service_pb2

    from gateway.protocols.v2_grpc import messages

    ours = messages.ModelInferRequest(model_name="m", id="7", raw_input_contents=[b"\x01\x02"])
    ours.parameters["priority"].uint64_param = 2**63 + 1
    ours.parameters["scale"].double_param = 0.25
    ours.inputs.add(name="x", datatype="UINT8", shape=[2])
    theirs = service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert theirs.parameters["priority"].uint64_param == 2**63 + 1
    assert theirs.parameters["scale"].double_param == 0.25
    assert list(theirs.inputs[0].shape) == [2] and theirs.raw_input_contents[0] == b"\x01\x02"
    back = messages.ModelInferRequest.FromString(theirs.SerializeToString())
    assert back == ours
