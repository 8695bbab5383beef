"""The V2 gRPC message classes, built in a descriptor pool of our own.

tritonclient.grpc, MLServer and KServe each register ``inference.*`` in
protobuf's process-wide default pool; a second registration of the same
names fails ("duplicate symbol"). Building our classes in a private pool
lets the gateway share a process with any of them (tests, embedders, a
plugin that imports tritonclient). The wire format is unaffected: messages
serialize identically whichever pool made their class.

The descriptor comes from protos/inference.proto via ``make protos``.
The health and reflection files are added too, so the reflection service
can describe every service the listener serves from this one pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from gateway.protocols.v2_grpc.generated import inference_descriptor

SERVICE = "inference.GRPCInferenceService"
# grpc takes message size limits as a C int: larger settings are capped here.
GRPC_MAX_MESSAGE = (1 << 31) - 1


def _build_pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for serialized in (inference_descriptor.SERIALIZED, health_pb2.DESCRIPTOR.serialized_pb,
                       reflection_pb2.DESCRIPTOR.serialized_pb):
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(serialized))
    return pool


POOL = _build_pool()


def _message(name: str) -> Any:
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"inference.{name}"))


ServerLiveRequest = _message("ServerLiveRequest")
ServerLiveResponse = _message("ServerLiveResponse")
ServerReadyRequest = _message("ServerReadyRequest")
ServerReadyResponse = _message("ServerReadyResponse")
ModelReadyRequest = _message("ModelReadyRequest")
ModelReadyResponse = _message("ModelReadyResponse")
ServerMetadataRequest = _message("ServerMetadataRequest")
ServerMetadataResponse = _message("ServerMetadataResponse")
ModelMetadataRequest = _message("ModelMetadataRequest")
ModelMetadataResponse = _message("ModelMetadataResponse")
ModelInferRequest = _message("ModelInferRequest")
ModelInferResponse = _message("ModelInferResponse")
InferParameter = _message("InferParameter")
InferTensorContents = _message("InferTensorContents")

ModelStreamInferResponse = _message("ModelStreamInferResponse")
ModelConfig = _message("ModelConfig")
ModelConfigRequest = _message("ModelConfigRequest")
ModelConfigResponse = _message("ModelConfigResponse")
ModelStatisticsResponse = _message("ModelStatisticsResponse")
RepositoryIndexRequest = _message("RepositoryIndexRequest")
RepositoryIndexResponse = _message("RepositoryIndexResponse")
SystemSharedMemoryStatusResponse = _message("SystemSharedMemoryStatusResponse")
SystemSharedMemoryRegisterResponse = _message("SystemSharedMemoryRegisterResponse")
SystemSharedMemoryUnregisterResponse = _message("SystemSharedMemoryUnregisterResponse")
CudaSharedMemoryStatusResponse = _message("CudaSharedMemoryStatusResponse")
CudaSharedMemoryUnregisterResponse = _message("CudaSharedMemoryUnregisterResponse")

_SERVICE_DESCRIPTOR = POOL.FindServiceByName(SERVICE)

# RPC name -> (request class, response class), in the order of the service:
# the unary RPCs (the six core ones, then Triton's extensions) ...
METHODS: Mapping[str, tuple[Any, Any]] = MappingProxyType({
    method.name: (message_factory.GetMessageClass(method.input_type),
                  message_factory.GetMessageClass(method.output_type))
    for method in _SERVICE_DESCRIPTOR.methods if not (method.client_streaming or method.server_streaming)
})
# ... and the streaming ones (ModelStreamInfer: frontend.py and stream.py).
STREAM_METHODS: tuple[str, ...] = tuple(
    method.name for method in _SERVICE_DESCRIPTOR.methods if method.client_streaming or method.server_streaming)


# Methods whose messages the gateway serializes and parses itself (raw
# tensors never pass through protobuf objects, see rawwire): grpc takes and
# gives their bytes as they are, with no (de)serializer call.
BYTES_METHODS = frozenset({"ModelInfer"})


def method_path(name: str) -> str:
    return f"/{SERVICE}/{name}"


def serializer(message_class: Any) -> Callable[[Any], bytes]:
    """For grpc: messages are serialized by protobuf, bytes already
    serialized by hand pass as they are."""
    def serialize(message: Any) -> bytes:
        return message if isinstance(message, bytes) else message_class.SerializeToString(message)  # type: ignore[no-any-return]

    return serialize


def method_serializer(name: str, message_class: Any) -> Callable[[Any], bytes] | None:
    """The serializer grpc needs for ``name``'s messages: none for BYTES_METHODS."""
    return None if name in BYTES_METHODS else serializer(message_class)
