"""The gateway's V2 gRPC messages: reproducible, wire-compatible, and
importable next to tritonclient.grpc in one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, FileDescriptor

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


def _type_name(field: FieldDescriptor) -> str | None:
    if field.message_type is not None:
        return field.message_type.full_name
    return field.enum_type.full_name if field.enum_type is not None else None


def _fields(descriptor: Descriptor) -> dict[str, tuple[int, int, bool, str | None, str | None]]:
    return {f.name: (f.number, f.type, f.is_repeated, _type_name(f),
                     f.containing_oneof.name if f.containing_oneof else None) for f in descriptor.fields}


def _values(enum: EnumDescriptor) -> dict[str, int]:
    return {v.name: v.number for v in enum.values}


def _compare(ours: Descriptor, theirs: Descriptor) -> None:
    assert _fields(ours) == _fields(theirs), ours.full_name
    assert sorted(n.name for n in ours.nested_types) == sorted(n.name for n in theirs.nested_types), ours.full_name
    for nested in ours.nested_types:
        _compare(nested, theirs.nested_types_by_name[nested.name])
    assert {e.name: _values(e) for e in ours.enum_types} == {e.name: _values(e) for e in theirs.enum_types}


def _tritonclient_files() -> list[FileDescriptor]:
    from tritonclient.grpc import model_config_pb2, service_pb2

    return [service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR]


def _their_message_names() -> list[str]:
    from tritonclient.grpc import model_config_pb2, service_pb2

    return [*service_pb2.DESCRIPTOR.message_types_by_name, *model_config_pb2.DESCRIPTOR.message_types_by_name]


def test_every_tritonclient_message_is_declared() -> None:
    """Triton's service and model-configuration messages, all of them, and
    nothing of ours that Triton lacks (one file here, two there)."""
    from gateway.protocols.v2_grpc import messages

    ours = messages.POOL.FindFileByName("inference.proto")
    assert sorted(ours.message_types_by_name) == sorted(_their_message_names())
    theirs_enums = {name: _values(e) for f in _tritonclient_files() for name, e in f.enum_types_by_name.items()}
    assert {name: _values(e) for name, e in ours.enum_types_by_name.items()} == theirs_enums


@pytest.mark.parametrize("name", _their_message_names())
def test_same_wire_contract_as_tritonclient(name: str) -> None:
    """Field names, numbers, types, oneofs, nesting and enum values equal
    Triton's published ones."""
    from gateway.protocols.v2_grpc import messages

    theirs = next(f.message_types_by_name[name] for f in _tritonclient_files() if name in f.message_types_by_name)
    _compare(messages.POOL.FindMessageTypeByName(f"inference.{name}"), theirs)


def test_service_methods_match_tritonclient() -> None:
    from tritonclient.grpc import service_pb2

    from gateway.protocols.v2_grpc import messages

    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = messages.POOL.FindServiceByName(messages.SERVICE)
    assert [m.name for m in ours.methods] == [m.name for m in theirs.methods]
    assert sorted([*messages.METHODS, *messages.STREAM_METHODS]) == sorted(m.name for m in ours.methods)
    for method in ours.methods:
        other = theirs.methods_by_name[method.name]
        assert (method.input_type.full_name, method.output_type.full_name, method.client_streaming,
                method.server_streaming) == (other.input_type.full_name, other.output_type.full_name,
                                             other.client_streaming, other.server_streaming)


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
