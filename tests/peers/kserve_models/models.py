"""The V1 test models (custom ``kserve.Model``s) tests/test_v1_upstream.py
calls through the gateway. Each takes KServe V1's ``instances`` (rows) and,
where said, TF Serving's columnar ``inputs``."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from kserve import Model
from kserve.errors import InvalidInput


def _numbers(value: Any) -> list[float]:
    """Every number in a value (nested lists, or {name: value} objects)."""
    if isinstance(value, dict):
        return [n for item in value.values() for n in _numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in _numbers(item)]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"not a number: {str(value)[:40]}")
    return [value]


def _doubled(value: Any) -> Any:
    if isinstance(value, list):
        return [_doubled(item) for item in value]
    _numbers(value)  # InvalidInput (400) for anything but numbers
    return value * 2


class Ready(Model):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.ready = True


class Doubler(Ready):
    """Each instance doubled, element by element: ``predictions`` for rows,
    ``outputs`` for columnar ``inputs``; 400 for non-numbers."""

    async def predict(self, payload: dict[str, Any], headers: Any = None) -> dict[str, Any]:
        if "inputs" in payload:
            return {"outputs": _doubled(payload["inputs"])}
        return {"predictions": [_doubled(row) for row in payload["instances"]]}


class Summer(Ready):
    """One number per instance: the sum of all its numbers (several named
    inputs arrive as {name: value} objects)."""

    async def predict(self, payload: dict[str, Any], headers: Any = None) -> dict[str, Any]:
        return {"predictions": [sum(_numbers(row)) for row in payload["instances"]]}


class Labeller(Ready):
    """Dict predictions: two outputs per instance, ``total`` and ``label``."""

    async def predict(self, payload: dict[str, Any], headers: Any = None) -> dict[str, Any]:
        totals = [sum(_numbers(row)) for row in payload["instances"]]
        return {"predictions": [{"total": t, "label": "big" if t > 10 else "small"} for t in totals]}

    async def explain(self, payload: dict[str, Any], headers: Any = None) -> dict[str, Any]:
        """Why each label: its total against the threshold."""
        return {"explanations": [{"total": sum(_numbers(row)), "threshold": 10} for row in payload["instances"]]}


class Echo(Ready):
    """The instances back unchanged (UTF-8 text and {"b64"} objects as they
    came; a {"b64"} that is no base64 is a 400). Each body it receives is
    appended as one JSON line to the file $KSERVE_CALLS names, for tests."""

    async def predict(self, payload: dict[str, Any], headers: Any = None) -> dict[str, Any]:
        calls = os.environ.get("KSERVE_CALLS")
        if calls:
            with open(calls, "a") as log:
                log.write(json.dumps(payload) + "\n")
        rows = payload["instances"]
        for row in rows:
            if isinstance(row, dict) and "b64" in row:
                try:
                    base64.b64decode(row["b64"], validate=True)
                except ValueError as exc:
                    raise InvalidInput("not base64") from exc
        return {"predictions": rows}


class Broken(Ready):
    """Fails every request: KServe answers 500."""

    async def predict(self, payload: dict[str, Any], headers: Any = None) -> dict[str, Any]:
        raise RuntimeError("the broken model always fails")


class Sleeper(Ready):
    """Registered but never healthy: KServe answers 503 for its status."""

    async def healthy(self) -> bool:
        return False


def all_models() -> list[Model]:
    return [Doubler("doubler"), Summer("summer"), Labeller("labeller"), Echo("echo"), Broken("broken"),
            Sleeper("sleeper")]
