"""``invoke verify`` and ``invoke watch`` with a temporary HOME, training for real on this machine's CPU (small sizes
through INVOKE_PREFLIGHT_*): in-process through the real tasks and hooks (``here``), and as a user runs them
(``python -m invoke ...``) where the process is the point (Ctrl-C)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from tests.fakes.cli import REPO, Here, Run, assert_usage_error, by_id, child_env, default_sigint

pytestmark = pytest.mark.slow

PLUGINS = "tests.checks.verify.planted_plugins"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHARES = {"data_wait", "h2d", "forward", "backward", "optimizer", "checkpoint"}
VERDICTS = {"data-bound", "cpu-starved", "h2d-bound", "launch-bound", "compute-bound", "checkpoint-bound", "near-oom", "throttled", "cpu-contended", "cant-tell"}  # fmt: skip


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


_probed: list[Any] = []  # this machine's facts, read live by the first verify of this module


@pytest.fixture(autouse=True)
def machine_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify gates on bootstrap's facts of this machine (driver, torch in a subprocess, host: seconds of CPU a run);
    they are the same for every test here, so the first run reads them live and the others reuse them."""
    from checks import probe

    live = probe.LocalProbe.machine

    def once(self: probe.LocalProbe) -> Any:
        if not _probed:
            _probed.append(live(self))
        return _probed[0]

    monkeypatch.setattr(probe.LocalProbe, "machine", once)


def small(tmp: Path, **extra: str) -> dict[str, str]:
    """Small and quick: 16 px images, batch 16, one warm-up step; reports under ``tmp``. No re-runs for advice
    (``command_advice_s`` 0: the loader and model re-runs are tests/checks/verify/user/'s; they took up to a minute of
    each run here); the resume replay still runs."""
    env = {"INVOKE_PREFLIGHT_VERIFY_IMAGE_SIZE": "16", "INVOKE_PREFLIGHT_VERIFY_BATCH_SIZE_CPU": "16"}
    env |= {"INVOKE_PREFLIGHT_VERIFY_WARMUP": "1", "INVOKE_PREFLIGHT_VERIFY_REPORT_DIR": str(tmp / "reports")}
    env |= {"INVOKE_PREFLIGHT_VERIFY_COMMAND_ADVICE_S": "0"}
    return env | extra


