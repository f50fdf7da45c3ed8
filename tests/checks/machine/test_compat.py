from __future__ import annotations

import re
from pathlib import Path

import pytest

from checks.facts import ExtensionFacts
from checks.machine import compat
from checks.result import Status
from checks.snapshot import load_snapshot
from tests.factories import config, gpu, machine


def _one(results):
    assert len(results) == 1
    return results[0]


def test_driver_ok_reports_versions() -> None:
    r = _one(compat.driver(machine(), config()))
    assert r.status is Status.OK and r.value == {"driver": "570.124.06", "cuda": "12.8", "gpus": 1}


def test_driver_loaded_but_no_gpu_visible_fails() -> None:
    r = _one(compat.driver(machine(gpus=()), config()))
    assert r.status is Status.FAIL and "VISIBLE_DEVICES" in (r.hint or "")


NO_LIBRARY = {"error": "NVML could not load: NVML Shared Library Not Found", "error_kind": "library-not-found"}


@pytest.mark.parametrize(
    ("on_bus", "status", "words"),
    [
        (0, Status.SKIP, "no NVIDIA GPU on this machine's PCI bus and no driver: a CPU machine"),
        (None, Status.FAIL, "NVML Shared Library Not Found"),  # the bus not read (an older snapshot): cannot tell
        (2, Status.FAIL, "NVML Shared Library Not Found"),  # GPUs there, no driver: the fault a GPU box can have
    ],
)
def test_no_driver_is_a_fault_only_where_the_bus_holds_an_nvidia_gpu(
    on_bus: int | None, status: Status, words: str
) -> None:
    """A CPU VM with torch's default CUDA wheel is no broken GPU box: bootstrap must not exit 1 on it."""
    r = _one(compat.driver(machine(gpus=(), nvml=NO_LIBRARY, host={"nvidia_pci_gpus": on_bus}), config()))
    assert r.status is status and words in r.summary
    if on_bus:
        assert (r.hint or "").startswith("2 NVIDIA GPU(s) on the PCI bus, but no driver to use them: ")


def test_driver_version_mismatch_hint() -> None:
    m = machine(
        nvml={
            "error": "NVML could not load: RM has detected an NVML/RM version mismatch.",
            "error_kind": "version-mismatch",
        }
    )
    r = _one(compat.driver(m, config()))
    assert r.status is Status.FAIL and "reboot" in (r.hint or "")


def test_missing_torch_names_the_variant_that_fits_the_driver() -> None:
    r = _one(compat.torch_build(machine(torch={"error": "torch is not installed", "error_kind": "missing"}), config()))
    assert r.status is Status.FAIL and "/cu128" in (r.hint or "")
    r = _one(
        compat.torch_build(
            machine(nvml={"cuda_driver_version": 12020}, torch={"error": "x", "error_kind": "missing"}), config()
        )
    )
    assert "/cu121" in (r.hint or "")


def test_missing_torch_on_a_cpu_box_suggests_the_cpu_build() -> None:
    m = machine(
        nvml={"error": "no NVML", "error_kind": "library-not-found", "gpus": ()},
        torch={"error": "x", "error_kind": "missing"},
    )
    r = _one(compat.torch_build(m, config(torch={"wheel_index": "https://example.invalid/whl"})))
    assert (
        r.hint
        == "install the CPU build (no NVIDIA GPU here): pip install torch --index-url https://example.invalid/whl/cpu"
    )
    r = _one(compat.torch_build(m, config()))  # the default: PyTorch's own index, pasteable as it stands
    assert (r.hint or "").endswith(": pip install torch --index-url https://download.pytorch.org/whl/cpu")


@pytest.mark.parametrize(
    ("driver", "build"),
    [(11080, "cu118"), (12020, "cu121"), (12040, "cu124"), (12060, "cu126"), (12080, "cu128"), (13000, "cu130")],
)
def test_missing_torch_hint_is_the_real_index_of_the_build_the_driver_runs(driver: int, build: str) -> None:
    """A command one can paste, for the build that fits the driver (cu118 ... cu128, cu130)."""
    m = machine(nvml={"cuda_driver_version": driver}, torch={"error": "x", "error_kind": "missing"})
    hint = _one(compat.torch_build(m, config())).hint or ""
    assert hint.endswith(f": pip install torch --index-url https://download.pytorch.org/whl/{build}"), hint


def test_wrong_torch_hints_replace_the_installed_one_with_a_pasteable_command() -> None:
    cpu_torch = machine(torch={"cuda": None, "arch_list": ()})
    hint = _one(compat.torch_build(cpu_torch, config())).hint or ""
    assert hint.endswith(
        "pip uninstall -y torch && pip install torch --index-url https://download.pytorch.org/whl/cu128"
    )
    too_new = machine(nvml={"cuda_driver_version": 12020}, torch={"cuda": "13.0"})
    hint = _one(compat.cuda_compat(too_new, config())).hint or ""
    assert "pip uninstall -y torch && pip install torch --index-url https://download.pytorch.org/whl/cu121" in hint


