"""Route header matchers under a secret's name (``authorization``,
``x-api-key``, ...) are redacted alike by the admin listener's ``/config``
and ``/routes`` and by ``gateway routes``; other matchers stay readable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from peers.echo_gateway import admin_call
from support import REPO, GatewayProcess, write_config

BEARER = "Bearer s3cr3t-route-token"
API_KEY = "k3y-value-in-a-regex"
CONFIG = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
routes:
  - name: privileged
    match:
      model: "*"
      headers: {{authorization: "{BEARER}", x-api-key: {{regex: "^{API_KEY}$"}}, x-tenant: blue}}
    upstream: local
  - upstream: local
"""
SHOWN = "header[x-tenant]=blue"


def _assert_redacted(text: str) -> None:
    assert BEARER not in text and "s3cr3t" not in text and API_KEY not in text, text
    assert "header[authorization]=<redacted>" in text and "header[x-api-key]=<redacted>" in text, text
    assert SHOWN in text, text


def test_admin_routes_redact_what_admin_config_redacts(tmp_path: Path) -> None:
    with GatewayProcess(write_config(tmp_path, CONFIG), tmp_path / "gateway.log") as gw:
        status, routes = admin_call(gw, "/routes")
        assert status == 200
        _assert_redacted("\n".join(routes["routes"]))
        status, config = admin_call(gw, "/config")
        assert status == 200
        assert config["routes"][0]["match"]["headers"] == {
            "authorization": "<redacted>", "x-api-key": "<redacted>", "x-tenant": "blue"}


def test_cli_routes_redacts_header_matchers(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gateway", "routes", "--config",
                             str(write_config(tmp_path, CONFIG))],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    _assert_redacted(result.stdout)
    assert result.stdout.startswith("#0 privileged model=* header[authorization]=<redacted>"), result.stdout
