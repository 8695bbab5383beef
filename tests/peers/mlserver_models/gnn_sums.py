"""A model over the gateway's graph tensor contract (docs/graphstorm.md),
simple enough that a test can recompute its answer from the GraphStorm
payload alone, so the whole mapping (node numbering, features, edge index
direction, targets) is checked end to end:

- a node's score: the sum of its numeric feature values plus the UTF-8 byte
  length of each text feature;
- per node, over its in-edges of every relation: the in-degree and the mean
  score of the source nodes (0 without in-edges);
- node_classification: softmax([score, mean source score, in-degree] / 10)
  (a temperature of 10 keeps text lengths from saturating it);
  node_regression: [score + mean source score].

Answers ``prediction/{type}`` FP32 [T, K] for every ``target/{type}``, rows
in target order. Edge features are ignored; edge targets are refused. Every
request is logged (id, parameters, tensor names and shapes).
"""

import numpy as np
from _shared import record, request_parameters
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, RequestInput

TEMPERATURE = 10.0


def _text_lengths(item: RequestInput) -> np.ndarray:
    # BYTES arrive as str over REST JSON and as bytes over gRPC raw contents.
    return np.array([len(x.encode() if isinstance(x, str) else bytes(x)) for x in item.data], dtype=np.float64)


def _softmax(logits: np.ndarray) -> np.ndarray:
    exps = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exps / exps.sum(axis=1, keepdims=True)


class Model(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        record(self.settings, payload)
        task = request_parameters(payload).get("gml_task")
        if task not in ("node_classification", "node_regression"):
            raise MLServerError(f"gnn_sums serves node tasks, not {task!r}", status_code=400)
        # Names are /-separated with escaped components; this model keeps
        # the escaped form as keys, which is consistent across tensors.
        tensors = [(item.name.split("/"), item) for item in payload.inputs]
        scores = {parts[1]: np.zeros(len(item.data)) for parts, item in tensors
                  if parts[0] == "node" and parts[2:] == ["ids"]}
        for parts, item in tensors:
            if parts[0] == "node" and len(parts) == 4 and parts[2] == "feature":
                if item.datatype == "BYTES":
                    scores[parts[1]] += _text_lengths(item)
                else:
                    values = NumpyCodec.decode_input(item).astype(np.float64)
                    scores[parts[1]] += values.reshape(values.shape[0], -1).sum(axis=1)
        source_sum = {t: np.zeros(len(s)) for t, s in scores.items()}
        degree = {t: np.zeros(len(s)) for t, s in scores.items()}
        for parts, item in tensors:
            if parts[0] == "edge" and len(parts) == 5 and parts[4] == "index":
                src, dst = parts[1], parts[3]
                index = NumpyCodec.decode_input(item).astype(np.int64).reshape(2, -1)
                source_sum[dst] += np.bincount(index[1], weights=scores[src][index[0]], minlength=len(scores[dst]))
                degree[dst] += np.bincount(index[1], minlength=len(scores[dst]))
        outputs = []
        for parts, item in tensors:
            if parts[0] != "target":
                continue
            if len(parts) != 2:
                raise MLServerError("gnn_sums serves node targets only", status_code=400)
            node_type = parts[1]
            rows = NumpyCodec.decode_input(item).astype(np.int64).reshape(-1)
            score = scores[node_type][rows]
            mean = source_sum[node_type][rows] / np.maximum(degree[node_type][rows], 1)
            if task == "node_classification":
                prediction = _softmax(np.stack([score, mean, degree[node_type][rows]], axis=1) / TEMPERATURE)
            else:
                prediction = (score + mean).reshape(-1, 1)
            outputs.append(NumpyCodec.encode_output(f"prediction/{node_type}", prediction.astype(np.float32)))
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
