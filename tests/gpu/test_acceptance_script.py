"""The GPU acceptance run on a machine without a GPU: the script parses, --dry-run lists every step and runs
nothing, a run whose budget is spent still writes its summary, and the summariser turns a recorded bootstrap
report into figures as fractions of the datasheet. So the script does not rot while no GPU is lent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.gpu import prepare, summarise
from tests.gpu.conftest import no_gpu_reason

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "gpu" / "acceptance.sh"
MACHINES = REPO / "tests" / "fixtures" / "machines"
STEPS = (
    "venv", "torch", "deps", "snapshot", "fixture", "bootstrap", "gpu-tests", "photos", "cmd-photos", "cmd-lm",
    "cmd-ddp", "verify-image", "verify-text", "stage-data", "verify-data", "allreduce", "p2p", "verify-sweep",
    "verify-ab", "summary",
)  # fmt: skip
# What each step must run, as it appears in its command.
MUST_RUN = {
    "snapshot": "invoke snapshot --bench --out",
    "fixture": "tests/fixtures/machines",
    "bootstrap": "invoke bootstrap --json",
    "gpu-tests": "pytest -m gpu",
    "verify-image": "PRECISION=$PRECISION python -m invoke verify --json",
    "verify-text": "INVOKE_PREFLIGHT_VERIFY_DATA_KIND=tokens",
    "stage-data": "invoke stage-data --source",
    "verify-data": "verify --data",
    "allreduce": 'checks/probe/scripts/allreduce.py" --backend nccl',
    "p2p": 'checks/probe/scripts/p2p_bench.py" \'{"mib": 256',
    "verify-sweep": "verify --sweep",
    "verify-ab": "verify --ab",
    # a user's own training, unchanged (verify -- COMMAND): the agent's CUDA clocks, autocast and FLOP count
    "cmd-photos": "-- python tests/gpu/scripts/photo_classifier.py",
    "cmd-lm": "-- python tests/gpu/scripts/token_lm.py",
    "cmd-ddp": "-- python -m torch.distributed.run --standalone --nproc-per-node=$GPU_COUNT",
}


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)


def test_script_parses() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_without_an_output_folder_is_a_usage_error() -> None:
    done = run_script()
    assert done.returncode == 2 and "usage:" in done.stderr


def test_dry_run_lists_every_step_and_runs_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "ACCEPTANCE_WORK": str(tmp_path / "work")}
    done = run_script(str(tmp_path / "out"), "--dry-run", env=env)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[1:] if line.strip()}
    assert tuple(lines) == STEPS, done.stdout
    for name, line in lines.items():
        assert f"{name} " in line and "timeout" in line and line.split()[2].rstrip("s").isdigit(), line
    for name, needle in MUST_RUN.items():
        assert needle in lines[name], (name, lines[name])
    assert "gpus>=2" in lines["allreduce"] and "gpus>=2" in lines["p2p"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


@pytest.mark.slow
def test_a_spent_budget_skips_every_step_and_still_writes_the_summary(tmp_path: Path) -> None:
    env = {**os.environ, "ACCEPTANCE_WORK": str(tmp_path / "work"), "ACCEPTANCE_PYTHON": sys.executable}
    done = run_script(str(tmp_path / "out"), "--budget", "0", env=env)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "work" / "venv").exists()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in summary["steps"]] == list(STEPS[:-1])
    assert {s["status"] for s in summary["steps"]} == {"skipped"}
    assert "budget is spent" in (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")


# --- the summariser ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h200_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An output folder as a run on the H200 fixture leaves it: bootstrap's report, the snapshot, two steps."""
    tmp_path = tmp_path_factory.mktemp("h200-run")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    argv = [sys.executable, "-m", "invoke", "bootstrap", "--machine", str(MACHINES / "h200-1x.json")]
    done = subprocess.run([*argv, "--json", str(out / "bootstrap.json")], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shutil.copyfile(MACHINES / "h200-1x.json", out / "snapshot.json")
    (out / "plan.tsv").write_text(
        "name\ttimeout_s\twhen\tcommand\nsnapshot\t120\talways\tinvoke snapshot\n"
        "verify-ab\t240\talways\tinvoke verify --ab\nallreduce\t120\tgpus>=2\ttorchrun\n",
        encoding="utf-8",
    )
    (out / "steps.tsv").write_text(
        "name\tstatus\trc\tseconds\ttimeout_s\tnote\nsnapshot\tok\t0\t21\t120\t\nverify-ab\ttimeout\t124\t240\t240\t\n",
        encoding="utf-8",
    )
    (out / "logs").mkdir()
    (out / "logs" / "verify-ab.log").write_text("verify: ab\ncompiling for a long time\n", encoding="utf-8")
    return out


@pytest.mark.slow
def test_summary_gives_each_benchmark_figure_as_a_fraction_of_the_datasheet(h200_run: Path) -> None:
    assert summarise.main(["summary", str(h200_run)]) == 0
    doc = json.loads((h200_run / "summary.json").read_text(encoding="utf-8"))
    figures = {(f["source"], f["metric"]): f for f in doc["figures"]}
    # h200-1x.json's recorded benchmarks against the H200 SXM row of templates/gpus.yaml.
    for source in ("bootstrap", "snapshot"):
        assert figures[source, "gpu-matmul"]["datasheet"] == 989
        assert figures[source, "gpu-matmul"]["fraction"] == pytest.approx(748.2 / 989, abs=1e-4)
        assert figures[source, "gpu-h2d"]["fraction"] == pytest.approx(55.8 / 63, abs=1e-4)
        assert figures[source, "gpu-d2d"]["fraction"] == pytest.approx(4096.3 / 4800, abs=1e-4)
        assert figures[source, "gpu-d2h"]["gpu"] == "gpu0 NVIDIA H200"
    assert doc["machine"]["gpus"] == ["NVIDIA H200"] and doc["machine"]["torch"]
    md = (h200_run / "summary.md").read_text(encoding="utf-8")
    assert "| bootstrap | gpu0 NVIDIA H200 | gpu-matmul | 748.2 TFLOPS | 989 TFLOPS | 76% | bfloat16 |" in md


@pytest.mark.slow
def test_summary_lists_each_step_with_its_exit_code_and_seconds(h200_run: Path) -> None:
    doc = summarise.summarise(h200_run)
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["snapshot"] | {"command": ""} == {
        "name": "snapshot", "status": "ok", "rc": 0, "seconds": 21, "timeout_s": 120, "note": "", "command": "",
    }  # fmt: skip
    assert (steps["verify-ab"]["status"], steps["verify-ab"]["rc"]) == ("timeout", 124)
    assert steps["verify-ab"]["note"] == "compiling for a long time"  # the log's last line
    assert steps["allreduce"]["status"] == "not run"
    assert doc["gpu_tests"] is None and doc["verify"] == [] and doc["not_covered"]


def test_verify_mfu_and_allreduce_figures(tmp_path: Path) -> None:
    run = {"device": {"type": "cuda", "name": "NVIDIA H200"}, "precision": "bf16"}
    mfu_doc = {"value": 0.25, "note": "H200 SXM dense bf16 peak 989 TFLOPS", "peak_tflops": 989}
    report: dict[str, Any] = {"measurements": {"run": run, "mfu": mfu_doc}}
    mfu = summarise.mfu_figure("verify-image", report)
    assert mfu is not None and mfu.value == pytest.approx(247.25) and mfu.fraction == 0.25
    log = "W0101 torchrun noise\n" + json.dumps(
        {"backend": "nccl", "world_size": 2, "rows": [{"bytes": 2**20, "busbw_gb_s": 20.0}, {"bytes": 2**30, "busbw_gb_s": 350.0}]}
    )  # fmt: skip
    (tmp_path / "allreduce.json").write_text(log, encoding="utf-8")
    [busbw] = summarise.allreduce_figures(summarise._json(tmp_path / "allreduce.json") or {})
    assert busbw.value == 350.0 and busbw.fraction is None and "1024 MiB" in busbw.note


def test_gpu_test_outcomes_from_junit_xml(tmp_path: Path) -> None:
    (tmp_path / "gpu-tests.xml").write_text(
        '<testsuites><testsuite><testcase classname="t" name="a"/>'
        '<testcase classname="t" name="b"><skipped message="needs torch with CUDA"/></testcase>'
        '<testcase classname="t" name="c"><failure message="assert 0.5 &lt; 0.9"/></testcase></testsuite></testsuites>',
        encoding="utf-8",
    )
    tests = summarise.gpu_tests(tmp_path / "gpu-tests.xml")
    assert tests is not None and tests["counts"] == {"passed": 1, "failure": 1, "error": 0, "skipped": 1}
    assert {c["name"]: c["message"] for c in tests["cases"]}["t::c"] == "assert 0.5 < 0.9"


# --- the recorded fixture ---------------------------------------------------------------------------------------


def _recorded(tmp_path: Path, fixture: str, **nvml_name: str) -> Path:
    doc = json.loads((MACHINES / fixture).read_text(encoding="utf-8"))
    doc["recorded"] = True
    for gpu in doc["machine"]["nvml"]["gpus"]:
        gpu["name"] = nvml_name.get("name", gpu["name"])
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_fixture_is_named_after_the_datasheet_model_and_the_gpu_count(tmp_path: Path) -> None:
    kept = summarise.keep_fixture(_recorded(tmp_path, "h100-sxm-8x-healthy.json"), tmp_path / "fx", [tmp_path / "out"])
    assert kept == tmp_path / "fx" / "recorded-h100-sxm5-8x.json"
    assert (tmp_path / "out" / kept.name).read_bytes() == (tmp_path / "snapshot.json").read_bytes()
    odd = _recorded(tmp_path, "h200-1x.json", name="NVIDIA GeForce RTX 9999 Ti")
    assert summarise.fixture_name(json.loads(odd.read_text(encoding="utf-8"))) == "recorded-rtx-9999-ti-1x.json"


def test_a_snapshot_not_marked_recorded_is_not_kept(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not marked recorded"):
        summarise.keep_fixture(MACHINES / "h200-1x.json", tmp_path / "fx", [])
    assert not (tmp_path / "fx").exists()


# --- set-up helpers and the gpu-marked tests on this machine -------------------------------------------------------


def test_photos_are_an_image_folder_of_jpegs(tmp_path: Path) -> None:
    prepare.make_photos(tmp_path, 8)
    files = sorted(tmp_path.glob("class*/*.jpg"))
    assert len(files) == 8 and len({f.parent for f in files}) == 4
    for f in files:
        with Image.open(f) as im:
            assert im.format == "JPEG" and im.mode == "RGB"


def test_requirements_are_the_projects_dependencies() -> None:
    reqs = prepare.requirements()
    assert "invoke>=2.2,<3" in reqs and "nvidia-ml-py>=12.535" in reqs and not any("torch" in r for r in reqs)


@pytest.mark.slow
def test_gpu_marked_tests_are_skipped_with_the_reason_here() -> None:
    reason = no_gpu_reason()
    if reason is None:
        pytest.skip("this machine has an NVIDIA GPU: the gpu-marked tests run")
    # as acceptance.sh runs them: in one process (-o addopts drops -n; the GPU box installs no pytest-xdist)
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "-o", "addopts=-ra", "tests/gpu", "-rs", "-q"]
    argv += ["-p", "no:cacheprovider"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) >= 6 and all(reason in line for line in skipped), done.stdout[-2000:]
    assert " passed" not in done.stdout and " failed" not in done.stdout


def test_verify_run_counts_the_samplers_gpu_rows(tmp_path: Path) -> None:
    (tmp_path / "image.samples.csv").write_text("t_s,gpu0_util_pct\n0.0,97\n0.1,\n0.2,99\n", encoding="utf-8")
    report = {"measurements": {"run": {"device": {"type": "cuda", "name": "NVIDIA H200"}, "precision": "bf16"}}}
    run = summarise.verify_run("image", report, tmp_path / "image.samples.csv")
    assert (run["device"], run["precision"], run["gpu_samples"]) == ("NVIDIA H200", "bf16", 2)
    assert summarise.verify_run("text", report, tmp_path / "missing.csv")["gpu_samples"] is None
