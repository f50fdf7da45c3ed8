"""Tests of the Invoke tasks: end to end as a user runs them (``python -m invoke ...`` from the checkout), and
in-process (``here``: the same argv through checks.cli.program's PreflightProgram over tasks.ns) where a process is not the point.

Every child (and every in-process run) gets a temporary HOME (bootstrap writes the allocator block into ~/.bashrc and ~/.profile) and an
environment without inherited ``INVOKE_PREFLIGHT_*`` / ``PYTORCH_*ALLOC_CONF`` variables. This box has no
NVIDIA driver and a CPU build of torch; GPU machines are replayed from snapshots. A fake ``torch`` package on
PYTHONPATH makes the torch probe hang, crash or go missing on demand.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tasks
from checks.cli.program import INPUT_FLAGS
from checks.probe.host import nvidia_gpu_count
from tests.fakes.cli import REPO, Here, Run, assert_usage_error, by_id, child_env, default_sigint, invoke, pid_gone
from tests.waiting import until

pytestmark = pytest.mark.slow

FIXTURES = REPO / "tests" / "fixtures" / "machines"
RC_FILES = (".bashrc", ".profile")
BEGIN = "# >>> gpu-preflight: allocator settings >>>"
END = "# <<< gpu-preflight: allocator settings <<<"
RESULT_KEYS = {"id", "status", "summary", "value", "expected", "hint", "subject", "duration_s"}
STATUSES = {"ok", "warn", "fail", "skip", "error"}
HOST_CHECKS = ("driver", "torch-build", "cpu-cores", "ram", "shm", "ulimits", "dataloader-advice")
BENCH_CHECKS = ("gpu-h2d", "gpu-d2h", "gpu-d2d", "gpu-matmul")
ANSI = "\x1b["
GIB = 1024**3


# --- running invoke: tests/fakes/cli.py ---------------------------------------------------------------------


def statuses(report: dict[str, Any], ids: tuple[str, ...]) -> dict[str, str]:
    found = by_id(report)
    return {i: found[i]["status"] for i in ids}


def rc_bytes(home: Path) -> dict[str, bytes | None]:
    return {name: (home / name).read_bytes() if (home / name).exists() else None for name in RC_FILES}


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text + "\n", encoding="utf-8")
    return path


# --- machines -----------------------------------------------------------------------------------------------


def capped_rtx4090() -> dict[str, Any]:
    """A hand-written healthy one-GPU box whose only problem is a power cap (250 W of 450 W): one warning."""
    gpu = {
        "index": 0,
        "name": "NVIDIA GeForce RTX 4090",
        "brand": "geforce-rtx",
        "compute_capability": [8, 9],
        "memory_total": 24 * GIB,
        "memory_used": 400 * 1024**2,
        "power_limit_mw": 250_000,
        "power_default_limit_mw": 450_000,
        "power_enforced_limit_mw": 250_000,
        "pcie_gen_max": 4,
        "pcie_gen_gpu_max": 4,
        "pcie_width_max": 16,
        "nvlink_total": 0,
        "nvlink_active": 0,
        "clock_event_reasons": 0,
        "persistence_mode": True,
        "compute_mode": 0,
        "processes": [],
    }
    torch = {
        "version": "2.7.1+cu128",
        "cuda": "12.8",
        "arch_list": ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"],
        "cudnn_version": 90701,
        "cudnn_compiled_version": "9.7.1",
        "nccl_version": "2.26.2",
        "cuda_available": True,
        "device_count": 1,
    }
    host = {
        "hostname": "rtx-box",
        "cpu_logical": 16,
        "cpu_affinity": 16,
        "mem_total": 64 * GIB,
        "shm_total": 32 * GIB,
        "nofile_soft": 1_048_576,
        "nofile_hard": 1_048_576,
        "memlock_soft": -1,
        "memlock_hard": -1,
    }
    nvml = {"driver_version": "570.124.06", "cuda_driver_version": 12080, "gpus": [gpu]}
    return {
        "snapshot": 1,
        "recorded": False,
        "description": "hand-written: one RTX 4090 capped at 250 W, nothing else wrong",
        "machine": {"nvml": nvml, "torch": torch, "host": host},
    }


@pytest.fixture
def capped(tmp_path: Path) -> Path:
    return write_json(tmp_path / "capped-4090.json", capped_rtx4090())


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


FORCE_ALLOC = {"INVOKE_PREFLIGHT_ALLOC_CONF_WITHOUT_GPU": "1"}


@dataclass(frozen=True)
class Live:
    """Two live ``bootstrap --json -`` runs in one fresh HOME, and the shell files after the first."""

    home: Path
    first: Run
    second: Run
    files_after_first: dict[str, bytes | None]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Live:
    home = tmp_path_factory.mktemp("live-home")
    first = invoke(home, "bootstrap", "--json", "-", env=FORCE_ALLOC)  # this box has no GPU: the write is forced
    files = rc_bytes(home)
    second = invoke(home, "bootstrap", "--json", "-", env=FORCE_ALLOC)
    return Live(home, first, second, files)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``invoke snapshot --out`` of this machine."""
    home = tmp_path_factory.mktemp("snapshot-home")
    out = tmp_path_factory.mktemp("snapshots") / "x.json"
    run = invoke(home, "snapshot", "--out", str(out), "--description", "the test box")
    assert run.code == 0, run.why()
    assert run.out.startswith(f"wrote {out}: 0 GPU(s)"), run.why()
    assert rc_bytes(home) == {".bashrc": None, ".profile": None}
    return out


def derived(src: Path, dst: Path, **host: Any) -> Path:
    """A copy of snapshot ``src`` with some host facts replaced."""
    doc = json.loads(src.read_text(encoding="utf-8"))
    doc["machine"]["host"].update(host)
    return write_json(dst, doc)


def fake_torch(root: Path, body: str) -> Path:
    """A directory holding a ``torch`` package whose import runs ``body``; put it on PYTHONPATH."""
    package = root / "fake-torch" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body, encoding="utf-8")
    return package.parent


# A torch whose import hangs (like a broken CUDA install): it writes its PID to $FAKE_TORCH_PID first.
HANGING_TORCH = """\
import os, time
with open(os.environ["FAKE_TORCH_PID"] + ".tmp", "w") as fh:
    fh.write(str(os.getpid()))
os.replace(os.environ["FAKE_TORCH_PID"] + ".tmp", os.environ["FAKE_TORCH_PID"])
time.sleep(60)  # the hang
"""


# --- 1. live bootstrap on this CPU box ----------------------------------------------------------------------


