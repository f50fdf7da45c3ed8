"""The allocator configuration written by ``provision/alloc_env.py`` is live in a fresh login shell.

Writing an export proves nothing: the check starts a new login shell, runs Python in it, and reads the
allocator settings back from torch itself (docs/sources.md#allocator-readback).
"""

from __future__ import annotations

import dataclasses

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.result import Result, fail, ok, skip, warn
from checks.units import MIB


def _options(text: str) -> dict[str, str]:
    pairs = (item.split(":", 1) for item in text.replace(" ", "").split(",") if ":" in item)
    return {k: v for k, v in pairs}


def _matches(key: str, wanted: str, parsed: dict[str, str]) -> bool:
    """Compare one option; the CUDA snapshot reports ``max_split_size`` in bytes where the variable says MB."""
    if key in parsed:
        return parsed[key].casefold() == wanted.casefold()
    if key.endswith("_mb") and key[:-3] in parsed and wanted.isdigit():
        return parsed[key[:-3]] == str(int(wanted) * MIB)  # PyTorch reads max_split_size_mb as MiB
    return False


def alloc_conf(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """PYTORCH_(CUDA_)ALLOC_CONF reaches a fresh Python process and torch parsed it."""
    a = m.alloc
    if a is None:
        return [skip("alloc-conf", "allocator read-back needs the live machine")]
    if a.skipped:
        return [skip("alloc-conf", a.skipped)]
    if not a.applied:
        if a.env_seen is None:
            return [
                warn(
                    "alloc-conf",
                    "no allocator setting in a fresh login shell (preflight.alloc_conf.apply is false)",
                    f"export {a.variable}={a.wanted} in your shell start-up, or set preflight.alloc_conf.apply: true",
                    expected=a.wanted,
                )
            ]
        a = dataclasses.replace(a, wanted=a.env_seen)  # judge the user's own value
    kw = {"value": a.torch_settings or a.env_seen, "expected": a.wanted}
    if a.error:
        return [
            fail(
                "alloc-conf",
                f"{a.variable}={a.wanted} was rejected: {a.error}",
                "fix preflight.alloc_conf.value (see torch's CUDA memory notes)",
                **kw,
            )
        ]
    if a.env_seen != a.wanted:
        seen = "unset" if a.env_seen is None else repr(a.env_seen)
        return [
            fail(
                "alloc-conf",
                f"a fresh login shell sees {a.variable} {seen}, not {a.wanted!r}",
                "another start-up file overrides it, or the shell does not read the files in preflight.alloc_conf.rc_files",
                **kw,
            )
        ]
    if a.torch_settings is None:
        return [
            warn(
                "alloc-conf",
                f"{a.variable}={a.wanted} is exported, but this torch cannot report its parsed settings",
                "torch >= 2.9 reports them; the variable alone is what older torch reads",
                **kw,
            )
        ]
    parsed = _options(a.torch_settings)
    missing = {k: v for k, v in _options(a.wanted).items() if not _matches(k, v, parsed)}
    if missing:
        return [
            fail(
                "alloc-conf",
                f"torch parsed {a.torch_settings!r}, missing {missing}",
                "torch ignored part of the value: check the option names for this torch version",
                **kw,
            )
        ]
    return [
        ok(
            "alloc-conf",
            f"{a.variable}={a.wanted} is live in a fresh login shell (torch reads back {a.torch_settings!r} via {a.source})",
            **kw,
        )
    ]
