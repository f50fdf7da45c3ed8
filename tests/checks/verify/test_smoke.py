"""The smoke loop's parts without a child process: staged-data validation, datasets, batch order, figures,
checkpoint helpers, OOM search, sweep knee, cost, and verify's input checks.

The child's modules (ckpt, extras, models, setup) import torch: the tests of those take the ``torch`` fixture and
import them inside, so the rest of the file runs (and the torch ones skip with the reason) where torch is missing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from checks.config import make_config
from checks.errors import PreflightError
from checks.facts import MachineFacts, NvmlFacts, TorchFacts
from checks.result import Status
from checks.usercode import required_arguments
from checks.verify.contract import DeviceEvent, OomProbeEvent, PhaseEvent, Step, StepEvent
from checks.verify.cost import cost, describe
from checks.verify.figures import breakdown, loss_trend, percentile, step_figures, union_length
from checks.verify.plan import Options, checkpoint_dir, cpu_machine, effective, gate, outputs, plan, progress
from checks.verify.smoke.data import (
    FEWER_THAN_A_BATCH,
    EpochBatches,
    StagedDataError,
    StagedImages,
    SyntheticImages,
    SyntheticTokens,
    inspect_staged,
    synthetic_spec,
)
from tests.factories import machine

CFG = make_config().verify


@pytest.fixture
def torch() -> ModuleType:
    return pytest.importorskip("torch")


@pytest.fixture
def ckpt(torch: ModuleType) -> ModuleType:
    from checks.verify.smoke import ckpt

    return ckpt


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


def test_staged_dataset_pickles_as_a_path_and_reads_rows(tmp_path: Path) -> None:
    spec = inspect_staged(stage_images(tmp_path / "d"), 64)
    ds = StagedImages(spec)
    image, label = ds[4]
    assert image.shape == (8, 8, 3) and image.dtype == np.uint8 and label == 1
    assert image.flags.writeable  # a copy, not a read-only view of the memory map
    assert len(pickle.dumps(ds)) < 1000  # a spawn/forkserver worker gets the path, not the array
    assert np.array_equal(pickle.loads(pickle.dumps(ds))[4][0], image)


def test_synthetic_data_is_deterministic_and_learnable_shaped() -> None:
    images = SyntheticImages(synthetic_spec("images", 16, 10, 0), seed=0)
    a, b = images[123], images[123]
    assert np.array_equal(a[0], b[0]) and a[1] == 3 and a[0].shape == (16, 16, 3)
    tokens = SyntheticTokens(synthetic_spec("tokens", 0, 0, 32), seed=0)
    x, y = tokens[5]
    assert x.shape == y.shape == (32,) and np.array_equal(x[1:], y[:-1])
    successors = tokens.successors
    assert all(int(y[t]) in successors[int(x[t])] for t in range(32))


def test_batch_order_resumes_exactly_from_a_saved_position() -> None:
    whole = EpochBatches(100, 8, seed=3)
    first = list(whole)  # epoch 0
    whole.epoch = 1
    second = list(whole)
    resumed = EpochBatches(100, 8, seed=3, epoch=0, start=5)
    assert list(resumed) == first[5:]
    resumed.epoch = 1
    assert list(resumed) == second  # the offset applies to the epoch it was saved in only
    assert first != second and len(first) == 12


def test_a_dataset_smaller_than_one_batch_is_refused() -> None:
    with pytest.raises(StagedDataError, match="fewer than one batch") as caught:
        EpochBatches(5, 8, seed=0)
    assert caught.value.hint == FEWER_THAN_A_BATCH


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


def test_strip_prefixes_of_wrappers(ckpt: ModuleType) -> None:
    state = {"module.fc.weight": 1, "_orig_mod.module.fc.bias": 2, "head.w": 3}
    assert ckpt.strip_prefixes(state) == {"fc.weight": 1, "fc.bias": 2, "head.w": 3}


def test_checkpoint_holds_every_rng_and_loads_with_weights_only(
    tmp_path: Path, torch: ModuleType, ckpt: ModuleType
) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leave a cached gaussian in numpy's state
    saved = ckpt.save_atomic({"rng": ckpt.rng_state(), "w": torch.ones(3)}, tmp_path)
    expected = (random.random(), np.random.random(), torch.rand(1).item())
    restored, seconds = ckpt.load(saved.path, torch.device("cpu"))  # weights_only=True inside
    ckpt.set_rng_state(restored["rng"])
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected
    assert saved.bytes == os.path.getsize(saved.path) and seconds >= 0
    assert [p.name for p in tmp_path.iterdir()] == [ckpt.CHECKPOINT_NAME]  # no temporary file left behind


class _OnTheGpu:
    """A tensor as ``torch.load(map_location="cuda")`` returns it, for the setters' sake: ``.numpy()`` raises
    torch's own TypeError for a CUDA tensor, the setters refuse it, ``.cpu()`` gives the host copy back."""

    def __init__(self, host: Any) -> None:
        self.host = host

    def numpy(self) -> Any:
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")  # fmt: skip

    def cpu(self) -> Any:
        return self.host