# This box's PCI bus as the probe reads it: a CPU machine (no NVIDIA GPU on the bus) gets a driver skip, a GPU box
# without a usable driver a fail. The test box has no driver either way.
NVIDIA_ON_BUS = bool(nvidia_gpu_count(Path("/")))


def exit_code_of(run: Run) -> int:
    """What bootstrap must exit with for its own report: 1 when a row failed, else 0."""
    return 1 if run.report()["counts"]["fail"] else 0


def test_live_bootstrap_exits_by_its_rows_within_a_minute(live: Live) -> None:
    assert live.first.code == exit_code_of(live.first), live.first.why()
    assert "Traceback" not in live.first.err
    assert live.first.seconds < 60


def test_live_json_report_follows_schema_1(live: Live) -> None:
    report = live.first.report()
    assert report["schema"] == 1
    assert {"tool", "host", "machine", "counts", "results", "measurements"} <= set(report)
    assert report["tool"].startswith("gpu-preflight ")
    assert report["machine"] == "live"
    assert set(report["counts"]) == STATUSES
    assert sum(report["counts"].values()) == len(report["results"])
    for result in report["results"]:
        assert set(result) == RESULT_KEYS, result
        assert result["status"] in STATUSES, result
        assert isinstance(result["summary"], str) and result["summary"], result
        assert isinstance(result["duration_s"], (int, float)), result
    assert "dataloader" in report["measurements"]


def test_live_no_driver_is_judged_by_the_bus_and_skips_gpu_checks(live: Live) -> None:
    results = by_id(live.first.report())
    if NVIDIA_ON_BUS:
        assert results["driver"]["status"] == "fail" and results["driver"]["hint"]
    else:  # a CPU machine by design: no driver is no fault
        assert results["driver"]["status"] == "skip" and "a CPU machine" in results["driver"]["summary"]
    gpu_ids = [i for i in results if i.startswith("gpu-")]
    assert set(BENCH_CHECKS) <= set(gpu_ids)
    for check_id in gpu_ids:
        assert results[check_id]["status"] == "skip", results[check_id]
        assert results[check_id]["summary"], results[check_id]


def test_live_host_checks_are_judged(live: Live) -> None:
    results = by_id(live.first.report())
    for check_id in ("cpu-cores", "ram", "shm"):
        assert results[check_id]["status"] in {"ok", "warn", "fail"}, results[check_id]
        assert results[check_id]["value"] is not None, results[check_id]
    assert results["torch-build"]["status"] == "ok"


def test_live_alloc_conf_is_read_back_from_a_fresh_login_shell(live: Live) -> None:
    alloc = by_id(live.first.report())["alloc-conf"]
    assert alloc["status"] == "ok", alloc
    assert "expandable_segments:True" in alloc["summary"] and "torch reads back" in alloc["summary"]
    changes = live.first.report()["measurements"]["alloc_conf_changes"]
    assert changes == [f"wrote allocator settings to {live.home / name}" for name in RC_FILES]


def test_live_bootstrap_writes_the_block_once_into_each_shell_file(live: Live) -> None:
    for name, data in live.files_after_first.items():
        assert data is not None, name
        text = data.decode()
        assert text.count(BEGIN) == 1 and text.count(END) == 1, text
        assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" in text


def test_live_human_text_goes_to_stderr(live: Live) -> None:
    err = live.first.err
    assert "gpu-preflight: " in err and "(live)" in err
    if NVIDIA_ON_BUS:
        assert re.search(r"^\s+FAIL\s+driver\b", err, re.MULTILINE), err
        assert "next: fix driver" in err
    else:  # the CPU machine's driver skip is no call to action
        assert "next: fix driver" not in err and re.search(r"^next: ", err, re.MULTILINE), err
    assert "wrote allocator settings to" in err
    assert ANSI not in err + live.first.out


