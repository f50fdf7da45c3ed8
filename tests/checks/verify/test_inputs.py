"""verify's inputs and figures without a process: staged-data validation, the flags and folders checked before
anything runs, the gate on a CPU box, the step figures, the OOM search's bisection, the sweep's knee and the cost."""

from __future__ import annotations

import dataclasses
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from checks.config import make_config
from checks.errors import PreflightError
from checks.facts import MachineFacts, NvmlFacts, TorchFacts
from checks.result import Status
from checks.verify.builtin import prepare
from checks.verify.contract import Step
from checks.verify.cost import cost, describe
from checks.verify.figures import breakdown, loss_trend, percentile, step_figures, union_length
from checks.verify.plan import Options, checkpoint_dir, cpu_machine, effective, gate, outputs
from checks.verify.staged import StagedDataError, inspect_staged
from tests.factories import machine

CFG = make_config().verify


def stage_images(root: Path, n: int = 10, side: int = 8, classes: list[str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "images.npy", np.random.default_rng(0).integers(0, 255, (n, side, side, 3), dtype=np.uint8))
    np.save(root / "labels.npy", np.arange(n, dtype=np.int64) % 3)
    (root / "classes.json").write_text(json.dumps(classes or ["a", "b", "c"]))
    (root / "manifest.json").write_text(json.dumps({"count": n}))
    return root


def stage_tokens(
    root: Path, tokens: int = 1000, dtype: Any = np.uint16, manifest: dict[str, Any] | None = None
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "tokens.npy", (np.arange(tokens) % 300).astype(dtype))
    np.save(root / "doc_offsets.npy", np.array([0, tokens // 2, tokens], dtype=np.int64))
    (root / "manifest.json").write_text(json.dumps(manifest or {}))
    return root


def test_staged_images_are_described(tmp_path: Path) -> None:
    spec = inspect_staged(stage_images(tmp_path / "d"), 64)
    assert (spec.kind, spec.samples, spec.image_size, spec.classes) == ("images", 10, 8, 3)
    assert "staged at" in spec.describe()


def test_staged_tokens_take_the_vocabulary_from_the_manifest_or_the_data(tmp_path: Path) -> None:
    assert inspect_staged(stage_tokens(tmp_path / "a"), 64).vocab == 300
    spec = inspect_staged(stage_tokens(tmp_path / "b", manifest={"vocab_size": 512}), 64)
    assert (spec.kind, spec.vocab, spec.samples) == ("tokens", 512, 999 // 64)


def break_manifest(d: Path) -> None:
    (d / "manifest.json").unlink()


def bad_json(d: Path) -> None:
    (d / "manifest.json").write_text("{not json")


def float_images(d: Path) -> None:
    np.save(d / "images.npy", np.zeros((10, 8, 8, 3), dtype=np.float32))


def short_labels(d: Path) -> None:
    np.save(d / "labels.npy", np.zeros(9, dtype=np.int64))


def wrong_classes(d: Path) -> None:
    (d / "classes.json").write_text(json.dumps(["only-one"]))


def truncated(d: Path) -> None:
    (d / "images.npy").write_bytes((d / "images.npy").read_bytes()[:100])


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (break_manifest, "manifest.json is missing"),
        (bad_json, "not valid JSON"),
        (float_images, "must be uint8 N x S x S x 3"),
        (short_labels, "must be 10 integers"),
        (wrong_classes, "outside 0..0"),
        (truncated, "not a readable .npy"),
        (lambda d: (d / "labels.npy").unlink(), "labels.npy is missing"),
        (lambda d: [(d / n).unlink() for n in ("images.npy", "labels.npy")], "neither images.npy nor tokens.npy"),
    ],
)
def test_a_broken_staged_directory_is_one_clear_error(tmp_path: Path, damage: Any, needle: str) -> None:
    d = stage_images(tmp_path / "d")
    damage(d)
    with pytest.raises(StagedDataError, match=needle):
        inspect_staged(d, 64)


def test_broken_token_layouts(tmp_path: Path) -> None:
    with pytest.raises(StagedDataError, match="1-D uint16 or uint32"):
        inspect_staged(stage_tokens(tmp_path / "a", dtype=np.int64), 64)
    with pytest.raises(StagedDataError, match="fewer than one window"):
        inspect_staged(stage_tokens(tmp_path / "b", tokens=50), 64)
    with pytest.raises(StagedDataError, match="not a directory"):
        inspect_staged(tmp_path / "nothing", 64)


def record(wait: float, fwd: float = 0.03, ckpt_loss: float = 1.0) -> Step:
    return Step(data_wait=wait, h2d=0.001, forward=fwd, backward=0.05, optimizer=0.009, loss=ckpt_loss)


def test_breakdown_shares_add_up_to_one_with_the_checkpoint_amortised() -> None:
    records = [record(0.01), record(0.03)]
    shares = breakdown(records, checkpoint_s_per_step=0.01)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["data_wait"] == pytest.approx(0.02 / 0.12) and shares["checkpoint"] == pytest.approx(0.01 / 0.12)


def test_step_figures() -> None:
    f = step_figures([record(0.0), record(0.01), record(0.1)], samples_per_step=32, tokens_per_sample=10)
    assert f.median_s == pytest.approx(0.1) and f.p95_s == pytest.approx(0.19)
    assert f.samples_per_s == pytest.approx(96 / sum(0.09 + w for w in (0, 0.01, 0.1)))
    assert f.samples_per_s is not None and f.tokens_per_s == pytest.approx(10 * f.samples_per_s)
    assert percentile([1, 2, 3, 4], 0.5) == 2


def test_union_of_overlapping_kernels() -> None:
    assert union_length([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
    assert union_length([]) == 0


def test_loss_trend() -> None:
    assert loss_trend([3.0, 2.5, 2.0, 1.0])["decreasing"] is True
    assert loss_trend([1.0, 1.0, 1.0, 1.0])["decreasing"] is False
    nan = loss_trend([1.0, float("nan")])
    assert nan["finite"] is False and nan["decreasing"] is False


def test_largest_fit_halves_then_bisects() -> None:
    from checks.verify.figures import largest_fit

    tried: list[int] = []

    def fits(b: int) -> bool:
        tried.append(b)
        return b <= 40

    assert largest_fit(fits, 256) == 40
    assert tried[:3] == [128, 64, 32]
    assert largest_fit(lambda b: False, 8) == 0


def test_knee_is_the_smallest_batch_near_the_best_throughput() -> None:
    from checks.verify.figures import knee_batch

    rows: list[dict[str, Any]] = [{"batch": 32, "samples_per_s": 100.0}, {"batch": 64, "samples_per_s": 190.0}, {"batch": 128, "samples_per_s": 199.0}, {"batch": 256, "oom": True}]  # fmt: skip
    assert knee_batch(rows, 0.95) == 64
    assert knee_batch([], 0.95) is None


def test_cost_per_epoch_and_per_lost_share() -> None:
    shares = {"data_wait": 0.4, "h2d": 0.0, "checkpoint": 0.1}
    c = cost(2.0, step_s=0.5, samples_per_step=100, shares=shares, epoch_samples=720_000)
    assert c["epoch_steps"] == 7200 and c["epoch_hours"] == 1.0 and c["per_epoch"] == 2.0
    assert c["lost"] == {"data_wait": 0.8, "h2d": 0.0, "checkpoint": 0.2}
    assert describe(c) == "$2.00 per epoch at $2/h (1.00 h); data wait costs $0.80 of it"
    synthetic = cost(2.0, 0.5, 100, shares, None, tokens_per_sample=1000)
    assert synthetic["lost_unit"] == "per_million_samples" and synthetic["per_million_tokens"] > 0


def test_flags_are_validated_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match="device must be one of auto, cuda, cpu"):
        effective(CFG, Options(device="tpu"))
    with pytest.raises(PreflightError, match="the price per hour cannot be negative, got -1") as info:
        effective(CFG, Options(price_per_hour=-1))
    assert "--price-per-hour or preflight.verify.price_per_hour" in str(info.value)
    with pytest.raises(PreflightError, match="--batch-size cannot be negative, got -2"):
        effective(CFG, Options(batch_size=-2))
    assert effective(CFG, Options(steps=7, ckpt_every=3)).steps == 7


def test_an_unwritable_checkpoint_directory_is_refused(tmp_path: Path) -> None:
    from contextlib import ExitStack

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with ExitStack() as stack, pytest.raises(PreflightError, match="is not writable"):
        checkpoint_dir(Options(ckpt_dir=str(blocker / "sub")), CFG, stack)


def test_a_checkpoint_directory_verify_created_is_gone_after_it_unless_something_stayed(tmp_path: Path) -> None:
    from contextlib import ExitStack

    with ExitStack() as stack:
        made, temporary = checkpoint_dir(Options(ckpt_dir=str(tmp_path / "ckpt" / "run1")), CFG, stack)
        assert made == str(tmp_path / "ckpt" / "run1") and not temporary and Path(made).is_dir()
    assert list(tmp_path.iterdir()) == []  # both folders it made, and nothing above them
    with ExitStack() as stack:
        made, _ = checkpoint_dir(Options(ckpt_dir=str(tmp_path / "ckpt" / "run2")), CFG, stack)
        (Path(made) / "keep.pt").write_bytes(b"x")  # something else wrote there meanwhile: left alone
    assert (tmp_path / "ckpt" / "run2" / "keep.pt").exists()
    (tmp_path / "mine").mkdir()
    with ExitStack() as stack:
        checkpoint_dir(Options(ckpt_dir=str(tmp_path / "mine")), CFG, stack)
    assert (tmp_path / "mine").is_dir()  # the user's own folder stays, empty or not


def test_outputs_go_beside_the_json_or_into_the_report_dir(tmp_path: Path) -> None:
    json_path, csv, png = outputs(str(tmp_path / "a" / "r.json"), "", CFG)
    assert (json_path, csv.name, png.name) == (str(tmp_path / "a" / "r.json"), "r.samples.csv", "r.png")
    json_path, csv, png = outputs("-", str(tmp_path / "p.png"), CFG)
    assert json_path == "-" and csv.parent.name == "reports" and png == tmp_path / "p.png"


def test_a_cpu_machine_does_not_fail_the_gate_on_the_missing_driver() -> None:
    cfg = make_config()
    cpu = MachineFacts(
        NvmlFacts(error="NVML could not load", error_kind="library-not-found"),
        TorchFacts(version="2.13.0+cpu"),
        machine().host,
    )
    assert cpu_machine(cpu)
    results = {r.id: r for r in gate(cpu, cfg)}
    assert results["driver"].status is Status.SKIP and results["alloc-conf"].status is Status.SKIP
    cuda_torch = TorchFacts(version="2.8.0+cu128", cuda="12.8")
    gpu_box = dataclasses.replace(cpu.host, nvidia_pci_gpus=1)  # a GPU on the bus: the CUDA torch wants its driver
    assert {r.id: r for r in gate(MachineFacts(cpu.nvml, cuda_torch, gpu_box), cfg)}["driver"].status is Status.FAIL
    cpu_vm = dataclasses.replace(cpu.host, nvidia_pci_gpus=0)  # none on the bus: the CUDA wheel trains on the CPU
    assert {r.id: r for r in gate(MachineFacts(cpu.nvml, cuda_torch, cpu_vm), cfg)}["driver"].status is Status.SKIP


def test_synthetic_data_is_read_in_the_training_process_and_not_called_staged(tmp_path: Path) -> None:
    from tests.fakes.builtin import config
    from tests.fakes.builtin import machine as this_box

    with ExitStack() as stack:
        b, _ = prepare(Options(json=str(tmp_path / "r.json")), config(), this_box, stack, 2)
    assert b.loader["num_workers"] == 0 and b.loader_note.startswith("synthetic data, made in memory")
    assert "staged" not in b.loader_note and b.epoch_samples is None
    assert b.command[b.command.index("--data") + 1] == "synthetic-images"


def test_staged_data_is_the_scripts_data_and_its_epoch(tmp_path: Path) -> None:
    from tests.fakes.builtin import config
    from tests.fakes.builtin import machine as this_box

    staged = stage_images(tmp_path / "staged", n=40)
    with ExitStack() as stack:
        b, _ = prepare(Options(data=str(staged)), config(), this_box, stack, 2)
    assert b.command[b.command.index("--data") + 1] == str(staged) and b.epoch_samples == 40
    assert b.loader["num_workers"] == 0 and "staged data: read in the training process" in b.loader_note
