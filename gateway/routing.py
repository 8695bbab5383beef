"""Route matching: pure functions over the frozen config, no I/O."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.config import GatewayConfig, RouteConfig, StringMatch


def compile_match(match: StringMatch) -> Callable[[str | None], bool]:
    if match.kind == "present":
        return lambda value: value is not None
    if match.kind == "exact":
        return lambda value: value == match.pattern
    if match.kind == "glob":
        regex = re.compile(fnmatch.translate(match.pattern))
    else:
        regex = re.compile(match.pattern)
    return lambda value: value is not None and regex.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Route:
    index: int
    config: RouteConfig
    _model: Callable[[str | None], bool]
    _version: Callable[[str | None], bool] | None
    _headers: tuple[tuple[str, Callable[[str | None], bool]], ...]

    @property
    def upstream(self) -> str:
        return self.config.upstream

    def matches(self, model: str, version: str, listener: str, protocol: str,
                headers: Mapping[str, str]) -> bool:
        match = self.config.match
        if match.listener is not None and match.listener != listener:
            return False
        if match.protocol is not None and match.protocol != protocol:
            return False
        if not self._model(model):
            return False
        if self._version is not None and not self._version(version):
            return False
        return all(test(headers.get(name)) for name, test in self._headers)

    def describe(self) -> str:
        m = self.config.match
        parts = [f"model={m.model.describe()}"]
        if m.version:
            parts.append(f"version={m.version.describe()}")
        if m.listener:
            parts.append(f"listener={m.listener}")
        if m.protocol:
            parts.append(f"protocol={m.protocol}")
        parts += [f"header[{name}]={h.describe()}" for name, h in m.headers]
        action = f"-> {self.config.upstream}"
        rw = self.config.rewrite
        if rw.model or rw.version:
            action += f" (rewrite model={rw.model or '='} version={rw.version or '='})"
        if self.config.timeout is not None:
            action += f" timeout={self.config.timeout:g}s"
        return f"#{self.index} " + " ".join(parts) + " " + action


class RouteTable:
    """Ordered routes; the first match wins. Frozen; replaced whole on reload."""

    def __init__(self, config: GatewayConfig) -> None:
        self.routes = tuple(
            Route(i, rc, compile_match(rc.match.model),
                  compile_match(rc.match.version) if rc.match.version else None,
                  tuple((name, compile_match(h)) for name, h in rc.match.headers))
            for i, rc in enumerate(config.routes)
        )

    def resolve(self, model: str, version: str, listener: str, protocol: str,
                headers: Mapping[str, str]) -> Route | None:
        for route in self.routes:
            if route.matches(model, version, listener, protocol, headers):
                return route
        return None

    def explicit_models(self, listener: str | None = None) -> list[str]:
        """Model names routes spell out exactly (used to list models)."""
        names: list[str] = []
        for route in self.routes:
            m = route.config.match
            if listener is not None and m.listener not in (None, listener):
                continue
            if m.model.kind == "exact" and m.model.pattern not in names:
                names.append(m.model.pattern)
        return names

    def describe(self) -> list[str]:
        return [route.describe() for route in self.routes]