def test_live_bootstrap_says_what_the_current_shell_needs_and_that_line_works(live: Live) -> None:
    line = next(x for x in live.first.err.splitlines() if x.startswith("this shell does not have it yet"))
    export = re.search(r"run `(export [^`]+)` or `source (\S+)`", line)
    assert export and export.group(2) == str(live.home / ".bashrc"), line
    for command in (export.group(1), f"source {export.group(2)}"):  # pasted into a shell without the setting
        env = child_env(live.home)
        shown = subprocess.run(["bash", "--norc", "--noprofile", "-c", f"{command}; echo $PYTORCH_CUDA_ALLOC_CONF"],
                               env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert shown.strip() == "expandable_segments:True", (command, shown)
    assert "this shell" not in live.second.err  # nothing written the second time: nothing to say


def test_live_bootstrap_without_a_gpu_writes_no_cuda_setting(home: Path) -> None:
    run = invoke(home, "bootstrap", "--no-bench", "--json", "-")
    assert rc_bytes(home) == {".bashrc": None, ".profile": None}, run.why()
    alloc = by_id(run.report())["alloc-conf"]
    assert alloc["status"] == "skip" and alloc["summary"].startswith("no NVIDIA GPU here (no driver library"), alloc
    assert "preflight.alloc_conf.without_gpu: true" in alloc["summary"] and "wrote" not in run.err


# --- 2. idempotence, --dry-run, alloc-conf --undo -----------------------------------------------------------


def test_second_bootstrap_changes_nothing(live: Live) -> None:
    assert live.second.code == live.first.code, live.second.why()
    assert rc_bytes(live.home) == live.files_after_first
    report = live.second.report()
    assert "alloc_conf_changes" not in report["measurements"]
    assert by_id(report)["alloc-conf"]["status"] == "ok"
    assert "wrote allocator settings" not in live.second.err


def test_dry_run_writes_nothing_and_prints_the_diff(home: Path) -> None:
    bashrc = home / ".bashrc"
    bashrc.write_text("# my settings\nexport EDITOR=vim\n", encoding="utf-8")
    before = rc_bytes(home)
    run = invoke(home, "bootstrap", "--dry-run", "--json", "-", env=FORCE_ALLOC)
    assert run.code == exit_code_of(run), run.why()
    assert rc_bytes(home) == before
    assert not (home / ".profile").exists()
    leftovers = [p.name for p in home.iterdir() if p.name.startswith((".bashrc", ".profile"))]
    assert leftovers == [".bashrc"]  # no temporary siblings either
    assert f"--- {bashrc} (now)" in run.err and f"+++ {bashrc} (after)" in run.err
    assert f"+++ {home / '.profile'} (after)" in run.err
    assert "+export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in run.err
    alloc = by_id(run.report())["alloc-conf"]
    assert alloc["status"] == "skip" and "dry run" in alloc["summary"], alloc


USER_BASHRC = "# ~/.bashrc: the user's own\nexport PATH=$HOME/bin:$PATH\nalias ll='ls -l'\n"


def test_alloc_conf_applies_then_undo_restores_the_users_file(home: Path) -> None:
    (home / ".bashrc").write_text(USER_BASHRC, encoding="utf-8")
    applied = invoke(home, "alloc-conf")
    assert applied.code == 0, applied.why()
    assert f"wrote allocator settings to {home / '.bashrc'}" in applied.out
    assert re.search(r"^\s+OK\s+alloc-conf\b", applied.out, re.MULTILINE), applied.why()
    with_block = rc_bytes(home)
    assert with_block[".bashrc"] is not None and with_block[".bashrc"].decode().startswith(USER_BASHRC)

    preview = invoke(home, "alloc-conf", "--undo", "--dry-run")
    assert preview.code == 0, preview.why()
    assert rc_bytes(home) == with_block
    assert f"-{BEGIN}" in preview.out

    undone = invoke(home, "alloc-conf", "--undo")
    assert undone.code == 0, undone.why()
    assert f"removed the allocator block from {home / '.bashrc'}" in undone.out
    assert (home / ".bashrc").read_text(encoding="utf-8") == USER_BASHRC
    assert not (home / ".profile").exists()  # alloc-conf created it, so the undo deletes it again

    again = invoke(home, "alloc-conf", "--undo")
    assert again.code == 0 and again.out.startswith("nothing to remove"), again.why()


def test_undo_restores_a_file_without_final_newline(home: Path) -> None:
    """The block is written by alloc-conf's own writer, with the value and variables alloc-conf picks for the torch
    installed here (the whole ``invoke alloc-conf`` round trip, its two torch children included, is the test above)."""
    from importlib.metadata import version

    from provision.alloc_env import choose_value, ensure_alloc_conf, variables_for

    original = b"export EDITOR=vim"  # no trailing newline
    (home / ".bashrc").write_bytes(original)
    torch_version = version("torch")
    written = ensure_alloc_conf(
        [home / n for n in RC_FILES], choose_value("", torch_version), variables_for(torch_version)
    )
    assert [c.path for c in written] == [home / n for n in RC_FILES]
    assert (home / ".bashrc").read_bytes().startswith(original + b"\n") and BEGIN in (home / ".bashrc").read_text()
    assert invoke(home, "alloc-conf", "--undo").code == 0
    assert (home / ".bashrc").read_bytes() == original
    assert not (home / ".profile").exists()


def read_only_run(home: Path, *args: str) -> Run:
    """``invoke ARGS`` with ``home`` bind-mounted read-only in a private mount namespace (root ignores file modes,
    not a read-only mount); skipped where ``unshare -m`` is not allowed."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    mount = f"mount --bind {home} {home} && mount -o remount,bind,ro {home}"
    script = f"{mount} && exec {shlex.join([sys.executable, '-m', 'invoke', *args])}"
    start = time.monotonic()
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          cwd=REPO, env=child_env(home), capture_output=True, text=True, timeout=120)  # fmt: skip
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip(f"mount namespaces are not allowed here: {proc.stderr.strip()}")
    return Run(tuple(args), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def test_alloc_conf_in_a_read_only_home_is_one_line_naming_the_file(home: Path) -> None:
    (home / ".bashrc").write_text(USER_BASHRC, encoding="utf-8")
    before = sorted(home.iterdir())
    line = assert_usage_error(read_only_run(home, "alloc-conf"), f"cannot write {home / '.bashrc'}", "rc_files")
    assert "Read-only file system" in line and "export PYTORCH_CUDA_ALLOC_CONF=" in line, line
    assert sorted(home.iterdir()) == before and (home / ".bashrc").read_text(encoding="utf-8") == USER_BASHRC
    from provision.alloc_env import ensure_alloc_conf  # the undo in a read-only HOME: a block to take out first

    ensure_alloc_conf([home / ".bashrc"], "expandable_segments:True", ("PYTORCH_CUDA_ALLOC_CONF",))
    with_block = rc_bytes(home)
    line = assert_usage_error(read_only_run(home, "alloc-conf", "--undo"), f"cannot write {home / '.bashrc'}")
    assert "--undo" in line and rc_bytes(home) == with_block, line


# --- 3. --json PATH ----------------------------------------------------------------------------------------


def test_json_path_writes_the_file_and_text_to_stdout(here: Here, home: Path, tmp_path: Path, capped: Path) -> None:
    target = tmp_path / "reports" / "nested" / "report.json"
    run = here(home, "bootstrap", "--machine", str(capped), "--json", str(target))
    assert run.code == 0, run.why()
    report = json.loads(target.read_text(encoding="utf-8"))
    assert report["schema"] == 1 and report["host"] == "rtx-box"
    assert run.out.startswith("gpu-preflight: rtx-box (snapshot capped-4090.json)"), run.why()
    assert run.err == ""
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]  # the temporary sibling is gone


def test_json_path_that_cannot_be_written_is_a_usage_error(
    here: Here, home: Path, tmp_path: Path, capped: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n", encoding="utf-8")
    run = here(home, "bootstrap", "--machine", str(capped), "--json", str(blocker / "sub" / "report.json"))
    assert_usage_error(run, "cannot write the JSON report", str(blocker / "sub" / "report.json"))


# --- 4. --machine snapshots ---------------------------------------------------------------------------------


def test_replayed_snapshot_judges_the_host_like_live(here: Here, live: Live, recorded: Path, home: Path) -> None:
    run = here(home, "bootstrap", "--machine", str(recorded), "--json", "-")
    assert run.code == live.first.code, run.why()
    report = run.report()
    assert report["machine"] == "snapshot x.json (recorded)"
    assert report["host"] == live.first.report()["host"]
    assert statuses(report, HOST_CHECKS) == statuses(live.first.report(), HOST_CHECKS)
    results = by_id(report)
    for check_id in (*BENCH_CHECKS, "alloc-conf"):
        assert results[check_id]["status"] == "skip", results[check_id]
        assert "snapshot" in results[check_id]["summary"], results[check_id]
    assert rc_bytes(home) == {".bashrc": None, ".profile": None}  # a replay writes no shell files


def test_replayed_gpu_snapshot_skips_what_needs_the_live_machine(here: Here, home: Path, capped: Path) -> None:
    run = here(home, "bootstrap", "--machine", str(capped), "--json", "-")
    assert run.code == 0, run.why()
    results = by_id(run.report())
    assert results["driver"]["status"] == "ok"
    assert results["gpu-power[gpu0]"]["status"] == "warn"
    for check_id in (*BENCH_CHECKS, "alloc-conf"):
        assert results[check_id]["status"] == "skip" and "snapshot" in results[check_id]["summary"]


def _snapshot_with(recorded: Path, change: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(recorded.read_text(encoding="utf-8"))
    if change == "future-format":
        doc["snapshot"] = 99
    elif change == "unknown-field":
        doc["machine"]["host"]["gpus_per_node"] = 8
    elif change == "wrong-type":
        doc["machine"]["host"]["cpu_logical"] = "many"
    elif change == "bootstrap-report":
        doc = {"schema": 1, "machine": "live", "results": []}
    return doc


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ("future-format", ("format 99", "newer than this tool")),
        ("unknown-field", ("machine.host", "unknown key 'gpus_per_node'")),
        ("wrong-type", ("machine.host.cpu_logical", "expected int")),
        ("bootstrap-report", ("is this a bootstrap report instead?",)),
    ],
)
def test_bad_snapshot_is_a_one_line_usage_error(
    here: Here, recorded: Path, home: Path, tmp_path: Path, change: str, needles: tuple[str, ...]
) -> None:
    path = write_json(tmp_path / f"{change}.json", _snapshot_with(recorded, change))
    assert_usage_error(here(home, "bootstrap", "--machine", str(path)), *needles)


def test_missing_snapshot_is_a_usage_error(here: Here, home: Path, tmp_path: Path) -> None:
    run = here(home, "bootstrap", "--machine", str(tmp_path / "nope.json"))
    assert_usage_error(run, "does not exist", "invoke snapshot --out")


def test_snapshot_that_is_not_json_is_a_usage_error(here: Here, home: Path, tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    path.write_text("driver 570, 8x H100\n", encoding="utf-8")
    assert_usage_error(here(home, "bootstrap", "--machine", str(path)), "is not JSON", "line 1")


def test_snapshot_that_is_a_directory_is_a_usage_error(here: Here, home: Path, tmp_path: Path) -> None:
    assert_usage_error(here(home, "bootstrap", "--machine", str(tmp_path)), "cannot be read")


def test_snapshot_that_is_not_utf8_is_a_usage_error(here: Here, home: Path, tmp_path: Path) -> None:
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe{\x00}\x00")
    assert_usage_error(here(home, "bootstrap", "--machine", str(path)), str(path))


def test_snapshot_version_true_is_refused(here: Here, recorded: Path, home: Path, tmp_path: Path) -> None:
    doc = json.loads(recorded.read_text(encoding="utf-8"))
    doc["snapshot"] = True
    path = write_json(tmp_path / "bool-version.json", doc)
    assert_usage_error(here(home, "bootstrap", "--machine", str(path)), "'snapshot' version")


def test_snapshot_without_out_is_a_usage_error(here: Here, home: Path) -> None:
    assert_usage_error(here(home, "snapshot"), "--out")


# --- 5. configuration errors and overrides ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "needles"),
    [
        (
            "preflight: {gpu: {power_min_fractoin: 0.8}}",
            ("preflight.gpu.power_min_fractoin", "did you mean preflight.gpu.power_min_fraction?"),
        ),
        ("preflight: {hostt: {nofile_min: 1}}", ("preflight.hostt", "did you mean preflight.host?")),
        ('preflight: {gpu: {power_min_fraction: "high"}}', ("preflight.gpu.power_min_fraction", "a number", "'high'")),
        ("preflight: {host: {nofile_min: true}}", ("preflight.host.nofile_min", "an integer")),
    ],
    ids=["typo-key", "typo-section", "wrong-type", "bool-for-int"],
)
def test_bad_config_file_is_a_one_line_usage_error(
    here: Here, home: Path, tmp_path: Path, capped: Path, yaml_text: str, needles: tuple[str, ...]
) -> None:
    config = write_yaml(tmp_path / "invoke.yaml", yaml_text)
    run = here(home, "-f", str(config), "bootstrap", "--machine", str(capped))
    assert_usage_error(run, *needles)


def test_a_config_file_that_does_not_exist_is_a_usage_error(home: Path, tmp_path: Path, capped: Path) -> None:
    missing = tmp_path / "invoke.yml"  # Invoke alone would run with the defaults and not say so
    assert_usage_error(invoke(home, "-f", str(missing), "bootstrap", "--machine", str(capped)), f"{missing} does not")
    run = invoke(home, "bootstrap", "--machine", str(capped), INVOKE_RUNTIME_CONFIG=str(missing))
    assert_usage_error(run, "does not exist", "INVOKE_RUNTIME_CONFIG")


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [("preflight: {gpu: 0.8}", "preflight.gpu"), ("preflight: {host: {nofile_min: {soft: 1}}}", "preflight.host")],
    ids=["scalar-for-section", "section-for-scalar"],
)
def test_config_file_of_the_wrong_shape_is_a_one_line_usage_error(
    here: Here, home: Path, tmp_path: Path, capped: Path, yaml_text: str, key: str
) -> None:
    config = write_yaml(tmp_path / "invoke.yaml", yaml_text)
    assert_usage_error(here(home, "-f", str(config), "bootstrap", "--machine", str(capped)), key)


@pytest.mark.parametrize(
    ("variable", "value", "needles"),
    [
        ("INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTION", "abc", ("preflight.gpu.power_min_fraction", "a number")),
        (
            "INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTON",
            "0.5",
            ("INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTON", "did you mean INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTION?"),
        ),
        ("INVOKE_PREFLIGHT_BENCH_ENABLED", "false", ("preflight.bench.enabled", "use 1 or 0")),
        ("INVOKE_PREFLIGHT_HOST_NOFILE_MIN", "1e6", ("preflight.host.nofile_min", "an integer")),
        ("INVOKE_PREFLIGHT_ALLOC_CONF_RC_FILES", "~/.zshrc", ("preflight.alloc_conf.rc_files", "-f FILE")),
    ],
    ids=["not-a-number", "typo-name", "bool-word", "float-for-int", "list"],
)
def test_bad_environment_variable_is_a_one_line_usage_error(
    here: Here, home: Path, capped: Path, variable: str, value: str, needles: tuple[str, ...]
) -> None:
    run = here(home, "bootstrap", "--machine", str(capped), env={variable: value})
    assert_usage_error(run, *needles)


def test_config_errors_stop_every_task(here: Here, home: Path, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "invoke.yaml", "preflight: {alloc_conf: {rc_file: ['~/.zshrc']}}")
    (home / ".bashrc").write_text(USER_BASHRC, encoding="utf-8")
    for task in (("alloc-conf",), ("alloc-conf", "--undo"), ("snapshot", "--out", str(tmp_path / "s.json"))):
        assert_usage_error(here(home, "-f", str(config), *task), "did you mean preflight.alloc_conf.rc_files?")
    assert (home / ".bashrc").read_text(encoding="utf-8") == USER_BASHRC
    assert not (tmp_path / "s.json").exists()


def test_config_file_override_takes_effect(here: Here, recorded: Path, home: Path, tmp_path: Path) -> None:
    few_files = derived(recorded, tmp_path / "nofile-1024.json", nofile_soft=1024, nofile_hard=1024)
    default = here(home, "bootstrap", "--machine", str(few_files), "--json", "-")
    assert by_id(default.report())["ulimits"]["status"] == "warn", default.why()
    config = write_yaml(tmp_path / "invoke.yaml", "preflight: {host: {nofile_min: 1}}")
    relaxed = here(home, "-f", str(config), "bootstrap", "--machine", str(few_files), "--json", "-")
    assert by_id(relaxed.report())["ulimits"]["status"] == "ok", relaxed.why()


def test_environment_override_takes_effect(here: Here, home: Path, capped: Path) -> None:
    default = here(home, "bootstrap", "--machine", str(capped), "--json", "-")
    assert by_id(default.report())["ulimits"]["status"] == "ok", default.why()
    strict = here(
        home, "bootstrap", "--machine", str(capped), "--json", "-", INVOKE_PREFLIGHT_HOST_NOFILE_MIN="999999999"
    )
    ulimits = by_id(strict.report())["ulimits"]
    assert ulimits["status"] == "warn" and "999999999" in ulimits["summary"], ulimits


@pytest.mark.parametrize("how", ["env", "file"])
def test_fractional_values_for_float_keys_are_accepted(
    here: Here, home: Path, tmp_path: Path, capped: Path, how: str
) -> None:
    if how == "env":
        run = here(home, "bootstrap", "--machine", str(capped), INVOKE_PREFLIGHT_PROBE_TORCH_TIMEOUT_S="2.5")
    else:
        config = write_yaml(tmp_path / "invoke.yaml", "preflight: {host: {memlock_min_gib: 0.5}}")
        run = here(home, "-f", str(config), "bootstrap", "--machine", str(capped))
    assert run.code == 0, run.why()


# --- 5b. flag errors: Invoke's parser, made usage errors ---------------------------------------------------
# The parser is the point: these run in this process (``here``: checks.cli.program's PreflightProgram, as ``python -m invoke`` hands
# over to it). The real entry point's usage errors and help: test_unknown_task_names_the_closest_task,
# test_h_after_a_task_shows_that_tasks_help, test_a_config_file_that_does_not_exist_is_a_usage_error.


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("bootstrap", "--jsn", "out.json"), ("bootstrap has no flag --jsn", "did you mean --json?")),
        (("bootstrap", "--jsn=out.json"), ("bootstrap has no flag --jsn", "did you mean --json?")),
        (("bootstrap", "--no-bnch"), ("bootstrap has no flag --no-bnch", "did you mean --no-bench?")),
        (("verify", "--step", "3"), ("verify has no flag --step", "did you mean --steps?")),
        (("bootstrap", "--bogus"), ("bootstrap has no flag --bogus",)),
    ],
    ids=["typo", "typo-equals", "typo-inverse", "typo-verify", "unknown"],
)
def test_unknown_flag_is_a_one_line_usage_error(
    here: Here, home: Path, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    run = here(home, *args)
    line = assert_usage_error(run, *needles, f"invoke --help {args[0]}")
    assert ("did you mean" in line) == (args[1] != "--bogus"), run.why()
    assert run.out == "", run.why()
    assert rc_bytes(home) == {".bashrc": None, ".profile": None}  # the task never started


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("verify", "--steps", "abc"), ("verify --steps takes an integer, not 'abc'",)),
        (("stage-data", "--size=1.5"), ("stage-data --size takes an integer, not '1.5'",)),
        (("verify", "--price-per-hour", "cheap"), ("verify --price-per-hour takes a number, not 'cheap'",)),
        (("bootstrap", "--json"), ("bootstrap --json needs a value",)),
        (("alloc-conf", "--dry-run=yes"), ("unexpected argument 'yes' after alloc-conf", "on/off flags take no value")),
        (("verify", "--ab", "yes"), ("unexpected argument 'yes' after verify", "on/off flags take no value")),
        # a word where a task takes none: the user's command goes after --, a task's input has its flag
        (("verify", "python", "train.py"), ("unexpected argument 'python'", "goes after --: invoke verify -- python")),
        (("stage-data", "/data/imagenet"), ("unexpected argument '/data/imagenet'", "did you mean --source /data/")),
        (("bootstrap", "h1,h2"), ("unexpected argument 'h1,h2' after bootstrap", "did you mean --hosts h1,h2?")),
    ],
    ids=["int", "int-equals", "float", "missing", "value-for-switch", "yes-after-switch", "command", "source", "hosts"],
)
def test_bad_flag_value_is_a_one_line_usage_error(
    here: Here, home: Path, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    run = here(home, *args)
    assert_usage_error(run, *needles, f"invoke --help {args[0]}")
    assert rc_bytes(home) == {".bashrc": None, ".profile": None}


@pytest.mark.parametrize("task", sorted(INPUT_FLAGS))
def test_every_input_flag_hint_names_a_flag_its_task_has(here: Here, home: Path, task: str) -> None:
    # The table is by hand; a renamed flag would drop its hint to the generic one, and this says so.
    assert_usage_error(here(home, task, "word"), f"did you mean {INPUT_FLAGS[task]} word?")


def test_unknown_task_names_the_closest_task(home: Path) -> None:
    assert_usage_error(invoke(home, "verfy"), "no task named 'verfy'", "did you mean verify?", "invoke --list")


@pytest.mark.parametrize(
    "args",
    [("--help", "bootstrap"), ("bootstrap", "--help"), ("alloc-conf", "--undo", "--dry-run")],
    ids=["help-task", "task-help", "alloc-conf-undo-dry-run"],
)
def test_valid_flags_still_parse_and_exit_0(here: Here, home: Path, args: tuple[str, ...]) -> None:
    run = here(home, *args)
    assert run.code == 0, run.why()
    assert "gpu-preflight:" not in run.err, run.why()
    if "--help" in args:
        assert "--json" in run.out and "--no-bench" in run.out, run.why()
    else:
        assert run.out.startswith("nothing to remove"), run.why()


# --- 6. --strict --------------------------------------------------------------------------------------------


def _warn_only_machines() -> list[str]:
    names = ["capped-4090 (inline)"]
    if (FIXTURES / "rtx4090-power-capped.json").exists():
        names.append("rtx4090-power-capped.json")
    return names


@pytest.mark.parametrize("machine", _warn_only_machines())
def test_strict_turns_warnings_into_exit_1(here: Here, home: Path, capped: Path, machine: str) -> None:
    path = capped if machine.endswith("(inline)") else FIXTURES / machine
    plain = here(home, "bootstrap", "--machine", str(path), "--json", "-")
    assert plain.code == 0, plain.why()
    counts = plain.report()["counts"]
    assert counts["warn"] >= 1 and counts["fail"] == 0 and counts["error"] == 0, counts
    assert here(home, "bootstrap", "--machine", str(path), "--strict").code == 1


def test_strict_from_config_and_environment(here: Here, home: Path, tmp_path: Path, capped: Path) -> None:
    config = write_yaml(tmp_path / "invoke.yaml", "preflight: {report: {strict: true}}")
    assert here(home, "-f", str(config), "bootstrap", "--machine", str(capped)).code == 1
    assert here(home, "bootstrap", "--machine", str(capped), INVOKE_PREFLIGHT_REPORT_STRICT="1").code == 1
    assert here(home, "bootstrap", "--machine", str(capped), INVOKE_PREFLIGHT_REPORT_STRICT="0").code == 0


# --- 7. the torch probe: hung, broken, missing; Ctrl-C ------------------------------------------------------


def test_hung_torch_probe_times_out_and_is_killed(home: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "torch.pid"
    run = invoke(
        home,
        "bootstrap",
        "--json",
        "-",
        timeout=30,
        PYTHONPATH=str(fake_torch(tmp_path, HANGING_TORCH)),
        FAKE_TORCH_PID=str(pid_file),
        INVOKE_PREFLIGHT_PROBE_TORCH_TIMEOUT_S="2",
    )
    assert run.code == 1, run.why()
    assert run.seconds < 30
    results = by_id(run.report())
    torch = results["torch-build"]
    assert torch["status"] == "fail" and "within 2 s" in torch["summary"], torch
    assert results["alloc-conf"]["status"] == "skip", results["alloc-conf"]
    assert pid_gone(int(pid_file.read_text())), "the hung torch child outlived bootstrap"
    assert rc_bytes(home) == {".bashrc": None, ".profile": None}


@pytest.mark.parametrize(
    ("body", "summary", "hint"),
    [
        (
            'raise RuntimeError("libcudart.so.12: cannot open shared object file")',
            "import torch failed",
            "import torch",
        ),
        ("raise ModuleNotFoundError(\"No module named 'torch'\")", "not installed", "pip install torch"),
    ],
    ids=["broken", "missing"],
)
def test_unusable_torch_fails_torch_build(home: Path, tmp_path: Path, body: str, summary: str, hint: str) -> None:
    run = invoke(home, "bootstrap", "--json", "-", PYTHONPATH=str(fake_torch(tmp_path, body + "\n")))
    assert run.code == 1, run.why()
    results = by_id(run.report())
    torch = results["torch-build"]
    assert torch["status"] == "fail" and summary in torch["summary"], torch
    assert hint in torch["hint"], torch
    assert results["alloc-conf"]["status"] == "skip" and "torch" in results["alloc-conf"]["summary"]


def test_ctrl_c_exits_130_with_one_line(home: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "torch.pid"
    env = child_env(home, PYTHONPATH=str(fake_torch(tmp_path, HANGING_TORCH)), FAKE_TORCH_PID=str(pid_file))
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", "bootstrap"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a foreground job on a terminal
        preexec_fn=default_sigint,
    )
    try:
        # the torch probe is running: bootstrap sits in its wait loop
        until(pid_file.exists, 30, what="bootstrap to start the torch probe", while_running=proc)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: SIGINT to the foreground process group
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, f"{proc.returncode}\n{out}\n{err}"
    assert err.strip().splitlines() == ["gpu-preflight: interrupted"], err
    assert "Traceback" not in out + err
    assert pid_gone(int(pid_file.read_text())), "the torch child outlived the interrupt"
    assert rc_bytes(home) == {".bashrc": None, ".profile": None}


# --- 7b. the command after -- (invoke verify [flags] -- COMMAND) -------------------------------------------


def test_the_words_after_two_dashes_reach_verify_as_its_command(
    here: Here, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from checks.result import Report
    from checks.verify import run as run_verify
    from checks.verify.user import run as run_user

    asked: list[run_user.CommandRequest] = []
    own: list[run_user.CommandRequest] = []

    def judged(request: run_user.CommandRequest, say: Callable[[str], None]) -> run_verify.Judged:
        asked.append(request)  # what the package is given; nothing runs
        return run_verify.Judged(Report("box", "live", ()), (), "", (), False)

    def own_script(request: run_user.CommandRequest, options: object, say: Callable[[str], None]) -> run_verify.Judged:
        own.append(request)
        return run_verify.Judged(Report("box", "live", ()), (), "", (), False)

    monkeypatch.setattr(run_user, "verify_command", judged)
    monkeypatch.setattr(run_user, "verify_builtin", own_script)
    run = here(home, "verify", "--steps", "3", "-q", "--seconds", "2.5", "--", "python", "train.py", "--lr", "3e-4")
    assert run.code == 0, run.why()
    assert asked[0].command == ("python", "train.py", "--lr", "3e-4")
    assert (asked[0].steps, asked[0].quiet, asked[0].seconds, asked[0].warmup) == (3, True, 2.5, -1)
    assert not own
    assert here(home, "verify").code == 0 and len(own) == 1 and len(asked) == 1  # without --: the tool's script
    assert here(home, "verify", "-q", "--warmup", "3").code == 0 and (own[1].quiet, own[1].warmup) == (True, 3)


@pytest.mark.parametrize("flag", [("--nproc", "2"), ("--model", "m:f"), ("--ckpt-every", "5")])
def test_verify_refuses_its_own_loop_flags_with_a_command(here: Here, home: Path, flag: tuple[str, ...]) -> None:
    """Flags that shape verify's built-in loop would be silently ignored by the user's command: refused instead."""
    run = here(home, "verify", *flag, "--", "python", "train.py")
    assert_usage_error(run, f"verify: {flag[0]} sets verify's own loop, not your command's")


def test_verify_passes_sweep_and_ab_to_the_users_command(
    here: Here, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--sweep re-runs the user's command at doubling batch sizes (checks/verify/user/sweep.py): passed, not refused."""
    from checks.result import Report
    from checks.verify import run as run_verify
    from checks.verify.user import run as run_user

    asked: list[run_user.CommandRequest] = []

    def judged(request: run_user.CommandRequest, say: Callable[[str], None]) -> run_verify.Judged:
        asked.append(request)
        return run_verify.Judged(Report("box", "live", ()), (), "", (), False)

    monkeypatch.setattr(run_user, "verify_command", judged)
    run = here(home, "verify", "--sweep", "--ab", "--", "python", "train.py")
    assert run.code == 0, run.why()
    assert asked[0].sweep and asked[0].ab and asked[0].command == ("python", "train.py")


@pytest.mark.parametrize("flag", [("--seconds", "5"), ("--warmup", "3"), ("-q",)])
def test_verify_refuses_a_one_box_flag_across_hosts(here: Here, home: Path, flag: tuple[str, ...]) -> None:
    """--seconds, --warmup and --quiet shape one box's run (the tool's script or yours); across hosts every node
    runs preflight.verify.steps, so they are refused there rather than ignored."""
    run = here(home, "verify", *flag, "--hosts", "h1,h2")
    long = {"-q": "--quiet"}.get(flag[0], flag[0])
    assert_usage_error(run, f"verify: {long} applies to one box's run; across hosts every node runs")


@pytest.mark.parametrize("task", [("bootstrap",), ("stage-data", "--source", "x"), ("watch",)])
def test_other_tasks_refuse_a_command_after_two_dashes(here: Here, home: Path, task: tuple[str, ...]) -> None:
    run = here(home, *task, "--", "python", "train.py")
    assert_usage_error(run, f"{task[0]} takes no command after --", "invoke verify [flags] -- COMMAND")
    assert run.out == "" and rc_bytes(home) == {".bashrc": None, ".profile": None}  # the task never started


@pytest.mark.parametrize(
    "argv",
    [
        ("--steps", "20000000"),
        ("--steps", "9000000", "--", "python", "train.py"),
        ("--seconds", "900", "--", "python", "t.py"),
    ],
    ids=["steps", "command-steps", "command-seconds"],
)
def test_verify_refuses_steps_that_cannot_end_before_the_child_timeout(home: Path, argv: tuple[str, ...]) -> None:
    """``--steps 1000000`` was accepted without a word that ``verify.timeout_s`` kills the child after 900 s."""
    run = invoke(home, "verify", *argv)
    line = assert_usage_error(run, f"verify {argv[0]} {argv[1]}", "preflight.verify.timeout_s (900 s)")
    assert "INVOKE_PREFLIGHT_VERIFY_TIMEOUT_S" in line and run.out == "", line


@pytest.mark.parametrize(
    ("steps", "env", "note"),
    [
        ("1000000", {}, "at most 0.9 ms a step"),
        ("1000", {}, "at most 0.9 s a step"),
        ("1000", {"INVOKE_PREFLIGHT_VERIFY_TIMEOUT_S": "3600"}, ""),
        ("40", {}, ""),
    ],
)
def test_verify_says_when_its_steps_need_a_pace_the_child_timeout_allows(
    here: Here, home: Path, monkeypatch: pytest.MonkeyPatch, steps: str, env: dict[str, str], note: str
) -> None:
    from checks.errors import PreflightError
    from checks.verify.user import run as run_user

    def started(*args: object, **kwargs: object) -> None:  # verify's run, past the task's flag checks: nothing trains
        raise PreflightError("started", code=1)

    monkeypatch.setattr(run_user, "verify_builtin", started)
    run = here(home, "verify", "--steps", steps, env=env)
    assert run.code == 1 and run.err.endswith("gpu-preflight: started\n"), run.why()
    lines = run.err.splitlines()[:-1]
    if not note:
        assert lines == [], run.why()
        return
    assert len(lines) == 1 and lines[0].startswith(f"verify: --steps {steps} and 5 warm-up steps"), run.why()
    assert "preflight.verify.timeout_s (900 s)" in lines[0] and note in lines[0], run.why()


@pytest.mark.parametrize("task", ["verify", "sbatch"])
def test_two_dashes_with_no_command_after_them_are_refused(home: Path, task: str) -> None:
    """``invoke verify --`` with the command forgotten ran the built-in loop without a word."""
    run = invoke(home, task, "--steps", "3", "--") if task == "verify" else invoke(home, task, "--")
    assert_usage_error(
        run, "nothing after --: put your training command after it, or drop -- to run the tool's own training script"
    )
    assert run.out == "" and rc_bytes(home) == {".bashrc": None, ".profile": None}  # the task never started


@pytest.mark.parametrize("argv", [("verify", "--help"), ("--help", "verify"), ("sbatch", "-h")])
def test_the_help_of_a_task_that_runs_a_command_shows_the_dashes_form(home: Path, argv: tuple[str, ...]) -> None:
    run = invoke(home, *argv)
    assert run.code == 0 and run.err == "", run.why()
    usage = run.out.split("Docstring:")[0]
    assert re.match(r"Usage: inv\S* \[--core-opts\] \w+ ", usage), run.out
    assert f"invoke {argv[0] if argv[0] != '--help' else argv[1]} [flags] -- COMMAND ..." in usage, run.out
    assert "COMMAND" not in invoke(home, "bootstrap", "--help").out.split("Docstring:")[0]


def test_the_task_list_names_gpu_preflights_version_from_its_pyproject(home: Path) -> None:
    """``invoke --version`` is Invoke's own (Invoke answers it before it loads tasks.py): ``invoke --list``, which
    the project's program answers, names gpu-preflight's version, the one in pyproject.toml."""
    toml = pytest.importorskip("tomllib")
    ours = toml.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    run = invoke(home, "--list")
    assert run.code == 0 and run.err == "", run.why()
    assert run.out.splitlines()[0] == f"Available tasks (gpu-preflight {ours}):", run.out


CHECKOUT_PARTS = ("tasks.py", "pyproject.toml", "checks", "provision", "datasets", "templates")


def checkout_copy(tmp_path: Path) -> Path:
    """The code of the checkout, copied: a test may give it an ``invoke.yaml`` without touching the real one."""
    copy = tmp_path / "checkout"
    for part in CHECKOUT_PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            copy.mkdir(exist_ok=True)
            shutil.copy2(source, copy / part)
    return copy


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("preflight:\n  verfy: {steps: 3}\n", "unknown configuration key preflight.verfy"),
        ("preflight:\n  verify: {steps: abc}\n", "preflight.verify.steps must be an integer"),
        ("preflight:\n  verify: [\n", "is not valid YAML"),
    ],
    ids=["typo", "type", "yaml"],
)
def test_a_mistake_in_the_checkouts_invoke_yaml_leaves_list_and_help_working(
    tmp_path: Path, home: Path, text: str, needle: str
) -> None:
    """docs/configuration.md: a bad key stops every task, while --list and --help keep working."""
    copy = checkout_copy(tmp_path)
    (copy / "invoke.yaml").write_text(text, encoding="utf-8")

    def run(*args: str) -> Run:
        proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=copy, env=child_env(home),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        return Run(args, proc.returncode, proc.stdout, proc.stderr, 0.0)

    listed = run("--list")
    assert listed.code == 0 and "verify" in listed.out and "Traceback" not in listed.err, listed.why()
    for argv in (("--help", "verify"), ("verify", "-h")):
        helped = run(*argv)
        assert helped.code == 0 and "--steps" in helped.out, helped.why()
    assert_usage_error(run("snapshot", "--out", str(tmp_path / "s.json")), str(copy / "invoke.yaml"), needle)
    assert not (tmp_path / "s.json").exists()


