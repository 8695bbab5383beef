"""The Triton extensions the gateway serves itself, by the names
``server.extensions`` takes (docs/triton-extensions.md); the extensions'
code is gateway/protocols/triton/."""

from __future__ import annotations

CLASSIFICATION = "classification"
MODEL_CONFIGURATION = "model_configuration"
MODEL_REPOSITORY = "model_repository"
STATISTICS = "statistics"
SYSTEM_SHARED_MEMORY = "system_shared_memory"

# What `server.extensions` may name.
GATEWAY_EXTENSIONS = (CLASSIFICATION, MODEL_CONFIGURATION, MODEL_REPOSITORY, STATISTICS, SYSTEM_SHARED_MEMORY)
# On unless the configuration names its own list. System shared memory is
# not: a client that registers a region makes the gateway read and write
# that shared-memory object of its host (Triton too asks for
# --allow-client-shm).
DEFAULT_EXTENSIONS = (CLASSIFICATION, MODEL_CONFIGURATION, MODEL_REPOSITORY, STATISTICS)
