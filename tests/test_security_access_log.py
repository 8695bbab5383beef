"""The access log cannot be split by what a client sends: every character a
log reader may take for a line break (``str.splitlines`` takes \\v, \\f,
\\x1c-\\x1e, U+0085, U+2028 and U+2029 as well as \\n and \\r) is escaped
in both formats, and bytes of a path that are no UTF-8 are written as
escapes rather than breaking the line (or its writing).

Unauthenticated requests over a raw socket, on the fast path (a V2 model
route) and on the aiohttp fallback (an unknown path), against a gateway
process; the log file is read back as a reader that splits on Unicode line
breaks would read it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_wire import exchange

from support import BUILTIN_REST_CONFIG, GatewayProcess, wait_for, write_config

FORGED = "ts=2026-01-01T00:00:00.000Z request_id=forged status=200 outcome=ok"
# Every line break str.splitlines knows but \n and \r (which HTTP cannot carry in a path), percent-encoded.
BREAKS = {"\x0b": "%0B", "\x0c": "%0C", "\x1c": "%1C", "\x1d": "%1D", "\x1e": "%1E", "\x85": "%C2%85",
          "\u2028": "%E2%80%A8", "\u2029": "%E2%80%A9"}
FORGED_PATH = FORGED.replace(" ", "%20")


def paths() -> list[str]:
    found = []
    for encoded in BREAKS.values():
        found.append(f"/v2/models/m{encoded}{FORGED_PATH}/ready")  # a fast route: the model is logged too
        found.append(f"/nowhere{encoded}{FORGED_PATH}")  # handed to the aiohttp app: an unknown path
    found.append("/v2/models/m%FF%FE/ready")  # no UTF-8: lone surrogates once decoded
    return found


@pytest.fixture(scope="module", params=["plain", "json"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[GatewayProcess, Path, str]]:
    directory = tmp_path_factory.mktemp("access-log")
    log = directory / "access.log"
    config = BUILTIN_REST_CONFIG + f"""
observability:
  access_log: {{format: {request.param}, destination: "{log}"}}
"""
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw, log, request.param


def send(port: int, path: str) -> int:
    return exchange(port, "GET", path)[0]


def test_no_request_splits_or_breaks_an_access_log_line(gateway: tuple[GatewayProcess, Path, str]) -> None:
    gw, log, fmt = gateway
    port = gw.ports["rest"]
    sent = paths()
    for path in sent:
        assert send(port, path) in (400, 404), path
    marker = "/v2/models/last/ready"
    assert send(port, marker) == 404

    def complete() -> bool:
        return log.exists() and marker in log.read_text(errors="replace")

    wait_for(complete, 10, "the access log to hold every request")
    text = log.read_text(encoding="utf-8")  # valid UTF-8 throughout
    lines = text.splitlines()  # splits on every Unicode line break
    assert len(lines) == len(sent) + 1, lines
    for line in lines:
        if fmt == "json":
            record = json.loads(line)
            assert record["status"] in ("400", "404")
        else:
            assert line.startswith("ts=") and (" status=400 " in line or " status=404 " in line), line
    # The forged text is there, inside its own request's (escaped) path.
    assert sum(FORGED.split(" ")[2] in line for line in lines) == len(sent) - 1
    assert "Traceback" not in gw.log()
