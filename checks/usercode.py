"""The user's ``MODULE:CALLABLE`` (verify's and plan's ``--model`` / ``--dataset``): import it and check it can
be called with no arguments. Standard library only: the torch children of verify and plan both use it.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from typing import Any


class UserCodeError(Exception):
    """The user's callable cannot be used; the message is the one line the parent prints (exit 2)."""


def load_callable(ref: str, user_path: str) -> Callable[..., Any]:
    """Import ``MODULE:CALLABLE`` (dotted attributes allowed) with ``user_path`` first on sys.path."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise UserCodeError(f"{ref!r} is not MODULE:CALLABLE")
    if user_path not in sys.path:
        sys.path.insert(0, user_path)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # noqa: BLE001 - any import-time failure of user code is the user's to see
        raise UserCodeError(f"cannot load {ref}: {type(exc).__name__}: {exc}") from None
    if not callable(obj):
        raise UserCodeError(f"{ref} is not callable")
    return obj


def required_arguments(factory: Callable[..., Any]) -> list[str]:
    """The parameters a call without arguments would leave unfilled (none when the signature cannot be read)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # some builtins and C extensions have no readable signature
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]
