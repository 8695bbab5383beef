"""Command line: ``gateway serve | check | routes``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from gateway import __version__
from gateway.config import GatewayConfig, load_config
from gateway.confignode import ConfigError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="Multi-protocol inference gateway")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                        help="logging level on stderr (default: info)")
    sub = parser.add_subparsers(dest="command", required=True)
    config_help = "YAML configuration file (default: the embedded config/gateway.yaml)"

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help=config_help)
    serve.add_argument("--port-file", type=Path,
                       help="after start, write the bound ports as JSON here (useful with port 0)")

    check = sub.add_parser("check", help="validate a configuration; exit 1 on errors")
    check.add_argument("--config", help=config_help)

    routes = sub.add_parser("routes", help="print the resolved route table")
    routes.add_argument("--config", help=config_help)
    return parser


def _load(path: str | None) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{path or '<embedded>'}: {problem}", file=sys.stderr)
        return None


async def _serve(config: GatewayConfig, config_path: str | None, port_file: Path | None) -> None:
    from gateway.server import Gateway

    gateway = Gateway(config, config_path)
    try:
        await gateway.start()
    except OSError as exc:
        await gateway.stop(0)
        raise SystemExit(f"gateway: cannot start: {exc}") from None
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(gateway.ports))
        tmp.replace(port_file)  # atomic: readers never see half a file
    await gateway.run_until_signalled()


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # optional: the stdlib loop works, only slower
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = _load(args.config)
    if config is None:
        return 1
    if args.command == "check":
        print(f"{config.source}: OK ({len(config.listeners)} listeners, {len(config.upstreams)} upstreams, "
              f"{len(config.routes)} routes)")
        return 0
    if args.command == "routes":
        from gateway.routing import RouteTable

        for line in RouteTable(config).describe():
            print(line)
        return 0
    _install_uvloop()
    asyncio.run(_serve(config, args.config, args.port_file))
    return 0
