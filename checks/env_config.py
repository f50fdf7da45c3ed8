"""Moved to ``checks.cli`` (the one module of Invoke hooks); kept until tests/checks/test_config.py imports from there."""

from __future__ import annotations

from checks.cli import PREFIX, check_env_overrides, env_names

__all__ = ["PREFIX", "check_env_overrides", "env_names"]