def test_rng_states_loaded_onto_the_gpu_are_restored(tmp_path: Path, torch: ModuleType, ckpt: ModuleType) -> None:
    """Found on a rented H200 (tests/gpu/acceptance.sh): the round trip loads with map_location="cuda", so the
    saved RNG tensors came back on the GPU and numpy's setter raised; the check failed on every GPU."""
    state = ckpt.rng_state()
    expected = (np.random.random(), torch.rand(1).item())
    on_gpu = state | {"torch": _OnTheGpu(state["torch"])}
    on_gpu["numpy"] = state["numpy"] | {"keys": _OnTheGpu(state["numpy"]["keys"])}
    ckpt.set_rng_state(on_gpu)
    assert (np.random.random(), torch.rand(1).item()) == expected


def test_compare_is_bit_for_bit_unless_a_tolerance_is_set(ckpt: ModuleType) -> None:
    assert ckpt.compare([1.0, 2.0], [1.0, 2.0], 0.0)["reproduced"] is True
    assert ckpt.compare([1.0, 2.0], [1.0, 2.0000001], 0.0)["reproduced"] is False
    assert ckpt.compare([1.0, 2.0], [1.0, 2.0000001], 1e-6)["reproduced"] is True


def test_same_batches_tells_order_from_augmentation(torch: ModuleType, ckpt: ModuleType) -> None:
    batch = [torch.arange(6).view(2, 3), torch.tensor([0, 1])]
    augmented = [batch[0] + 1, batch[1].clone()]
    reordered = [batch[0].flip(0), batch[1].flip(0)]
    assert ckpt.same_batches([batch], [[t.clone() for t in batch]])["exact"] is True
    found = ckpt.same_batches([batch, batch], [batch, augmented])
    assert found["exact"] is False and found["order_same"] is True and found["first_difference"] == 1
    assert ckpt.same_batches([batch], [reordered])["order_same"] is False
    assert ckpt.same_batches([batch], [[batch[0].int(), batch[1]]])["exact"] is False  # a dtype is a difference
    # Boxes flipped with the image: inputs and targets both differ, yet the sampler yielded the same indices.
    flipped = [batch[0].flip(1), batch[1].flip(0)]
    told = ckpt.same_batches([batch], [flipped], ([[4, 7]], [[4, 7]]))
    assert told["order_same"] is True and told["differs"] == ["inputs", "targets"] and told["exact"] is False
    assert ckpt.same_batches([batch], [flipped], ([[4, 7]], [[7, 4]]))["order_same"] is False
    assert found["differs"] == ["inputs"]


def test_a_feed_names_the_indices_of_each_batch_and_resumes_them(torch: ModuleType) -> None:
    from checks.verify.smoke.data import EpochBatches
    from checks.verify.smoke.loop import Feed

    data = torch.utils.data.TensorDataset(torch.arange(10.0), torch.arange(10))
    feed = Feed(data, 3, seed=5, loader={"num_workers": 0})
    drawn = []
    for _ in range(4):  # 3 batches an epoch: the fourth is the next epoch's first
        batch = feed.next()
        assert batch[1].tolist() == feed.last_indices  # the targets are the indices here
        drawn.append(feed.last_indices)
    assert drawn[:3] == list(EpochBatches(10, 3, 5, epoch=0)) and drawn[3] == next(iter(EpochBatches(10, 3, 5, 1)))
    resumed = Feed(data, 3, seed=5, loader={"num_workers": 0}, epoch=0, start=1)
    resumed.next()
    assert resumed.last_indices == drawn[1]


def test_replay_draws_from_the_resumed_feed_and_hands_out_the_kept_batches(torch: ModuleType, ckpt: ModuleType) -> None:
    class Counter:
        n = 0

        def next(self) -> Any:
            self.n += 1
            return [torch.tensor([self.n])]

    recording = ckpt.Recording(Counter())
    first = [recording.next(), recording.next()]
    first[0][0] += 100  # a model that changes its input in place does not change what was kept
    replay = ckpt.Replay(Counter(), recording.kept)
    assert [replay.next()[0].item(), replay.next()[0].item()] == [1, 2]
    assert [b[0].item() for b in replay.drawn] == [1, 2] and replay.feed.n == 2


