"""Model configuration in Triton's form, forwarded or synthesized.

The canonical form is Triton's ModelConfig as JSON (what Triton's REST
``/config`` answers: field names as in model_config.proto, 64-bit integers as
numbers). An upstream that keeps configurations (a Triton, over REST or
gRPC) is asked for it; for any other the gateway writes one from the model
metadata and marks it with the parameter ``synthesized``.
"""

from __future__ import annotations

import os
from typing import Any

from gateway.config.classification import ClassificationConfig
from gateway.core.types import DECOUPLED_PARAMETER, ModelMetadata, TensorSpec

# Marks a configuration the gateway wrote: parameters.synthesized.string_value.
SYNTHESIZED_PARAMETER = "synthesized"
SYNTHESIZED_VALUE = "true: written by the gateway from the model metadata"
# A synthesized batching model's max_batch_size: the gateway sets no limit
# and cannot know the upstream's, so it says "as large as a config can say".
UNKNOWN_MAX_BATCH_SIZE = 2**31 - 1


def config_data_type(datatype: str) -> str:
    """V2 datatype -> model-config DataType name (BYTES is TYPE_STRING)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def batches(metadata: ModelMetadata) -> bool:
    """Whether the metadata describes a batching model: every input and
    output has two or more dimensions and a variable (-1) leading one."""
    specs = (*metadata.inputs, *metadata.outputs)
    return bool(specs) and all(len(spec.shape) >= 2 and spec.shape[0] == -1 for spec in specs)


def _tensor(spec: TensorSpec, batching: bool) -> dict[str, Any]:
    return {"name": spec.name, "data_type": config_data_type(spec.datatype),
            "dims": list(spec.shape[1:] if batching else spec.shape)}


def synthesize(model: str, metadata: ModelMetadata, labels: ClassificationConfig) -> dict[str, Any]:
    """A configuration from metadata: name, platform, inputs, outputs and
    max_batch_size (from a leading -1, see :func:`batches`)."""
    batching = batches(metadata)
    outputs = []
    for spec in metadata.outputs:
        output = _tensor(spec, batching)
        label_file = labels.label_file(model, spec.name)
        if label_file:
            output["label_filename"] = os.path.basename(label_file)
        outputs.append(output)
    config = {
        "name": model,
        "platform": metadata.platform,
        "max_batch_size": UNKNOWN_MAX_BATCH_SIZE if batching else 0,
        "input": [_tensor(spec, batching) for spec in metadata.inputs],
        "output": outputs,
        "parameters": {SYNTHESIZED_PARAMETER: {"string_value": SYNTHESIZED_VALUE}},
    }
    if metadata.parameters.get(DECOUPLED_PARAMETER) is True:  # clients read this to open a stream
        config["model_transaction_policy"] = {"decoupled": True}
    return config


def max_batch_size(config: dict[str, Any]) -> int:
    value = config.get("max_batch_size", 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
