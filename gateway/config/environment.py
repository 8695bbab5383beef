"""``${VAR}`` substitution over the parsed YAML tree, before any section reads it.

A scalar that is exactly one reference is typed by the field that reads
it (node.EnvText); problems quote substituted strings as written, since
the environment may hold secrets.
"""

from __future__ import annotations

import os
import re
from typing import Any

from gateway.config.node import EnvText, type_scalar

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\$")


def expand_env(text: str, path: str, problems: list[str], env: dict[str, str] | None = None) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}``; ``$$`` is a literal ``$``."""
    source = os.environ if env is None else env

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        value = source.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                problems.append(f"{path}: environment variable {name} is not set")
                return ""
            return default
        return value

    return _ENV_REF.sub(replace, text)


def is_single_env_ref(text: str) -> bool:
    """``text`` is one ``${VAR}`` or ``${VAR:-default}`` and nothing else."""
    match = _ENV_REF.fullmatch(text)
    return match is not None and match.group(1) is not None


def expand_tree(value: Any, path: str, problems: list[str], texts: dict[str, tuple[str, str]]) -> Any:
    """Substitute ``${VAR}`` in every string. A scalar that is exactly one
    reference becomes an EnvText (typed by the field that reads it), or None
    when it reads as YAML's null. ``texts`` collects path -> (result, written
    text) of substituted strings."""
    if isinstance(value, str):
        if "$" not in value:
            return value
        known = len(problems)
        expanded = str(expand_env(value, path, problems))
        if not is_single_env_ref(value):
            texts[path] = (expanded, value)
            return expanded
        if len(problems) > known or type_scalar(expanded) is None:
            return None  # as if absent; when unset, only "is not set" is reported, not also a type error
        texts[path] = (expanded, value)
        return EnvText(expanded)
    if isinstance(value, list):
        return [expand_tree(v, f"{path}[{i}]", problems, texts) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: expand_tree(v, f"{path}.{k}" if path else str(k), problems, texts)
                for k, v in value.items()}
    return value


def shown_as_written(problems: list[str], texts: dict[str, tuple[str, str]]) -> list[str]:
    """Problems that quote a substituted string show it as written
    (``'${TOKEN}'``): the environment may hold secrets."""
    if not texts:
        return problems
    shown = []
    for problem in problems:
        where = problem.split(": ", 1)[0]
        for path, (expanded, written) in texts.items():  # the value's own problem, or its mapping's
            if path == where or path.startswith((where + ".", where + "[")):
                problem = problem.replace(repr(expanded), repr(written))
        shown.append(problem)
    return shown