def test_a_mistake_in_the_users_invoke_yaml_leaves_list_and_help_working(home: Path) -> None:
    (home / ".invoke.yaml").write_text("preflight:\n  verfy: {steps: 3}\n", encoding="utf-8")
    listed = invoke(home, "--list")
    assert listed.code == 0 and "verify" in listed.out, listed.why()
    assert invoke(home, "--help", "bootstrap").code == 0
    assert_usage_error(invoke(home, "snapshot", "--out", str(home / "s.json")), "preflight.verfy")


# --- 8. invoke --list ---------------------------------------------------------------------------------------


def test_list_shows_every_task_with_its_docstring(here: Here, home: Path) -> None:
    run = here(home, "--list")
    assert run.code == 0, run.why()
    flat = "".join(run.out.split())  # --list wraps long help lines, also after a hyphen
    names = sorted(tasks.ns.task_names)
    assert names == [
        "alloc-conf",
        "bootstrap",
        "diff",
        "lock",
        "plan",
        "sbatch",
        "snapshot",
        "stage-data",
        "verify",
        "watch",
    ]
    for name in names:
        line = (tasks.ns[name].__doc__ or "").splitlines()[0]
        assert line and name + "".join(line.split()) in flat, (name, run.out)


def test_h_after_a_task_shows_that_tasks_help(home: Path) -> None:
    run = invoke(home, "bootstrap", "-h")  # --hosts took -h, and this said "--hosts needs a value"
    assert run.code == 0 and run.err == "", run.why()
    assert re.match(r"Usage: inv\S* \[--core-opts\] bootstrap ", run.out) and "--hosts=STRING" in run.out


