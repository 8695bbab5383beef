"""Certificate and token rotation: what a configuration reload relies on.

A gateway built from a config naming new certificate files serves them; a
running gateway re-reads rotated files in place (``Gateway.reload_security``)
for connections made afterwards, on HTTP and gRPC listeners alike, and keeps
the old material when the new files are unreadable.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
import pytest
from security_support import Pki, make_pki, served_fingerprint, write_token

from peers.echo_gateway import admin_call
from support import GatewayProcess, InProcessGateway, metric_value, parse_yaml_config, scrape_metrics, write_config


def config_text(pki: Pki, tokens: Path) -> str:
    tls = f'tls: {{cert: "{pki.server_cert}", key: "{pki.server_key}"}}'
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0", {tls}, auth: {{token: {{file: "{tokens}"}}}}}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0", {tls}}}
upstreams:
  - {{name: local, protocol: builtin}}
routes:
  - {{match: {{model: "*"}}, upstream: local}}
"""


async def fingerprints(gw: InProcessGateway, ca: Path) -> tuple[str, str]:
    ports = gw.gateway.ports
    return (await served_fingerprint(ports["rest"], ca), await served_fingerprint(ports["grpc"], ca, alpn="h2"))


async def metadata_status(gw: InProcessGateway, ca: Path, token: str) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    url = f"https://127.0.0.1:{gw.gateway.ports['rest']}/v2/models/simple"
    async with aiohttp.ClientSession() as session, session.get(
            url, ssl=context, headers={"Authorization": f"Bearer {token}"}) as response:
        return response.status


async def test_a_gateway_built_from_new_files_serves_them(tmp_path: Path) -> None:
    old, new = make_pki(tmp_path / "old"), make_pki(tmp_path / "new")
    tokens = write_token(tmp_path / "tokens", "t1")
    async with InProcessGateway(config_text(old, tokens)) as gw:
        assert await fingerprints(gw, old.ca) == (old.fingerprint(), old.fingerprint())
    async with InProcessGateway(config_text(new, tokens)) as gw:
        assert await fingerprints(gw, new.ca) == (new.fingerprint(), new.fingerprint())


def _rotate(target: Pki, source: Pki) -> None:
    """Replace the files in place, as cert-manager or a secret mount does."""
    for name in ("ca", "server_cert", "server_key"):
        getattr(target, name).write_bytes(getattr(source, name).read_bytes())


async def test_running_listeners_reload_rotated_files(tmp_path: Path) -> None:
    live, fresh = make_pki(tmp_path / "live"), make_pki(tmp_path / "fresh")
    old_ca = tmp_path / "old-ca.pem"
    old_ca.write_bytes(live.ca.read_bytes())
    old_fingerprint = live.fingerprint()
    tokens = write_token(tmp_path / "tokens", "old-token")
    text = config_text(live, tokens)
    async with InProcessGateway(text) as gw:
        assert await fingerprints(gw, old_ca) == (old_fingerprint, old_fingerprint)
        assert await metadata_status(gw, old_ca, "old-token") == 200

        _rotate(live, fresh)
        write_token(tokens, "new-token")
        assert await fingerprints(gw, old_ca) == (old_fingerprint, old_fingerprint)  # nothing re-read yet
        gw.gateway.reload_security(parse_yaml_config(text))
        assert await fingerprints(gw, fresh.ca) == (fresh.fingerprint(), fresh.fingerprint())
        assert await metadata_status(gw, fresh.ca, "new-token") == 200
        assert await metadata_status(gw, fresh.ca, "old-token") == 401


async def test_a_failed_reload_keeps_the_old_material(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tokens = write_token(tmp_path / "tokens", "kept-token")
    text = config_text(pki, tokens)
    config = parse_yaml_config(text)
    async with InProcessGateway(text) as gw:
        good_key = pki.server_key.read_bytes()
        pki.server_key.write_text("not a key\n")
        with pytest.raises(ssl.SSLError):
            gw.gateway.reload_security(config)
        pki.server_key.write_bytes(good_key)
        tokens.unlink()
        with pytest.raises(OSError, match="cannot read token file"):
            gw.gateway.reload_security(config)
        assert await fingerprints(gw, pki.ca) == (pki.fingerprint(), pki.fingerprint())
        assert await metadata_status(gw, pki.ca, "kept-token") == 200


# --- the real reload path: a gateway process and its admin POST /reload ----------------


async def test_admin_reload_serves_rotated_certificates_and_rejects_broken_ones(tmp_path: Path) -> None:
    live, fresh = make_pki(tmp_path / "live"), make_pki(tmp_path / "fresh")
    old_ca, old_fingerprint = tmp_path / "old-ca.pem", live.fingerprint()
    old_ca.write_bytes(live.ca.read_bytes())
    tokens = write_token(tmp_path / "tokens", "t1")
    with GatewayProcess(write_config(tmp_path, config_text(live, tokens)), tmp_path / "gateway.log") as gw:
        async def served(ca: Path) -> tuple[str, str]:
            return (await served_fingerprint(gw.ports["rest"], ca),
                    await served_fingerprint(gw.ports["grpc"], ca, alpn="h2"))

        assert await served(old_ca) == (old_fingerprint, old_fingerprint)
        _rotate(live, fresh)
        assert await served(old_ca) == (old_fingerprint, old_fingerprint)  # nothing re-read yet
        status, body = await asyncio.to_thread(admin_call, gw, "/reload", "POST")
        assert status == 200 and body["reloaded"], body
        assert await served(fresh.ca) == (fresh.fingerprint(), fresh.fingerprint())

        good_key = live.server_key.read_bytes()
        live.server_key.write_text("not a key\n")
        status, body = await asyncio.to_thread(admin_call, gw, "/reload", "POST")
        assert status == 400 and not body["reloaded"], body
        assert any(str(live.server_key) in problem for problem in body["problems"]), body
        # The running certificates keep serving, and requests over them succeed.
        assert await served(fresh.ca) == (fresh.fingerprint(), fresh.fingerprint())
        context = ssl.create_default_context(cafile=str(fresh.ca))
        async with aiohttp.ClientSession() as session, session.get(
                f"https://127.0.0.1:{gw.ports['rest']}/v2/models/simple", ssl=context,
                headers={"Authorization": "Bearer t1"}) as response:
            assert response.status == 200
        samples = await asyncio.to_thread(scrape_metrics, gw)
        assert metric_value(samples, "gateway_config_reloads_total", result="failure") == 1
        assert metric_value(samples, "gateway_config_last_reload_successful") == 0

        live.server_key.write_bytes(good_key)  # repaired: the next reload takes it
        status, body = await asyncio.to_thread(admin_call, gw, "/reload", "POST")
        assert status == 200 and body["reloaded"], body