@pytest.mark.parametrize("dtype", ["int64", "int32", "int16", "uint16"])
def test_the_text_model_takes_any_integer_width_and_starts_near_uniform(dtype: str, torch: ModuleType) -> None:
    from checks.verify.smoke.models import build_model, default_loss

    torch.manual_seed(0)
    model = build_model({"kind": "tokens", "vocab": 256, "seq_len": 32}, "small")
    ids = torch.randint(0, 256, (4, 33)).to(getattr(torch, dtype))
    loss = default_loss(model(ids[:, :-1]), ids[:, 1:]).item()
    assert abs(loss - math.log(256)) < 1.5, loss


def test_a_factory_that_needs_arguments_is_a_usage_error(torch: ModuleType) -> None:
    from checks.verify.smoke.setup import UsageError, call_factory

    def needs(root: str, augment: bool = True) -> None: ...

    def free(size: int = 3, *rest: Any, **more: Any) -> int:
        return size

    assert required_arguments(needs) == ["root"] and required_arguments(free) == []
    assert call_factory("--model", "m:free", free) == 3
    with pytest.raises(UsageError, match=r"--dataset m:needs needs arguments \(root\).*def make\(\): return needs"):
        call_factory("--dataset", "m:needs", needs)


def test_largest_fit_halves_then_bisects(torch: ModuleType) -> None:
    from checks.verify.figures import largest_fit

    tried: list[int] = []

    def fits(b: int) -> bool:
        tried.append(b)
        return b <= 40

    assert largest_fit(fits, 256) == 40
    assert tried[:3] == [128, 64, 32]
    assert largest_fit(lambda b: False, 8) == 0


def test_knee_is_the_smallest_batch_near_the_best_throughput(torch: ModuleType) -> None:
    from checks.verify.figures import knee_batch

    rows: list[dict[str, Any]] = [{"batch": 32, "samples_per_s": 100.0}, {"batch": 64, "samples_per_s": 190.0}, {"batch": 128, "samples_per_s": 199.0}, {"batch": 256, "oom": True}]  # fmt: skip
    assert knee_batch(rows, 0.95) == 64
    assert knee_batch([], 0.95) is None


