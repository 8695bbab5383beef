"""Command line: ``gateway serve | check | routes | schema``."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from gateway import __version__
from gateway.app.configure import load_config
from gateway.config.model import GatewayConfig
from gateway.config.node import ConfigError
from gateway.observability.logwriter import StderrHandler, install_stderr_logging
from gateway.runtime import fdlimit

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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
    serve.add_argument("--workers", default="1", metavar="N",
                       help="worker processes sharing the ports via SO_REUSEPORT, under one supervisor; "
                            "'auto' = usable CPUs (default: 1, no supervisor)")
    # Set by the supervisor for its workers; not for people.
    serve.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--worker-ports", type=json.loads, help=argparse.SUPPRESS)
    serve.add_argument("--worker-restarted", action="store_true", help=argparse.SUPPRESS)

    check = sub.add_parser("check", help="validate a configuration; exit 1 on errors")
    check.add_argument("--config", help=config_help)
    check.add_argument("--format", choices=["plain", "json"], default="plain",
                       help="plain lines (default) or one JSON object on stdout, for CI pipelines")

    routes = sub.add_parser("routes", help="print the resolved route table")
    routes.add_argument("--config", help=config_help)

    sub.add_parser("schema", help="print the JSON Schema of the configuration (for editors)")
    return parser


def _load(path: str | None) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{path or '<embedded>'}: {problem}", file=sys.stderr)
        return None


async def _watch_parent(parent: int) -> None:
    """A worker whose supervisor died (even by SIGKILL) stops itself."""
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    logging.getLogger(__name__).warning("supervisor %d is gone; stopping", parent)
    os.kill(os.getpid(), signal.SIGTERM)


async def _serve(config: GatewayConfig, config_path: str | None, port_file: Path | None,
                 worker: int | None = None, restarted: bool = False,
                 prepare: Callable[[GatewayConfig], GatewayConfig] | None = None) -> None:
    from gateway.app.server import Gateway
    from gateway.app.supervisor import MULTIPROC_ENV

    multiprocess_dir = os.environ.get(MULTIPROC_ENV) if worker is not None else None
    try:
        gateway = Gateway(config, config_path, worker=worker, multiprocess_dir=multiprocess_dir, prepare=prepare)
    except OSError as exc:  # e.g. an access-log file that cannot be opened
        raise SystemExit(f"gateway: cannot start: {exc}") from None
    if restarted:
        gateway.services.metrics.record_worker_restart()
    for handler in logging.getLogger().handlers:
        if isinstance(handler, StderrHandler):
            handler.count_drops_with(gateway.services.metrics.record_log_records_dropped)
    loop = asyncio.get_running_loop()
    # Until run_until_signalled installs their handlers, a SIGHUP or SIGUSR1
    # (a supervisor forwards them, logrotate sends one) must not kill a
    # starting process.
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        loop.add_signal_handler(sig, logging.getLogger(__name__).info, "%s while starting: ignored",
                                signal.Signals(sig).name)
    watcher = loop.create_task(_watch_parent(os.getppid())) if worker is not None else None
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
    if watcher is not None:
        watcher.cancel()


def _install_uvloop() -> None:
    """uvloop is a dependency; where it cannot load (a platform without a
    wheel, a build without it) the stdlib loop serves, slower, and says so."""
    try:
        import uvloop
    except ImportError as exc:
        logging.getLogger(__name__).warning("uvloop cannot be loaded (%s): serving on the standard asyncio loop, "
                                            "with a higher latency per request", exc)
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Written to stderr by a thread through a bounded queue: a stuck stderr
    # drops (and counts) records instead of blocking the event loop.
    install_stderr_logging(args.log_level.upper(), LOG_FORMAT)
    if args.command == "schema":
        from gateway.app.configure import build_schema

        print(json.dumps(build_schema(), indent=2))
        return 0
    if args.command == "check":
        from gateway.app.check import run_check

        return run_check(args.config, args.format)
    config = _load(args.config)
    if config is None:
        return 1
    if args.command == "routes":
        from gateway.dataplane.routing import RouteTable

        for line in RouteTable(config).describe():
            print(line)
        return 0
    from gateway.app.supervisor import worker_count

    try:
        workers = worker_count(args.workers)
    except ValueError as exc:
        print(f"gateway: --workers {args.workers}: {exc}", file=sys.stderr)
        return 2
    limit = fdlimit.raise_open_file_limit()  # each worker too: they may be started with other limits
    warning = fdlimit.open_file_warning(config, limit)
    if warning is not None and args.worker_index is None:  # once, not once per worker
        logging.getLogger(__name__).warning("%s", warning)
    import prometheus_client

    # `_created` series double the series count for no use on a dashboard.
    prometheus_client.disable_created_metrics()
    if workers > 1 and args.worker_index is None:
        from gateway.app.supervisor import Supervisor

        return Supervisor(config, args.config, workers, args.port_file, args.log_level).run()
    prepare = None
    if args.worker_index is not None:
        from gateway.app.supervisor import worker_config

        # The supervisor's reserved ports replace the file's, at start and on reload.
        prepare = functools.partial(worker_config, ports=args.worker_ports)
        config = prepare(config)
    _install_uvloop()
    asyncio.run(_serve(config, args.config, args.port_file, args.worker_index, args.worker_restarted, prepare))
    return 0

