"""Triton's extensions on gRPC: canonical answers <-> protobuf messages.

Model configurations travel between the two forms losslessly: a dict in
Triton's JSON form (what REST answers, 64-bit integers as numbers) and the
``ModelConfig`` message, declared in full in protos/inference.proto.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from gateway.core.errors import ErrorKind, GatewayError
from gateway.observability.statistics import Duration, ModelStatistics
from gateway.protocols.triton import REFUSALS
from gateway.protocols.triton.repository import IndexEntry
from gateway.protocols.triton.shm import Region
from gateway.protocols.v2_grpc import messages as pb

# RPCs the gateway refuses, with the reason (a key of REFUSALS).
REFUSED_RPCS: Mapping[str, str] = MappingProxyType({
    "RepositoryModelLoad": "model_repository(load)",
    "RepositoryModelUnload": "model_repository(load)",
    "CudaSharedMemoryRegister": "cuda_shared_memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
})

_WIDE_INTEGERS = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                            FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})


def refusal_reason(rpc: str) -> str:
    return REFUSALS[REFUSED_RPCS[rpc]]


# --- model configuration ------------------------------------------------------


def _wide_as_numbers(value: dict[str, Any], descriptor: Descriptor) -> None:
    """protobuf's JSON writes 64-bit integers as strings; Triton's REST
    writes numbers. Convert in place, guided by the message descriptor."""
    for name, item in value.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        kind = field.message_type
        if kind is not None and kind.GetOptions().map_entry:
            value_field = kind.fields_by_name["value"]
            if value_field.message_type is not None:
                for entry in item.values():
                    _wide_as_numbers(entry, value_field.message_type)
            elif value_field.type in _WIDE_INTEGERS:
                value[name] = {k: int(v) for k, v in item.items()}
        elif kind is not None:
            for entry in item if field.is_repeated else [item]:
                _wide_as_numbers(entry, kind)
        elif field.type in _WIDE_INTEGERS:
            value[name] = [int(v) for v in item] if field.is_repeated else int(item)


def config_to_json(message: Any) -> dict[str, Any]:
    """A ``ModelConfig`` as Triton's REST writes it (default values included)."""
    value = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                      always_print_fields_with_no_presence=True)
    _wide_as_numbers(value, message.DESCRIPTOR)
    return value


def config_from_json(config: dict[str, Any]) -> Any:
    """Triton's JSON form as a ``ModelConfig`` message; fields it does not
    know are dropped (a newer Triton may have more)."""
    try:
        return json_format.ParseDict(config, pb.ModelConfig(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                           f"the model configuration does not fit Triton's ModelConfig: {str(exc)[:300]}") from None


# --- statistics and the repository index --------------------------------------


def _fill(target: Any, duration: Duration) -> None:
    target.SetInParent()  # present even when zero, as Triton sends them
    target.count, target.ns = duration.count, duration.ns


def statistics_message(found: list[ModelStatistics]) -> Any:
    reply = pb.ModelStatisticsResponse()
    for s in found:
        item = reply.model_stats.add(name=s.name, version=s.version, last_inference=s.last_inference_ms,
                                     inference_count=s.inference_count, execution_count=s.execution_count)
        stats = item.inference_stats
        for field in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
                      "cache_miss"):
            _fill(getattr(stats, field), getattr(s, field))
        for b in s.batches.values():
            batch = item.batch_stats.add(batch_size=b.batch_size)
            for field in ("compute_input", "compute_infer", "compute_output"):
                _fill(getattr(batch, field), getattr(b, field))
    return reply


def index_message(entries: list[IndexEntry]) -> Any:
    reply = pb.RepositoryIndexResponse()
    for entry in entries:
        reply.models.add(name=entry.name, version=entry.version, state=entry.state, reason=entry.reason)
    return reply


def index_from_message(reply: Any) -> list[str]:
    """Model names of an upstream's repository index."""
    return [model.name for model in reply.models if model.name]


# --- shared memory ------------------------------------------------------------


def system_status_message(regions: list[Region]) -> Any:
    reply = pb.SystemSharedMemoryStatusResponse()
    for region in regions:
        status = reply.regions[region.name]
        status.name, status.key, status.offset, status.byte_size = (region.name, region.key, region.offset,
                                                                    region.byte_size)
    return reply
