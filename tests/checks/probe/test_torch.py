"""The torch side of the seam, run for real: child processes, a login shell, the CPU torch installed here."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from checks.facts import ExtensionFacts, TorchFacts
from checks.probe.torch import ChildFailed, read_alloc, read_torch, run_bench, run_child
from provision.alloc_env import ensure_alloc_conf

pytestmark = pytest.mark.slow


def test_read_torch_on_this_machine() -> None:
    facts = read_torch()
    import torch

    assert facts.error is None
    assert facts.version == torch.__version__
    assert facts.cuda == torch.version.cuda
    assert facts.cuda_available is torch.cuda.is_available()


def _fake_torch(tmp_path: Path, body: str) -> dict[str, str]:
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}


def test_missing_and_broken_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _fake_torch(tmp_path, "raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    facts = read_torch()
    assert (facts.error_kind, facts.error) == ("missing", "torch is not installed")
    (tmp_path / "fake" / "torch" / "__init__.py").write_text(
        "raise OSError('libcudart.so.12: cannot open shared object file')\n"
    )
    facts = read_torch()
    assert facts.error_kind == "import-error" and "libcudart.so.12" in (facts.error or "")


def _fake_torchvision(root: Path, body: str, version: str = "0.28.0") -> None:
    """A ``torchvision`` package with its dist-info, as pip would leave it, whose ``__init__`` is ``body``."""
    (root / "torchvision").mkdir(parents=True, exist_ok=True)
    (root / "torchvision" / "__init__.py").write_text(body)
    info = root / f"torchvision-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchvision\nVersion: {version}\n")


def _extension(facts: TorchFacts, name: str) -> ExtensionFacts:
    assert facts.error is None and facts.extensions is not None
    return {e.name: e for e in facts.extensions}[name]


def test_a_torchvision_built_for_another_torch_is_caught_at_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a CUDA torchvision does beside a CPU torch: its meta registrations raise at import."""
    _fake_torchvision(tmp_path, "raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    row = _extension(read_torch(), "torchvision")
    assert (row.version, row.op) == ("0.28.0", "torchvision::nms")
    assert row.error == "RuntimeError: operator torchvision::nms does not exist"


def test_a_torchvision_without_its_compiled_ops_fails_at_the_op_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It imports, but its library never registered torchvision::nms with this torch: the real op lookup fails."""
    _fake_torchvision(tmp_path, "__version__ = '0.28.0+cu128'\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    row = _extension(read_torch(), "torchvision")
    assert row.version == "0.28.0+cu128" and row.error and "nms" in row.error


def test_a_torchvision_whose_op_runs_is_recorded_with_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = (
        "import torch\n__version__ = '0.28.0+cpu'\n"
        "_lib = torch.library.Library('torchvision', 'DEF')\n"
        "_lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')\n"
        "_lib.impl('nms', lambda dets, scores, iou: torch.zeros(0, dtype=torch.long), 'CPU')\n"
    )
    _fake_torchvision(tmp_path, body)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    facts = read_torch()
    row = _extension(facts, "torchvision")
    assert (row.version, row.op, row.error) == ("0.28.0+cpu", "torchvision::nms", None)
    if importlib.util.find_spec("torchaudio") is None:
        assert _extension(facts, "torchaudio") == ExtensionFacts("torchaudio")  # not installed: no version


def test_a_hanging_child_is_killed_at_the_timeout(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    start = time.monotonic()
    with pytest.raises(ChildFailed) as info:
        run_child([sys.executable, str(script)], timeout=1.0)
    assert info.value.kind == "timeout"
    assert time.monotonic() - start < 10
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []


def test_read_torch_timeout_is_a_fact_not_an_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _fake_torch(tmp_path, "import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    facts = read_torch(timeout=1.0)
    assert facts.error_kind == "timeout" and "1 s" in (facts.error or "")


def test_a_crashing_child_reports_its_last_stderr_line(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text("import sys\nprint('Segmentation fault', file=sys.stderr)\nsys.exit(139)\n")
    with pytest.raises(ChildFailed, match="exited with 139: Segmentation fault") as info:
        run_child([sys.executable, str(script)], timeout=10)
    assert info.value.kind == "crashed"


def test_children_run_outside_the_checkout(tmp_path: Path) -> None:
    """Run from the repository, ``datasets/`` would shadow Hugging Face's package in the child."""
    script = tmp_path / "cwd.py"
    script.write_text("import json, os\nprint(json.dumps({'cwd': os.getcwd()}))\n")
    cwd = run_child([sys.executable, str(script)], timeout=10)["cwd"]
    assert not (Path(cwd) / "tasks.py").exists()


def test_benchmark_timing_code_runs_on_the_cpu() -> None:
    settings = {"device": "cpu", "copy_mib": 8, "d2d_mib": 8, "matmul_n": 128, "warmup": 1, "repeats": 3}
    facts = run_bench(settings, timeout=60)
    assert facts.skipped is None
    [row] = facts.gpus
    assert row.h2d_gb_s and row.h2d_gb_s > 0 and row.d2d_gb_s and row.d2d_gb_s > 0
    assert row.matmul_tflops and row.matmul_tflops > 0 and row.matmul_dtype == "float32"


def test_benchmark_without_cuda_says_why() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    facts = run_bench({"copy_mib": 1, "d2d_mib": 1, "matmul_n": 8, "warmup": 0, "repeats": 1}, timeout=60)
    assert facts.skipped and "CUDA is not available" in facts.skipped


def test_alloc_read_back_through_a_fresh_login_shell(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "PYTORCH_CUDA_ALLOC_CONF": "leaked:1"}
    nothing = read_alloc("expandable_segments:True", ("PYTORCH_CUDA_ALLOC_CONF",), 60, environ=env)
    assert nothing.env_seen is None  # the caller's own variable must not count as proof
    ensure_alloc_conf([home / ".profile"], "expandable_segments:True", ("PYTORCH_CUDA_ALLOC_CONF",))
    seen = read_alloc("expandable_segments:True", ("PYTORCH_CUDA_ALLOC_CONF",), 60, environ=env)
    assert seen.env_seen == "expandable_segments:True"
    torch = pytest.importorskip("torch")
    if not hasattr(torch._C, "_accelerator_getAllocatorSettings"):
        pytest.skip(f"torch {torch.__version__} cannot parse allocator settings without a GPU: the shell part passed")
    assert seen.torch_settings == "expandable_segments:True" and seen.source == "accelerator-api"


def test_alloc_value_torch_rejects_is_reported(tmp_path: Path) -> None:
    import torch

    if not hasattr(torch._C, "_accelerator_getAllocatorSettings"):
        pytest.skip("this torch cannot parse allocator settings without a GPU")
    home = tmp_path / "home"
    ensure_alloc_conf([home / ".profile"], "expandable_segments:Tru", ("PYTORCH_CUDA_ALLOC_CONF",))
    facts = read_alloc(
        "expandable_segments:Tru", ("PYTORCH_CUDA_ALLOC_CONF",), 60, environ={**os.environ, "HOME": str(home)}
    )
    assert facts.error and "Tru" in facts.error


def test_several_checkpoints_are_read_by_one_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify's resume replay reads the last file saved and the first one kept aside: one ``import torch``."""
    import torch

    from checks.probe import torch as probe_torch

    good, gone = tmp_path / "a.pt", tmp_path / "gone.pt"
    torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "step": 4}, good)
    children: list[list[str]] = []
    real = probe_torch.run_child

    def counted(argv: list[str], timeout: float) -> dict[str, object]:
        children.append(argv)
        return real(argv, timeout)

    monkeypatch.setattr(probe_torch, "run_child", counted)
    first, second = probe_torch.read_checkpoints([str(good), str(gone)], timeout=60)
    assert len(children) == 1 and children[0][-2:] == [str(good), str(gone)]
    assert first["model"]["tensors"] == 2 and first["position"] == {"step": 4.0}
    assert "error" in second and "error" not in first
    assert probe_torch.read_checkpoint(str(good), timeout=60)["position"] == {"step": 4.0}  # one file: as before
