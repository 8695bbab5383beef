"""A real UM-Bridge server (the PyPI ``umbridge`` package's ``serve_models``)
for tests, bound to loopback only, in its own process.

``serve_models`` binds every interface and takes no host; this launcher
replaces ``aiohttp.web.run_app`` (which it calls) with one that serves on a
socket bound here to 127.0.0.1 (port 0 unless given) and writes the port to
a file, so tests never race for ports and nothing listens beyond loopback.

Run: ``python tests/peers/umbridge_peer.py PORT_FILE [PORT]``.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PEER = Path(__file__).resolve()


# --- the models it serves ------------------------------------------------------


def _model_base() -> Any:
    import umbridge

    return umbridge.Model


def build_models() -> list[Any]:
    base = _model_base()

    class GradientOnly(base):  # type: ignore[misc, valid-type]
        """Listed first by the server; offers no Evaluate (the gateway must list it last)."""

        def __init__(self) -> None:
            super().__init__("gradient_only")

        def get_input_sizes(self, config: dict[str, Any]) -> list[int]:
            return [1]

        def get_output_sizes(self, config: dict[str, Any]) -> list[int]:
            return [1]

        def gradient(self, out_wrt: int, in_wrt: int, parameters: Any, sens: Any, config: Any) -> list[float]:
            return [2.0 * parameters[0][0] * sens[0]]

        def supports_gradient(self) -> bool:
            return True

    class Square(base):  # type: ignore[misc, valid-type]
        """out = scale·x² elementwise; input size from config 'n' (default 3)."""

        def __init__(self) -> None:
            super().__init__("square")

        def get_input_sizes(self, config: dict[str, Any]) -> list[int]:
            return [int(config.get("n", 3))]

        def get_output_sizes(self, config: dict[str, Any]) -> list[int]:
            return [int(config.get("n", 3))]

        def __call__(self, parameters: Any, config: Any = None) -> list[list[float]]:
            scale = (config or {}).get("scale", 1.0)
            return [[scale * v * v for v in parameters[0]]]

        def gradient(self, out_wrt: int, in_wrt: int, parameters: Any, sens: Any, config: Any) -> list[float]:
            scale = config.get("scale", 1.0)
            return [2.0 * scale * v * s for v, s in zip(parameters[0], sens, strict=True)]

        def apply_jacobian(self, out_wrt: int, in_wrt: int, parameters: Any, vec: Any, config: Any) -> list[float]:
            scale = config.get("scale", 1.0)
            return [2.0 * scale * v * w for v, w in zip(parameters[0], vec, strict=True)]

        def apply_hessian(self, out_wrt: int, in_wrt1: int, in_wrt2: int, parameters: Any, sens: Any, vec: Any,
                          config: Any) -> list[float]:
            scale = config.get("scale", 1.0)
            return [2.0 * scale * s * w for s, w in zip(sens, vec, strict=True)]

        def supports_evaluate(self) -> bool:
            return True

        def supports_gradient(self) -> bool:
            return True

        def supports_apply_jacobian(self) -> bool:
            return True

        def supports_apply_hessian(self) -> bool:
            return True

    class EvaluateOnly(base):  # type: ignore[misc, valid-type]
        """[a, b, c], [d] -> [a·d + b², exp(c)] and [a + b + c + d]."""

        def __init__(self) -> None:
            super().__init__("evaluate_only")

        def get_input_sizes(self, config: dict[str, Any]) -> list[int]:
            return [3, 1]

        def get_output_sizes(self, config: dict[str, Any]) -> list[int]:
            return [2, 1]

        def __call__(self, parameters: Any, config: Any = None) -> list[list[float]]:
            (a, b, c), (d,) = parameters
            return [[a * d + b * b, math.exp(c)], [a + b + c + d]]

        def supports_evaluate(self) -> bool:
            return True

    class NonFinite(base):  # type: ignore[misc, valid-type]
        """Answers [NaN, inf, -inf, x]: the reference server writes Python reprs."""

        def __init__(self) -> None:
            super().__init__("nonfinite")

        def get_input_sizes(self, config: dict[str, Any]) -> list[int]:
            return [1]

        def get_output_sizes(self, config: dict[str, Any]) -> list[int]:
            return [4]

        def __call__(self, parameters: Any, config: Any = None) -> list[list[float]]:
            return [[math.nan, math.inf, -math.inf, parameters[0][0]]]

        def supports_evaluate(self) -> bool:
            return True

    class Broken(base):  # type: ignore[misc, valid-type]
        """Declares output size 2 but answers 3 values: the server's InvalidOutput."""

        def __init__(self) -> None:
            super().__init__("broken")

        def get_input_sizes(self, config: dict[str, Any]) -> list[int]:
            return [1]

        def get_output_sizes(self, config: dict[str, Any]) -> list[int]:
            return [2]

        def __call__(self, parameters: Any, config: Any = None) -> list[list[float]]:
            return [[1.0, 2.0, 3.0]]

        def supports_evaluate(self) -> bool:
            return True

    class Slow(base):  # type: ignore[misc, valid-type]
        """Sleeps config 'seconds' (default 3) before answering."""

        def __init__(self) -> None:
            super().__init__("slow")

        def get_input_sizes(self, config: dict[str, Any]) -> list[int]:
            return [1]

        def get_output_sizes(self, config: dict[str, Any]) -> list[int]:
            return [1]

        def __call__(self, parameters: Any, config: Any = None) -> list[list[float]]:
            time.sleep(float((config or {}).get("seconds", 3.0)))
            return [[parameters[0][0]]]

        def supports_evaluate(self) -> bool:
            return True

    return [GradientOnly(), Square(), EvaluateOnly(), NonFinite(), Broken(), Slow()]


# --- the launcher -------------------------------------------------------------------


def serve_on_loopback(port_file: Path, port: int = 0) -> None:
    import aiohttp.web
    import umbridge

    original = aiohttp.web.run_app

    def run_on_loopback(app: Any, **kwargs: Any) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        tmp.replace(port_file)
        kwargs.pop("port", None)
        kwargs.pop("host", None)
        original(app, sock=sock, print=None, access_log=None, **kwargs)

    aiohttp.web.run_app = run_on_loopback  # type: ignore[assignment]
    umbridge.serve_models(build_models(), port=port, max_workers=4)


class UmbridgePeer:
    """Starts the server in its own process; ``url`` once it listens."""

    def __init__(self, directory: Path, port: int = 0) -> None:
        self.port_file = directory / "umbridge-peer.port"
        self.log_path = directory / "umbridge-peer.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = port  # 0: any free port; after a stop, start() binds the same one again

    def start(self, timeout: float = 30.0) -> UmbridgePeer:
        from support import port_open, wait_for

        self.port_file.unlink(missing_ok=True)
        self._log = open(self.log_path, "ab" if self.proc is not None else "wb")  # a restart appends
        self.proc = subprocess.Popen([sys.executable, str(PEER), str(self.port_file), str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"umbridge peer exited:\n{self.log_path.read_text()}")
            return self.port_file.exists() and port_open(int(self.port_file.read_text()))

        wait_for(ready, timeout, "the umbridge peer to listen")
        self.port = int(self.port_file.read_text())
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        from support import stop_process

        if self.proc is not None:
            stop_process(self.proc)
        self._log.close()

    def __enter__(self) -> UmbridgePeer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


if __name__ == "__main__":
    serve_on_loopback(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