def verify(
    here: Here, home: Path, tmp: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[Run, dict[str, Any]]:
    run = here(home, "verify", "--steps", "4", *args, "--json", str(tmp / "r.json"), env=small(tmp) | (env or {}))
    report = json.loads((tmp / "r.json").read_text()) if (tmp / "r.json").exists() else {}
    return run, report


def stage_images(root: Path, n: int = 64) -> Path:
    root.mkdir()
    rng = np.random.default_rng(0)
    np.save(root / "images.npy", rng.integers(0, 255, (n, 16, 16, 3), dtype=np.uint8))
    np.save(root / "labels.npy", np.arange(n, dtype=np.int64) % 4)
    (root / "classes.json").write_text(json.dumps(["a", "b", "c", "d"]))
    (root / "manifest.json").write_text(json.dumps({"count": n}))
    return root


def test_verify_on_synthetic_data_writes_report_csv_and_png(here: Here, home: Path, tmp_path: Path) -> None:
    run, report = verify(here, home, tmp_path)
    assert run.code == 0, run.why()
    results, m = by_id(report), report["measurements"]
    assert results["diagnosis"]["value"] in VERDICTS
    assert set(m["step_breakdown"]) == SHARES and abs(sum(m["step_breakdown"].values()) - 1) < 1e-9
    assert results["verify-checkpoint"]["status"] == "ok" and "exactly" in results["verify-checkpoint"]["summary"]
    assert results["verify-loss"]["status"] == "ok" and results["driver"]["status"] == "skip"  # a CPU machine
    assert results["verify-mfu"]["status"] == "skip" and "no GPU" in results["verify-mfu"]["summary"]
    assert m["step_time"]["steps"] == 4 and m["samples_per_s"] > 0
    # without a GPU the child gets no allocator setting, and the loop's line says why
    loop = results["verify-loop"]["summary"]
    assert loop.endswith("; allocator: none (no NVIDIA GPU here (no driver library, see driver))"), loop
    csv = (tmp_path / "r.samples.csv").read_text().splitlines()
    assert csv[0].startswith("t_mono,t_s,cpu_pct") and len(csv) > 5
    assert (tmp_path / "r.png").read_bytes()[:8] == PNG_MAGIC
    assert "diagnosis (primary first):" in run.out and "wrote " in run.err
    assert "Traceback" not in run.err
    # bootstrap's ok and skipped rows are one count line; the call to action is the verdict's
    assert "bootstrap's checks:" in run.out and "gpu-power" not in run.out
    failed = [r for r in report["results"] if r["status"] in ("fail", "error")]
    verb = "fix " if results["diagnosis"]["status"] == "warn" else ""  # a crowded box's cpu-contended is a warn
    assert failed or f"next: {verb}diagnosis: {results['diagnosis']['hint']}" in run.out


def test_verify_all_prints_every_bootstrap_row(here: Here, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--all reaches the text report (the run is replaced: the default rendering is the test above's)."""
    from checks.result import Report, ok, warn
    from checks.verify import run as run_verify
    from checks.verify.user import run as run_command

    rows = (ok("gpu-power", "no GPU"), warn("diagnosis", "data-bound", "more workers"))

    def judged(request: Any, options: Any, say: Any) -> run_verify.Judged:
        report = Report(host="h", machine="m", results=rows)
        return run_verify.Judged(report, (), "", (), False, background=frozenset({"gpu-power"}))

    monkeypatch.setattr(run_command, "verify_builtin", judged)
    quiet, every = here(home, "verify"), here(home, "verify", "--all")
    assert quiet.code == every.code == 0, quiet.why() + every.why()
    assert "bootstrap's checks: 1 ok" in quiet.out and "gpu-power" not in quiet.out
    assert "gpu-power" in every.out and "bootstrap's checks:" not in every.out


def test_verify_on_staged_images_prices_the_epoch(here: Here, home: Path, tmp_path: Path) -> None:
    data = stage_images(tmp_path / "staged")
    run, report = verify(here, home, tmp_path, "--data", str(data), "--price-per-hour", "3.5")
    assert run.code == 0, run.why()
    results, m = by_id(report), report["measurements"]
    line = results["verify-data"]["summary"]  # bootstrap's advice here is 1 worker; staged data needs none
    assert "staged at" in line and "num_workers=0" in line and "staged data: read in the training process" in line
    assert m["cost"]["epoch_steps"] == 64 // 16 and "per epoch" in results["verify-cost"]["summary"]
    assert m["run"]["data"]["reader"].endswith("StagedImages")  # stage-data's template (or the built-in reader)


def test_staged_data_smaller_than_one_batch_exits_2_with_the_scripts_own_words(
    here: Here, home: Path, tmp_path: Path
) -> None:
    # The training script finds it (the dataset's length against the batch) and exits 2: verify says its line.
    data = stage_images(tmp_path / "staged", n=10)
    run, _ = verify(here, home, tmp_path, "--data", str(data), "--batch-size", "16")
    assert run.code == 2 and "Traceback" not in run.err, run.why()
    line = run.err.strip().splitlines()[-1]  # after the script's own lines: one error line
    expected = "gpu-preflight: verify: the dataset holds 10 samples: fewer than one batch of 16 per process"
    assert line.startswith(expected), run.why()
    assert "passes its flags on to templates/train.py" in line and "train.py --data" not in line, line


def test_staged_data_is_read_by_workers_when_they_are_asked_for(here: Here, home: Path, tmp_path: Path) -> None:
    data = stage_images(tmp_path / "staged")  # without --workers: read in the training process (test above)
    run, report = verify(here, home, tmp_path, "--data", str(data), "--workers", "2")
    assert run.code == 0, run.why()
    line = by_id(report)["verify-data"]["summary"]
    assert "num_workers=2" in line and "staged data" not in line  # what the user asks for is what runs


def test_verify_on_staged_tokens_with_json_on_stdout(here: Here, home: Path, tmp_path: Path) -> None:
    root = tmp_path / "tokens"
    root.mkdir()
    np.save(root / "tokens.npy", (np.arange(20_000) % 97).astype(np.uint16))
    np.save(root / "doc_offsets.npy", np.array([0, 20_000]))
    (root / "manifest.json").write_text("{}")
    env = small(tmp_path, INVOKE_PREFLIGHT_VERIFY_SEQ_LEN="32")
    run = here(home, "verify", "--steps", "3", "--data", str(root), "--json", "-", env=env)
    assert run.code == 0, run.why()
    report = run.report()  # stdout is the JSON document alone
    assert by_id(report)["verify-data"]["value"]["kind"] == "tokens"
    assert report["measurements"]["tokens_per_s"] > 0
    assert "diagnosis (primary first):" in run.err
    assert list((tmp_path / "reports").glob("verify-*.samples.csv"))


def test_a_broken_staged_directory_exits_2_before_training(here: Here, home: Path, tmp_path: Path) -> None:
    data = stage_images(tmp_path / "staged")
    (data / "manifest.json").unlink()
    run, _ = verify(here, home, tmp_path, "--data", str(data))
    assert_usage_error(run, "manifest.json is missing")
    assert run.seconds < 20


@pytest.mark.parametrize("layout", ["class-folders", "flat"])
def test_a_raw_image_folder_is_not_staged_and_the_line_says_how_to_stage_it(
    here: Here, home: Path, tmp_path: Path, layout: str
) -> None:
    from PIL import Image

    raw = tmp_path / "train"
    for name in ("cat/0.JPEG", "dog/1.png") if layout == "class-folders" else ("0.jpg", "1.jpg"):
        (raw / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8)).save(raw / name, format="PNG")
    run, _ = verify(here, home, tmp_path, "--data", str(raw))
    line = assert_usage_error(run, f"{raw} holds image files, not a staged dataset")
    assert f"invoke stage-data --source {raw}" in line and "interrupted" not in line


def test_device_cpu_with_a_cuda_torch_and_no_driver_is_not_gated_by_the_driver(
    here: Here, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The box's torch is a CUDA build and an NVIDIA GPU sits on its bus (as the probe reports them), without a
    driver: a --device cpu run is fine (without --device cpu the missing driver fails the gate)."""
    import dataclasses

    from checks import probe

    live = probe.LocalProbe.machine

    def cuda_build(self: probe.LocalProbe) -> Any:
        facts = live(self)
        cuda = dataclasses.replace(facts.torch, version="2.8.0+cu128", cuda="12.8", arch_list=("sm_80", "sm_90"))
        return dataclasses.replace(facts, torch=cuda, host=dataclasses.replace(facts.host, nvidia_pci_gpus=1))

    monkeypatch.setattr(probe.LocalProbe, "machine", cuda_build)
    run, report = verify(here, home, tmp_path, "--device", "cpu", "--workers", "0")
    assert run.code == 0, run.why()
    driver = by_id(report)["driver"]
    assert driver["status"] == "skip" and driver["summary"].startswith("not needed for a CPU run (--device cpu): NVML")
    assert not [r for r in report["results"] if r["status"] == "fail"], run.why()


ENV_PROBE = """
import os
from pathlib import Path

from tests.checks.verify.planted_plugins import patterned


def seen():
    names = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    Path(f"{os.environ['ENV_PROBE_OUT']}.{os.getpid()}").write_text(repr({n: os.environ.get(n) for n in names}))
    return patterned()
"""


def seen_by(tmp_path: Path) -> list[dict[str, str | None]]:
    """What each training process's environment held (one file per process that built the dataset)."""
    return [eval(f.read_text()) for f in sorted(tmp_path.glob("seen.txt.*"))]


def test_your_own_allocator_setting_is_what_the_training_child_gets(
    here: Here, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's own export is what their run gets from this shell (bootstrap's setting: the DDP test below)."""
    (tmp_path / "envprobe.py").write_text(ENV_PROBE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO))
    env = {"INVOKE_PREFLIGHT_ALLOC_CONF_WITHOUT_GPU": "1", "ENV_PROBE_OUT": str(tmp_path / "seen.txt")}
    env |= {"PYTHONPATH": str(REPO)}  # the probe module imports the tests' plugins
    env |= {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    run, report = verify(here, home, tmp_path, "--dataset", "envprobe:seen", "--workers", "0", env=env)
    assert run.code == 0, run.why()
    seen = seen_by(tmp_path)  # the run, and any re-run the advice made
    loop = by_id(report)["verify-loop"]["summary"]
    assert seen and all(s["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128" for s in seen), seen
    assert "PYTORCH_CUDA_ALLOC_CONF from your environment" in loop, loop


def test_every_ddp_rank_runs_with_the_allocator_setting_bootstrap_writes(
    here: Here, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "envprobe.py").write_text(ENV_PROBE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO))
    env = {"INVOKE_PREFLIGHT_ALLOC_CONF_WITHOUT_GPU": "1", "ENV_PROBE_OUT": str(tmp_path / "seen.txt")}
    env |= {"PYTHONPATH": str(REPO)}  # the probe module imports the tests' plugins
    env |= {"INVOKE_PREFLIGHT_VERIFY_COMMAND_ADVICE_S": "0"}  # no re-runs: what is asserted is the ranks' setting
    args = ("--dataset", "envprobe:seen", "--workers", "0", "--nproc", "2")
    run, report = verify(here, home, tmp_path, *args, env=env)
    assert run.code in (0, 1), run.why()  # the gate may judge a 4-step DDP run; the environment is the point
    seen = seen_by(tmp_path)
    assert len(seen) >= 2 and all(s["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" for s in seen), seen
    loop = by_id(report)["verify-loop"]["summary"]
    assert "allocator: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in loop and "new shells" in loop, loop


def test_an_unwritable_checkpoint_directory_exits_2(here: Here, home: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    run, _ = verify(here, home, tmp_path, "--ckpt-dir", str(tmp_path / "file" / "ckpt"))
    assert_usage_error(run, "is not writable")


def test_a_model_that_cannot_be_imported_exits_2(here: Here, home: Path, tmp_path: Path) -> None:
    run, _ = verify(here, home, tmp_path, "--model", "no_such_module:build")
    assert run.code == 2 and "Traceback" not in run.err, run.why()
    last = run.err.strip().splitlines()[-1]  # after the child's progress lines: one error line
    assert last.startswith("gpu-preflight: verify: cannot import no_such_module:build: ModuleNotFoundError"), run.why()


def test_oom_at_the_requested_batch_exits_1_with_the_batch_that_fits(here: Here, home: Path, tmp_path: Path) -> None:
    args = ("--dataset", f"{PLUGINS}:patterned", "--model", f"{PLUGINS}:oom_model", "--batch-size", "32")
    run, report = verify(here, home, tmp_path, *args, "--workers", "0")
    assert run.code == 1, run.why()
    loop = by_id(report)["verify-loop"]
    assert loop["status"] == "fail" and "out of memory at batch 32" in loop["summary"]
    assert "--batch-size 8" in loop["hint"] and by_id(report)["diagnosis"]["value"] == "near-oom"


def test_nan_loss_and_a_missed_throughput_floor_fail_the_gate(here: Here, home: Path, tmp_path: Path) -> None:
    floor = {"INVOKE_PREFLIGHT_VERIFY_MIN_SAMPLES_PER_S": "1000000000"}
    args = ("--dataset", f"{PLUGINS}:patterned", "--model", f"{PLUGINS}:nan_model", "--workers", "0")
    run, report = verify(here, home, tmp_path, *args, env=floor)
    assert run.code == 1, run.why()
    results = by_id(report)
    assert results["verify-loss"]["status"] == "fail" and "NaN/inf" in results["verify-loss"]["summary"]
    assert results["verify-throughput"]["status"] == "fail"


def test_ctrl_c_writes_the_partial_report_and_leaves_no_process(home: Path, tmp_path: Path) -> None:
    env = child_env(home) | small(tmp_path)
    argv = [sys.executable, "-m", "invoke", "verify", "--steps", "400", "--json", str(tmp_path / "r.json")]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)  # fmt: skip
    seen, deadline, family = "", time.monotonic() + 90, set()
    assert proc.stderr is not None
    while "step 10 (measured)" not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
        family |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    proc.send_signal(signal.SIGINT)  # what a terminal sends to the foreground process
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    report = json.loads((tmp_path / "r.json").read_text())
    loop = by_id(report)["verify-loop"]
    assert loop["status"] == "warn" and loop["summary"].startswith("interrupted")
    assert 9 <= report["measurements"]["step_time"]["steps"] < 400  # step 10, the warm-up one excluded
    assert (tmp_path / "r.png").exists() and "interrupted" in err
    time.sleep(0.5)
    assert family and not [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_watch_judges_a_running_process_tree(here: Here, home: Path, tmp_path: Path) -> None:
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<30: pass"])
    try:
        env = {"INVOKE_PREFLIGHT_VERIFY_SAMPLE_INTERVAL_S": "0.05"}
        run = here(home, "watch", "--seconds", "2", "--pid", str(busy.pid), "--json", str(tmp_path / "w.json"), env=env)
    finally:
        busy.kill()
        busy.wait()
    assert run.code == 0, run.why()
    report = json.loads((tmp_path / "w.json").read_text())
    results, sampler = by_id(report), report["measurements"]["sampler"]
    assert results["diagnosis"]["value"] == "cant-tell" and "no GPU" in results["diagnosis"]["summary"]
    assert f"process {busy.pid}" in results["watch-sampler"]["summary"]
    assert sampler["samples"] >= 20 and sampler["tree_cpu_fraction"]["p95"] >= 0.1  # a busy core (shared when loaded)
    assert (tmp_path / "w.png").read_bytes()[:8] == PNG_MAGIC and (tmp_path / "w.samples.csv").exists()


def test_watch_refuses_a_pid_that_does_not_exist(here: Here, home: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert_usage_error(here(home, "watch", "--pid", str(gone.pid)), f"no process {gone.pid}")


@pytest.mark.parametrize(
    "flags, config, code", [((), "", 0), (("--strict",), "", 1), ((), "report: {strict: true}", 1)]
)
def test_verify_strict_makes_a_warning_exit_1(
    flags: tuple[str, ...], config: str, code: int, here: Here, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--strict (or preflight.report.strict) reaches verify's exit code; the run itself is replaced (one warn row)."""
    from checks.result import Report, warn
    from checks.verify.run import Judged
    from checks.verify.user import run as user_run

    asked: list[Any] = []

    def judged(request: Any, say: Any) -> Judged:
        asked.append(request)
        row = warn("checkpoint-bound", "checkpoints take 30% of the step", "save less often")
        return Judged(Report(host="h", machine="m", results=(row,)), (), str(home / "r.json"), (), False)

    monkeypatch.setattr(user_run, "verify_command", judged)
    if config:
        (home / "invoke.yaml").write_text(f"preflight: {{{config}}}\n", encoding="utf-8")
    run = here(home, "verify", *flags, "--", sys.executable, "train.py", env={"INVOKE_RUNTIME_CONFIG": str(home / "invoke.yaml")} if config else None)  # fmt: skip
    assert run.code == code, run.why()
    assert asked and asked[0].command == (sys.executable, "train.py")