def test_no_build_for_the_gpu_on_this_driver_says_upgrade_instead_of_a_build_that_cannot_run() -> None:
    m = machine(
        gpus=(gpu(name="NVIDIA GeForce RTX 5090", compute_capability=(12, 0)),),
        nvml={"cuda_driver_version": 12040},
        torch={"error": "x", "error_kind": "missing"},
    )
    hint = _one(compat.torch_build(m, config())).hint or ""
    assert "upgrade the driver" in hint and "pip install" not in hint


def test_unusable_driver_on_a_gpu_box_is_not_told_it_has_no_gpu() -> None:
    m = machine(
        nvml={"error": "Driver Not Loaded", "error_kind": "driver-not-loaded", "gpus": ()},
        torch={"error": "x", "error_kind": "missing"},
    )
    hint = _one(compat.torch_build(m, config())).hint or ""
    assert "see driver" in hint and "no NVIDIA GPU here" not in hint


def test_torch_probe_timeout_is_a_failure_with_the_reason() -> None:
    r = _one(
        compat.torch_build(
            machine(torch={"error": "torch probe no answer within 60 s", "error_kind": "timeout"}), config()
        )
    )
    assert r.status is Status.FAIL and "no answer" in r.summary


def test_rocm_build_is_not_called_cpu_only() -> None:
    r = _one(compat.torch_build(machine(gpus=(), torch={"cuda": None, "hip": "6.2"}), config()))
    assert "ROCm 6.2" in r.summary


def test_ptx_only_coverage_warns_and_fails_on_an_older_driver() -> None:
    blackwell = (gpu(name="NVIDIA GeForce RTX 5090", compute_capability=(12, 0)),)
    m = machine(gpus=blackwell, torch={"arch_list": ("sm_90", "compute_90")})
    assert _one(compat.torch_arch(m, config())).status is Status.WARN
    m = machine(gpus=blackwell, nvml={"cuda_driver_version": 12060}, torch={"arch_list": ("sm_90", "compute_90")})
    assert _one(compat.torch_arch(m, config())).status is Status.FAIL


def test_arch_fail_when_no_build_runs_on_the_driver_says_upgrade_the_driver() -> None:
    m = machine(
        gpus=(gpu(compute_capability=(12, 0), name="NVIDIA GeForce RTX 5090"),),
        nvml={"cuda_driver_version": 12040},
        torch={"arch_list": ("sm_80", "sm_90")},
    )
    r = _one(compat.torch_arch(m, config()))
    assert r.status is Status.FAIL and "upgrade the driver" in (r.hint or "")


def test_unrelated_cuda_init_error_is_reported() -> None:
    m = machine(
        torch={
            "cuda_available": False,
            "cuda_init_error": "CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 999: unknown error",
        }
    )
    r = _one(compat.cuda_compat(m, config()))
    assert r.status is Status.FAIL and "999" in r.summary


def test_cudnn_older_runtime_than_compiled_fails() -> None:
    r = _one(compat.torch_libs(machine(torch={"cudnn_version": 90100, "cudnn_compiled_version": "9.10.2"}), config()))
    assert r.status is Status.FAIL and "9.1.0" in r.summary


def test_pins_that_differ_from_installed_libraries_warn_and_blame_ld_library_path() -> None:
    torch = {
        "requires": ("nvidia-cudnn-cu12==9.10.2.21; platform_system == 'Linux'", "nvidia-nccl-cu12==2.27.3"),
        "installed_libs": {"nvidia-cudnn-cu12": "9.10.2.21", "nvidia-nccl-cu12": "2.21.5"},
    }
    m = machine(torch=torch, host={"env": {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}})
    r = _one(compat.torch_libs(m, config()))
    assert r.status is Status.WARN and "nvidia-nccl-cu12 is 2.21.5, torch pins 2.27.3" in r.summary
    assert "LD_LIBRARY_PATH" in (r.hint or "")


def test_cudnn_8_version_numbers_decode() -> None:
    r = _one(compat.torch_libs(machine(torch={"cudnn_version": 8902, "cudnn_compiled_version": "8.9.2"}), config()))
    assert r.status is Status.OK and "cuDNN 8.9.2" in r.summary


def test_a_too_old_driver_is_explained_once() -> None:
    err = "CUDA initialization: The NVIDIA driver on your system is too old (found version 12020)."
    m = machine(
        nvml={"cuda_driver_version": 12020}, torch={"cuda": "13.0", "cuda_available": False, "cuda_init_error": err}
    )
    r = _one(compat.cuda_compat(m, config()))
    assert r.status is Status.FAIL and "initialisation failed" not in r.summary and "802" not in (r.hint or "")