def test_no_task_flag_takes_h(here: Here, home: Path) -> None:
    for name in tasks.ns.task_names:
        run = here(home, name, "-h")
        assert run.code == 0 and f"Usage: invoke [--core-opts] {name} " in run.out, run.why()
        assert not re.search(r"^\s+-h\b", run.out, re.MULTILINE), run.out


def test_stage_data_help_names_the_disk_it_picks(here: Here, home: Path) -> None:
    run = here(home, "--help", "stage-data")
    flat = " ".join(run.out.split())
    assert "default: <fastest local disk with room>/staged/<name>" in flat, run.out


# --- 9. colour ----------------------------------------------------------------------------------------------


def _stderr_on_a_terminal(home: Path, machine: Path, **extra: str) -> str:
    """Run ``bootstrap --machine FILE --json -`` with stderr (the text report) on a pseudo-terminal."""
    env = child_env(home, colour=True, **extra)
    primary, secondary = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "invoke", "bootstrap", "--machine", str(machine), "--json", "-"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=secondary,
            timeout=60,
        )
    finally:
        os.close(secondary)
        reader.join(timeout=10)
        os.close(primary)
    assert proc.returncode == 0
    json.loads(proc.stdout)  # stdout stays plain JSON whatever the terminal does
    return b"".join(chunks).decode()


