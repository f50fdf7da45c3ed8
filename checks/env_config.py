"""Validate ``INVOKE_PREFLIGHT_*`` environment variables before Invoke casts them.

Invoke maps ``INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTION`` onto ``preflight.gpu.power_min_fraction`` and casts
the string to the default's type: a bad number would end in a traceback, an unknown name is silently
ignored, and a boolean is true for any value but "0" and "" (so "false" would mean true). Catch all three
first with a one-line error.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any

from checks.errors import PreflightError

PREFIX = "INVOKE_PREFLIGHT_"


def _leaves(tree: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def env_names(defaults: dict[str, Any]) -> dict[str, tuple[tuple[str, ...], Any]]:
    """Every valid variable name -> (key path, default)."""
    return {PREFIX + "_".join(p).upper(): (p, v) for p, v in _leaves(defaults)}


def _check_value(name: str, path: tuple[str, ...], default: Any, raw: str) -> None:
    key = "preflight." + ".".join(path)
    if isinstance(default, bool):
        if raw not in ("0", "1", ""):
            raise PreflightError(
                f"{name}={raw!r} for {key}: use 1 or 0", hint="Invoke reads every value except '0' and '' as true"
            )
    elif isinstance(default, (list, tuple)):
        raise PreflightError(f"{name} cannot set the list {key}", hint="set it in invoke.yaml or a -f FILE instead")
    elif isinstance(default, (int, float)):
        try:
            type(default)(raw)
        except ValueError:
            kind = "an integer" if isinstance(default, int) else "a number"
            raise PreflightError(f"{name}={raw!r} for {key} must be {kind}", hint=f"default: {default!r}") from None


def check_env_overrides(environ: Mapping[str, str], defaults: dict[str, Any]) -> None:
    """Raise ``PreflightError`` (exit 2) for the first unknown or uncastable ``INVOKE_PREFLIGHT_*`` variable."""
    names = env_names(defaults)
    for name in sorted(k for k in environ if k.startswith(PREFIX)):
        if name not in names:
            close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "see templates/defaults.yaml for the keys"
            raise PreflightError(f"unknown configuration variable {name}", hint=hint)
        path, default = names[name]
        _check_value(name, path, default, environ[name])
