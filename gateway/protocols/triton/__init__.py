"""Triton's protocol extensions, served by the gateway for every upstream.

The gateway answers these itself, from its own accounting and knowledge,
whatever protocol the upstream speaks: statistics, model configuration,
the repository index and classification outputs; system shared memory for
clients on its host, when turned on. Calls it cannot honour (CUDA shared
memory, model loading, trace and log settings) are refused with a reason.
See docs/triton-extensions.md.

This module holds only names; the names `server.extensions` takes are the
configuration's (gateway/config/extensions.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

BINARY_TENSOR_DATA = "binary_tensor_data"  # a REST wire feature, always on there
# Set by the supervisor for its workers: the directory their shared-memory
# registrations share (gateway/protocols/triton/shm.py).
SHM_REGISTRY_ENV = "GATEWAY_SHM_REGISTRY"

# Why the gateway refuses the rest of Triton's API; every answer names the
# extension, so a client's error says what is missing and why.
REFUSALS: Mapping[str, str] = MappingProxyType({
    "model_repository(load)": "model_repository: the gateway does not load or unload models; the upstream "
                              "servers it routes to own their models (load or unload them there)",
    "cuda_shared_memory": "cuda_shared_memory: the gateway cannot map a client's CUDA memory (it uses no GPU "
                          "and forwards tensors to its upstreams); use system shared memory or send tensor "
                          "data in the request",
    "trace": "trace: the gateway does not take Triton trace settings; it traces with OpenTelemetry "
             "(observability.tracing in its configuration)",
    "logging": "logging: the gateway's log settings are fixed when it starts (gateway --log-level, "
               "observability.access_log in its configuration)",
})


def turned_off(extension: str) -> str:
    return f"{extension}: this extension is turned off in the gateway's configuration (server.extensions)"