def test_no_colour_on_a_pipe_even_without_no_color(home: Path, capped: Path) -> None:
    run = invoke(home, "bootstrap", "--machine", str(capped), colour=True)
    assert run.code == 0, run.why()
    assert "WARN" in run.out and ANSI not in run.out + run.err


def test_colour_on_a_terminal_unless_no_color(home: Path, capped: Path) -> None:
    coloured = _stderr_on_a_terminal(home, capped)
    assert "\x1b[33mWARN" in coloured, coloured
    plain = _stderr_on_a_terminal(home, capped, NO_COLOR="1")
    assert "WARN" in plain and ANSI not in plain, plain


def test_empty_no_color_keeps_colour_on_a_terminal(home: Path, capped: Path) -> None:
    assert "\x1b[33mWARN" in _stderr_on_a_terminal(home, capped, NO_COLOR="")


def test_inherited_variables_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper itself: stray variables from the outer shell never reach a child."""
    for name in ("INVOKE_PREFLIGHT_HOST_NOFILE_MIN", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "NO_COLOR"):
        monkeypatch.setenv(name, "x")
    env = child_env(Path("/nonexistent-home"), colour=True)
    assert not [k for k in env if k.startswith("INVOKE_PREFLIGHT_") or "ALLOC_CONF" in k or k == "NO_COLOR"]
    assert env["HOME"] == "/nonexistent-home"


def test_sbatch_prints_a_script_bash_can_read_and_refuses_what_sbatch_would(home: Path, tmp_path: Path) -> None:
    run = invoke(home, "sbatch", "--nodes", "4", "--gpus-per-node", "8", "--partition", "gpu", "--", "python", "train.py", "--lr", "3e-4")  # fmt: skip
    assert run.code == 0, run.why()
    script = tmp_path / "job.sbatch"
    script.write_text(run.out, encoding="utf-8")
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    lines = run.out.splitlines()
    assert {"#SBATCH --nodes=4", "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu"} <= set(lines)
    assert any("--nproc-per-node=8" in line and "--no-python python train.py --lr 3e-4'" in line for line in lines)
    out = tmp_path / "written.sbatch"
    assert invoke(home, "sbatch", "--out", str(out)).code == 0 and os.access(out, os.X_OK)
    for bad, word in ((["--nodes", "0"], "--nodes 0"), (["--time", "1h"], "--time '1h'"), (["--gpus-per-node", "-1"], "negative")):  # fmt: skip
        refused = invoke(home, "sbatch", *bad)
        assert refused.code == 2 and word in refused.err and refused.out == "", refused.why()