def test_flop_count_of_one_step_is_forward_and_backward_times_accumulation(torch: ModuleType) -> None:
    """The child counts FLOPs only on a GPU (for MFU); the counter itself runs anywhere: Linear(32 -> 8), batch 4."""
    from checks.verify.smoke.extras import count_flops
    from checks.verify.smoke.loop import HostClock, Trainer

    model = torch.nn.Linear(32, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy
    batch = (torch.randn(4, 32), torch.zeros(4, dtype=torch.long))
    forward = 2 * 4 * 32 * 8  # one multiply-add per weight and sample
    # backward: the weight's gradient costs as much again; the input needs none (it is the first layer)
    for accum in (1, 3):
        trainer = Trainer(model, optimizer, loss, torch.device("cpu"), HostClock(), accum=accum)
        assert count_flops(trainer, batch) == (2 * forward * accum, None)
        assert all(p.grad is None for p in model.parameters())  # the counted step leaves no gradient behind

    def broken_loss(out: Any, target: Any) -> Any:
        raise ZeroDivisionError("division by zero")

    broken = Trainer(model, optimizer, broken_loss, torch.device("cpu"), HostClock())
    flops, note = count_flops(broken, batch)
    assert flops is None and note is not None and note.startswith("FLOP counting failed: ZeroDivisionError")


def test_kernel_summary(torch: ModuleType) -> None:
    from checks.verify.smoke.extras import kernel_summary

    kernels = [(0, 4_000), (5_000, 9_000), (10_000, 100_000)]  # ns
    s = kernel_summary(kernels, compute_s=200e-6, steps=2)
    assert s["kernels_per_step"] == 1.5 and s["median_kernel_us"] == 4.0
    assert s["busy_fraction"] == pytest.approx(98e-6 / 200e-6)
    assert s["short_kernel_time_share"] == pytest.approx(8_000 / 98_000)


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


def test_progress_lines() -> None:
    assert progress(PhaseEvent("measure")) == "verify: measure"
    assert progress(StepEvent("measure", 10, 30)) == "verify: measure step 10/30"
    assert progress(StepEvent("measure", 11, 30)) is None
    assert progress(OomProbeEvent(64)) == "verify: oom-probe batch 64"
    assert progress(DeviceEvent("cpu", "cpu")) is None


def test_the_child_writes_its_result_through_the_contract(torch: ModuleType) -> None:
    from checks.verify.contract import ChildResult
    from checks.verify.smoke.child import typed

    step = {"data_wait": 0.1, "h2d": 0.0, "forward": 0.2, "backward": 0.3, "optimizer": 0.05}
    good = {"interrupted": False, "error": None, "timeline": {"setup": [1.0, 2.5]}, "warmup": [], "steps": [step]}
    out = typed(good | {"phase": "measure"})
    assert ChildResult.from_json(out).steps[0].forward == 0.2 and out["phase"] == "measure"
    assert "ranks" not in out and "ddp" not in out  # left out when empty, as the parent expects
    # A key the contract lacks is the child's error, with the timeline kept; never a result the parent rejects.
    bad = typed(good | {"phase": "measure", "loader_alonee": {"samples_s": 3}})
    assert bad["error_kind"] == "crash" and "unknown key 'loader_alonee'" in bad["error"]
    assert bad["timeline"] == {"setup": [1.0, 2.5]} and ChildResult.from_json(bad).error == bad["error"]


def test_every_tensor_of_a_nested_batch_is_moved(torch: ModuleType) -> None:
    from collections import namedtuple

    from checks.verify.smoke.loop import to_device

    Pair = namedtuple("Pair", "image boxes")
    batch = {"input_ids": torch.ones(2, 3), "extra": [torch.zeros(1), (torch.ones(1), "name")]}
    batch["pair"] = Pair(torch.ones(2), {"boxes": torch.zeros(4, 4)})
    moved = to_device(batch, torch.device("meta"))  # a device every CPU build has
    assert moved["input_ids"].is_meta and moved["extra"][0].is_meta and moved["extra"][1][0].is_meta
    assert moved["extra"][1][1] == "name" and isinstance(moved["pair"], Pair)
    assert moved["pair"].image.is_meta and moved["pair"].boxes["boxes"].is_meta
    assert not batch["input_ids"].is_meta  # the batch itself is left as it was


def test_the_resumed_trainer_takes_its_loss_from_the_reloaded_model(torch: ModuleType) -> None:
    from types import SimpleNamespace

    from checks.verify.smoke.loop import HostClock, Trainer
    from checks.verify.smoke.setup import Build, loss_of, make_optimizer

    class Headed(torch.nn.Module):  # type: ignore[name-defined]  # a detection adapter: its loss runs its own layer
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

        def forward(self, x: Any) -> Any:
            return self.body(x)

        def loss(self, out: Any, target: Any) -> Any:
            return torch.nn.functional.cross_entropy(self.head(out), target)

    cpu = torch.device("cpu")
    old = Headed()
    opt = make_optimizer(old, 0.1)
    trainer = Trainer(old, opt, loss_of(old), cpu, HostClock(), 1, None)
    spec = SimpleNamespace(lr=0.1)
    b = Build(spec, cpu, None, {}, Headed, "fp32", trainer, None, 2, {})  # type: ignore[arg-type]
    fresh = b.fresh_trainer({"model": old.state_dict(), "optimizer": opt.state_dict()})
    assert fresh.loss_fn.__self__ is fresh.model and fresh.model is not old  # type: ignore[attr-defined]
    fresh.loss_fn(fresh.model(torch.ones(3, 4)), torch.tensor([0, 1, 0])).backward()
    assert fresh.model.head.weight.grad is not None and old.head.weight.grad is None  # the new model trains
    assert loss_of(torch.nn.Linear(2, 2)).__name__ == "default_loss"


def test_synthetic_data_is_not_called_staged(tmp_path: Path) -> None:
    from contextlib import ExitStack

    from tests.fakes.smoke import config
    from tests.fakes.smoke import machine as this_box

    with ExitStack() as stack:
        p, _ = plan(Options(json=str(tmp_path / "r.json")), config(), this_box, stack)
    assert p.loader["num_workers"] == 0 and p.loader_note.startswith("synthetic data, made in memory")
    assert "staged" not in p.loader_note


def test_a_device_the_box_lacks_is_not_pointed_at_the_model_docs() -> None:
    from checks.verify.contract import ChildResult, ChildRun
    from checks.verify.plan import Outcome, raise_usage
    from checks.verify.sampler import Trace

    def refused(error: str, hint: str | None = None) -> PreflightError:
        child = ChildRun(result=ChildResult(error=error, error_kind="usage", error_hint=hint))
        with pytest.raises(PreflightError) as caught:
            raise_usage(Outcome(child, Trace([], 0.1), None, None))
        return caught.value

    device = refused("--device cuda, but torch cannot use CUDA here (see bootstrap's torch-build and cuda-compat)")
    assert "docs/verify.md" not in str(device) and "run without --device cuda" in str(device)
    assert "--model/--dataset convention" in str(refused("--model mod:fn: no such module"))
    # a usage error that brings its own fix (staged data with fewer samples than one batch) gets that fix
    few = refused("the dataset holds 26 samples: fewer than one batch of 32", FEWER_THAN_A_BATCH)
    assert "pass a smaller --batch-size (it is per rank)" in str(few) and "docs/verify.md" not in str(few)