def test_every_torch_install_hint_in_the_fixtures_can_be_pasted() -> None:
    """No placeholder in any hint a replayed box gives: each pip command names a real wheel index folder."""
    machines = Path(__file__).resolve().parents[2] / "fixtures" / "machines"
    commands = []
    for path in sorted(machines.glob("*.json")):
        facts, _ = load_snapshot(path)
        for check in (compat.torch_build, compat.cuda_compat, compat.torch_arch):
            for r in check(facts, config()):
                for part in (r.hint or "").split(" | "):  # several problems' hints are joined with " | "
                    commands += [m.group().strip() for m in re.finditer(r"pip install torch.*$", part)]
    assert commands, "no fixture asks for a torch install"
    for command in commands:
        assert re.fullmatch(r"pip install torch --index-url https://download\.pytorch\.org/whl/(cpu|cu1\d\d)", command)


# --- torch-extensions: torchvision and torchaudio against this torch --------------------------------------------


def _extensions(*rows: dict[str, object]) -> tuple[ExtensionFacts, ...]:
    return tuple(ExtensionFacts(**row) for row in rows)  # type: ignore[arg-type]


def test_extensions_that_load_are_ok_with_their_versions() -> None:
    rows = _extensions(
        {"name": "torchvision", "version": "0.23.0+cu128", "op": "torchvision::nms"},
        {"name": "torchaudio", "version": "2.8.0+cu128", "op": "torchaudio::cuda_version"},
    )
    r = _one(compat.torch_extensions(machine(torch={"version": "2.8.0+cu128", "extensions": rows}), config()))
    assert r.status is Status.OK
    assert r.value == {"torchvision": "0.23.0+cu128", "torchaudio": "2.8.0+cu128"}
    assert "torchvision 0.23.0+cu128 (torchvision::nms ran)" in r.summary and "torch 2.8.0+cu128" in r.summary


def test_extensions_not_installed_skip() -> None:
    rows = _extensions({"name": "torchvision"}, {"name": "torchaudio"})
    r = _one(compat.torch_extensions(machine(torch={"extensions": rows}), config()))
    assert r.status is Status.SKIP and r.summary == "torchvision and torchaudio not installed"


def test_extensions_skip_without_torch() -> None:
    rows = _extensions({"name": "torchvision", "version": "0.23.0", "error": "RuntimeError: x"})
    m = machine(torch={"error": "torch is not installed", "error_kind": "missing", "extensions": rows})
    assert _one(compat.torch_extensions(m, config())).status is Status.SKIP


def test_a_broken_torchvision_fails_with_the_command_for_torchs_own_build() -> None:
    rows = _extensions(
        {"name": "torchvision", "version": "0.23.0", "op": "torchvision::nms",
         "error": "RuntimeError: operator torchvision::nms does not exist"},
        {"name": "torchaudio", "version": "2.8.0", "op": "torchaudio::cuda_version"},
    )  # fmt: skip
    m = machine(torch={"version": "2.8.0+cu126", "cuda": "12.6", "extensions": rows})
    r = _one(compat.torch_extensions(m, config()))
    assert r.status is Status.FAIL and "operator torchvision::nms does not exist" in r.summary
    assert "torchaudio" not in r.summary and r.expected == "torchvision 0.23.x"
    assert (r.hint or "").endswith(
        "pip uninstall -y torchvision && pip install torch==2.8.0 'torchvision==0.23.*' "
        "--index-url https://download.pytorch.org/whl/cu126"
    )


def test_both_broken_on_a_torch_without_a_build_label_use_its_cuda_and_the_configured_index() -> None:
    rows = _extensions(
        {"name": "torchvision", "version": "0.22.1", "error": "RuntimeError: operator torchvision::nms does not exist"},
        {"name": "torchaudio", "version": "2.7.1", "error": "RuntimeError: Detected that PyTorch and TorchAudio were "
         "compiled with different CUDA versions."},
    )  # fmt: skip
    m = machine(torch={"version": "2.8.0", "cuda": "12.8", "extensions": rows})
    r = _one(compat.torch_extensions(m, config(torch={"wheel_index": "https://mirror.example/whl/"})))
    assert (r.hint or "").endswith(
        "pip uninstall -y torchvision torchaudio && pip install torch==2.8.0 'torchvision==0.23.*' "
        "'torchaudio==2.8.*' --index-url https://mirror.example/whl/cu128"
    )


def test_a_torch_newer_than_the_table_leaves_the_release_to_pip() -> None:
    rows = _extensions({"name": "torchvision", "version": "0.30.0", "error": "RuntimeError: x"})
    r = _one(compat.torch_extensions(machine(torch={"version": "2.15.0+cpu", "extensions": rows}), config()))
    assert (r.hint or "").endswith(
        "pip install torch==2.15.0 torchvision --index-url https://download.pytorch.org/whl/cpu"
    )
    assert r.expected is None
