from __future__ import annotations

import io

import pytest

from checks.render import call_to_action, render_text, use_colour
from checks.result import REPORT_SCHEMA, Report, Result, Status, fail, ok, skip, warn

RESULTS = (
    ok("driver", "driver 570", value={"gpus": 1}),
    warn("gpu-power", "capped at 250 W", "raise the limit", subject="gpu0", value=250.0),
    skip("gpu-h2d", "no GPU"),
)


def test_counts_cover_every_status() -> None:
    counts = Report("h", "live", RESULTS).counts()
    assert counts == {"ok": 1, "warn": 1, "fail": 0, "skip": 1, "error": 0}


@pytest.mark.parametrize(
    ("extra", "strict", "code"),
    [
        ((), False, 0),
        ((), True, 1),
        ((fail("shm", "64 MiB", "grow it"),), False, 1),
        ((Result("gpu-ecc", Status.ERROR, "crashed"),), False, 1),
    ],
)
def test_exit_codes(extra: tuple[Result, ...], strict: bool, code: int) -> None:
    assert Report("h", "live", RESULTS + extra).exit_code(strict=strict) == code


def test_json_report_has_the_documented_shape() -> None:
    doc = Report("h", "live", RESULTS, {"dataloader": {"num_workers": 3}}).to_json()
    assert doc["schema"] == REPORT_SCHEMA == 1
    assert doc["tool"].startswith("gpu-preflight ")
    assert set(doc) == {"schema", "tool", "host", "machine", "counts", "results", "measurements"}
    first = doc["results"][1]
    assert set(first) == {"id", "status", "summary", "value", "expected", "hint", "subject", "duration_s"}
    assert first["status"] == "warn" and first["subject"] == "gpu0" and first["hint"] == "raise the limit"


def test_text_has_one_line_per_result_and_hints_only_under_non_ok() -> None:
    text = render_text(Report("box", "live", (*RESULTS, ok("ram", "fine", hint="never shown"))))
    lines = text.splitlines()
    assert lines[0] == "gpu-preflight: box (live)"
    assert sum("gpu-power[gpu0]" in line for line in lines) == 1
    assert any(line.strip() == "hint: raise the limit" for line in lines)
    assert "never shown" not in text
    assert "1 warn" in text and "2 ok" in text
    assert "\033[" not in text


def test_colour_only_when_asked() -> None:
    assert "\033[33mWARN" in render_text(Report("box", "live", RESULTS), colour=True)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_use_colour_needs_a_tty_and_respects_no_color() -> None:
    assert use_colour(_Tty(), {}) is True
    assert use_colour(_Tty(), {"NO_COLOR": "1"}) is False
    assert use_colour(_Tty(), {"NO_COLOR": ""}) is True  # no-color.org: only a non-empty value counts
    assert use_colour(io.StringIO(), {}) is False


def test_call_to_action_points_at_the_first_failure_before_warnings() -> None:
    report = Report("h", "live", (*RESULTS, fail("shm", "64 MiB", "docker run --shm-size=16g")))
    assert call_to_action(report) == "next: fix shm: docker run --shm-size=16g"
    assert call_to_action(Report("h", "live", RESULTS)).startswith("next: fix gpu-power on gpu0")
    assert "ready" in call_to_action(Report("h", "live", (RESULTS[0],)))
