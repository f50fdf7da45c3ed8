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


NO_GPU = "no NVIDIA GPU visible (see driver)"
GPU_IDS = ("gpu-power", "gpu-pcie", "gpu-ecc", "gpu-mig")


def no_gpu_box(torch_missing: bool) -> Report:
    driver = fail("driver", "NVML could not load", "install the driver", value={"error_kind": "library-not-found"})
    torch = (
        fail("torch-build", "torch is not installed in this Python", "pip install torch --index-url https://x/cpu")
        if torch_missing
        else ok("torch-build", "torch 2.13.0+cpu")
    )
    skips = [skip(i, NO_GPU) for i in GPU_IDS]
    return Report("box", "live", (driver, *skips, torch, skip("gpu-p2p", "fewer than two GPUs"), ok("ram", "24 GiB")))


def test_skips_sharing_a_reason_are_one_line_and_every_row_brings_them_back() -> None:
    report = no_gpu_box(torch_missing=False)
    text = render_text(report)
    grouped = [line for line in text.splitlines() if NO_GPU in line]
    assert len(grouped) == 1 and "4 skipped" in grouped[0] and all(i in grouped[0] for i in GPU_IDS)
    assert "gpu-p2p" in text and "fewer than two GPUs" in text  # a reason of its own keeps its row
    full = render_text(report, every_row=True)
    assert sum(NO_GPU in line for line in full.splitlines()) == len(GPU_IDS)


def test_background_rows_are_counted_unless_they_need_a_look() -> None:
    report = Report(
        "box",
        "live",
        (ok("ram", "24 GiB"), skip("gpu-pcie", NO_GPU), warn("ulimits", "open files 20000", "raise it"),
         ok("diagnosis", "compute-bound: the math takes 95%", hint="bf16 autocast")),
    )  # fmt: skip
    text = render_text(report, background=frozenset({"ram", "gpu-pcie", "ulimits"}), focus="diagnosis")
    assert "1 ok, 1 skip" in text and "24 GiB" not in text and NO_GPU not in text
    assert "ulimits" in text and "open files 20000" in text  # bootstrap's warn still shows
    assert text.rstrip().endswith("next: diagnosis: bf16 autocast")  # the verdict, not bootstrap's ulimits warn
    assert "24 GiB" in render_text(report, every_row=True, background=frozenset({"ram"}))


def test_a_box_without_any_driver_and_without_torch_is_told_to_install_torch_first() -> None:
    assert call_to_action(no_gpu_box(torch_missing=True)).startswith("next: fix torch-build: pip install torch")
    # with torch there, the driver is the failure to fix
    assert call_to_action(no_gpu_box(torch_missing=False)).startswith("next: fix driver")
    broken = Report(
        "box", "live", (fail("driver", "driver/library version mismatch", "reboot"), no_gpu_box(True).results[-3])
    )
    assert call_to_action(broken).startswith("next: fix driver")  # a GPU box with a broken driver: driver first


def test_a_report_of_one_part_of_the_box_never_says_the_box_is_ready() -> None:
    alloc = Report("h", "live", (ok("alloc-conf", "PYTORCH_CUDA_ALLOC_CONF is set in ~/.bashrc"),))
    assert call_to_action(alloc) == "next: nothing to fix here (invoke bootstrap judges the whole box)"
    whole = Report("h", "live", (ok("driver", "driver 570"), ok("alloc-conf", "set")))
    assert call_to_action(whole) == "next: nothing to fix; this box is ready to train"
