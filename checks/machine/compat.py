"""Driver, CUDA and torch-build compatibility: can this torch run on this driver and these GPUs?

Rules and error numbers: docs/sources.md#cuda-driver-compat, docs/sources.md#torch-wheel-arch-lists, docs/sources.md#cuda-error-strings,
docs/sources.md#torch-companion-versions.
"""

from __future__ import annotations

from checks.config import PreflightConfig
from checks.facts import ExtensionFacts, MachineFacts
from checks.result import Result, Status, fail, ok, skip, warn
from checks.tables.torchbuilds import (
    CPU_BUILD,
    best_variant,
    build_name,
    companion_release,
    companions_command,
    coverage,
    driver_cuda,
    install_command,
    parse_cuda,
)

_DRIVER_HINTS = {
    "library-not-found": "no NVIDIA driver here: on a GPU box install the driver, or start the container with "
    "GPUs passed through (docker run --gpus all, NVIDIA Container Toolkit)",
    "driver-not-loaded": "the nvidia kernel module is not loaded: `sudo modprobe nvidia`, or reboot",
    "version-mismatch": "user-space driver and kernel module differ (upgraded without reload): reboot, or reload "
    "the nvidia kernel modules",
    "no-permission": "no permission on /dev/nvidia*: add the user to the video group or run with access",
}


def driver(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """NVML loads, which driver, which CUDA it supports, how many GPUs it sees.

    Command line equivalent: nvidia-smi (header line).
    """
    nv = m.nvml
    if nv.error_kind == "library-not-found" and m.host.nvidia_pci_gpus == 0:
        # no NVIDIA GPU on the PCI bus either: a CPU machine by design, where a CUDA torch wheel trains on the CPU
        summary = "no NVIDIA GPU on this machine's PCI bus and no driver: a CPU machine (lspci -d 10de: finds none)"
        return [skip("driver", summary, value={"error_kind": nv.error_kind, "nvidia_pci_gpus": 0})]
    if nv.error:
        hint = _DRIVER_HINTS.get(nv.error_kind or "", "see the NVML message; `nvidia-smi` shows the same")
        kind = {"error_kind": nv.error_kind}  # "library-not-found": no driver at all (a CPU box, or no GPUs passed in)
        if nv.error_kind == "library-not-found" and m.host.nvidia_pci_gpus:
            hint = f"{m.host.nvidia_pci_gpus} NVIDIA GPU(s) on the PCI bus, but no driver to use them: " + hint
        return [fail("driver", nv.error, hint, value=kind, expected="NVIDIA driver with NVML")]
    cuda = driver_cuda(nv.cuda_driver_version)
    cuda_text = f"CUDA {cuda[0]}.{cuda[1]}" if cuda else "CUDA version unknown"
    summary = f"driver {nv.driver_version}, supports up to {cuda_text}, {len(nv.gpus)} GPU(s)"
    value = {"driver": nv.driver_version, "cuda": f"{cuda[0]}.{cuda[1]}" if cuda else None, "gpus": len(nv.gpus)}
    if not nv.gpus:
        hint = "check NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES and that the container was given GPUs"
        return [fail("driver", summary + ": no GPU visible", hint, value=value)]
    return [ok("driver", summary, value=value)]


def torch_build(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """torch is importable, and is a CUDA build where there are GPUs.

    Command line equivalent: python -c 'import torch; print(torch.__version__, torch.version.cuda)'.
    """
    t, gpus = m.torch, [g for g in m.nvml.gpus if g.error is None]
    if t.error_kind == "missing":
        return [fail("torch-build", "torch is not installed in this Python", _install_hint(m, cfg, replace=False))]
    if t.error:
        return [
            fail(
                "torch-build",
                t.error if t.error_kind == "import-error" else f"torch probe failed: {t.error}",
                "run `python -c 'import torch'` to see the full error",
            )
        ]
    kind = f"CUDA {t.cuda}" if t.cuda else (f"ROCm {t.hip}" if t.hip else "CPU-only")
    summary = f"torch {t.version} ({kind} build)"
    value = {"version": t.version, "cuda": t.cuda, "hip": t.hip}
    if gpus and not t.cuda and not t.hip:
        hint = f"this build cannot use the {len(gpus)} GPU(s); " + _install_hint(m, cfg, replace=True)
        return [fail("torch-build", summary + f" on a machine with {len(gpus)} NVIDIA GPU(s)", hint, value=value)]
    return [ok("torch-build", summary, value=value)]


def _install_hint(m: MachineFacts, cfg: PreflightConfig, replace: bool) -> str:
    """What to paste: the build that fits the driver and GPUs, the CPU build on a box without NVIDIA GPU."""
    index = cfg.torch.wheel_index
    gpus = [g.compute_capability for g in m.nvml.gpus if g.error is None and g.compute_capability]
    if m.nvml.error and m.nvml.error_kind not in (None, "library-not-found"):
        return (
            "the NVIDIA driver is there but not usable (see driver): fix it, then rerun bootstrap for the build that "
            f"fits it; the CPU build meanwhile: {install_command(CPU_BUILD, index, replace)}"
        )
    if not m.nvml.gpus:
        return f"install the CPU build (no NVIDIA GPU here): {install_command(CPU_BUILD, index, replace)}"
    drv = driver_cuda(m.nvml.cuda_driver_version)
    variant = best_variant(gpus, drv)
    if variant is None:
        limit = f"CUDA {drv[0]}.{drv[1]}" if drv else "this driver"
        return f"no PyTorch CUDA build for these GPUs runs on {limit}: upgrade the driver, then rerun bootstrap"
    return f"install the build that fits the driver ({variant.name}): {install_command(variant.name, index, replace)}"


def cuda_compat(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """The driver can run torch's CUDA runtime; no forward-compat libs on GeForce; Fabric Manager on NVSwitch.

    Command line equivalent: nvidia-smi (CUDA Version) vs python -c 'import torch; print(torch.version.cuda)'.
    """
    if m.nvml.error:
        return [skip("cuda-compat", "no NVIDIA driver (see driver)")]
    problems = [p for p in (_runtime_vs_driver(m, cfg), _forward_compat(m), _fabric_manager(m), _init_error(m)) if p]
    drv = driver_cuda(m.nvml.cuda_driver_version)
    drv_text = f"{drv[0]}.{drv[1]}" if drv else "?"
    if not problems:
        rt = m.torch.cuda
        summary = f"driver supports CUDA {drv_text}; torch needs {rt}" if rt else f"driver supports CUDA {drv_text}"
        return [
            ok(
                "cuda-compat",
                summary,
                value={"driver_cuda": drv_text, "torch_cuda": rt},
                expected=f">= {rt}" if rt else None,
            )
        ]
    worst = Status.FAIL if any(s is Status.FAIL for s, _, _ in problems) else Status.WARN
    summary = "; ".join(text for _, text, _ in problems)
    hint = " | ".join(h for _, _, h in problems)
    return [
        Result("cuda-compat", worst, summary, value={"driver_cuda": drv_text, "torch_cuda": m.torch.cuda}, hint=hint)
    ]


_Problem = tuple[Status, str, str] | None


def _runtime_vs_driver(m: MachineFacts, cfg: PreflightConfig | None = None) -> _Problem:
    drv, rt = driver_cuda(m.nvml.cuda_driver_version), parse_cuda(m.torch.cuda)
    if drv is None or rt is None or drv >= rt:
        return None
    gpus = [g.compute_capability for g in m.nvml.gpus if g.compute_capability]
    variant = best_variant(gpus, drv)
    fix = "upgrade the driver"
    if variant:  # the pasteable command ends the hint, so a copied line is the command alone
        command = install_command(variant.name, cfg.torch.wheel_index if cfg else "", replace=True)
        fix = f"install torch built for CUDA <= {drv[0]}.{drv[1]} ({variant.name}): {command}"
    if drv[0] < rt[0]:
        text = f"driver supports CUDA {drv[0]}.{drv[1]} but torch needs {rt[0]}.{rt[1]}: CUDA init fails ('driver too old')"
        return Status.FAIL, text, f"rent a box with a newer driver, or {fix}"
    text = f"driver CUDA {drv[0]}.{drv[1]} is older than torch's {rt[0]}.{rt[1]}: runs under minor-version compatibility, PTX JIT and newest APIs fail"
    return Status.WARN, text, f"to be safe, {fix}"


def _forward_compat(m: MachineFacts) -> _Problem:
    geforce = [g for g in m.nvml.gpus if (g.brand or "").startswith("geforce")]
    if not (m.host.cuda_compat_paths and geforce):
        return None
    paths = ", ".join(m.host.cuda_compat_paths)
    text = f"CUDA forward-compat libcuda on the loader path ({paths}) with a GeForce card: CUDA error 804"
    return (
        Status.FAIL,
        text,
        "remove the compat directory from LD_LIBRARY_PATH / ld.so.conf (then ldconfig), or use an image matching the host driver",
    )


def _fabric_manager(m: MachineFacts) -> _Problem:
    if m.host.nvswitch_count == 0 or m.host.fabric_manager_running is not False:
        return None
    text = f"{m.host.nvswitch_count} NVSwitch device(s) but nv-fabricmanager is not running: CUDA error 802"
    return Status.FAIL, text, "start it: `systemctl start nvidia-fabricmanager` (version must equal the driver's)"


def _init_error(m: MachineFacts) -> _Problem:
    err = m.torch.cuda_init_error
    if not err or m.torch.cuda_available:
        return None
    if "802" in err and _fabric_manager(m):
        return None  # already explained by _fabric_manager
    if "804" in err and _forward_compat(m):
        return None  # already explained by _forward_compat
    if "too old" in err and _runtime_vs_driver(m):
        return None  # already explained by _runtime_vs_driver
    hints = [h for code, h in _INIT_HINTS.items() if code in err]
    hint = (
        "; ".join(hints)
        or "run `python -c 'import torch; torch.zeros(1).cuda()'` for the full error; `nvidia-smi` must work first"
    )
    return Status.FAIL, f"CUDA initialisation failed in torch: {err.strip().splitlines()[0][:200]}", hint


# CUDA error numbers in torch's init message -> what to do (docs/sources.md#cuda-error-strings).
_INIT_HINTS = {
    "802": "802: NVSwitch system without a running Fabric Manager: systemctl start nvidia-fabricmanager",
    "803": "803: kernel module and user-space driver differ: reboot (or reload the nvidia modules)",
    "804": "804: a cuda-compat libcuda is loaded on a card that cannot use it: remove it from the loader path",
    "999": "999: broken device nodes or nvidia-uvm not loaded: check /dev/nvidia-uvm, restart the container",
    "too old": "the driver is older than torch's CUDA: install a torch built for the driver's CUDA, or a newer driver",
}


def torch_arch(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Each GPU's sm is covered by the torch build's kernels (SASS of the same major and lower minor, or PTX).

    Command line equivalent: python -c 'import torch; print(torch.cuda.get_arch_list())'.
    """
    t = m.torch
    if m.nvml.error or not m.nvml.gpus:
        return [skip("torch-arch", "no GPU to match against")]
    if t.error or not t.cuda:
        return [skip("torch-arch", "no CUDA build of torch (see torch-build)")]
    results = [
        _arch_result(m, cfg, g.index, g.name, g.compute_capability)
        for g in m.nvml.gpus
        if g.error is None and g.compute_capability
    ]
    return results or [skip("torch-arch", "no GPU reported its compute capability (see gpu-inventory)")]


def _arch_result(m: MachineFacts, cfg: PreflightConfig, index: int, name: str, cc: tuple[int, int]) -> Result:
    sm = f"sm_{cc[0]}{cc[1]}"
    cov = coverage(m.torch.arch_list, cc)
    subject, built = f"gpu{index}", " ".join(m.torch.arch_list) or "(empty)"
    if cov.sass:
        return ok("torch-arch", f"{name} ({sm}) runs {cov.sass[-1]} kernels", value=sm, expected=built, subject=subject)
    if cov.covered:
        drv, rt = driver_cuda(m.nvml.cuda_driver_version), parse_cuda(m.torch.cuda)
        text = f"{name} ({sm}) has only PTX ({', '.join(cov.ptx)}): kernels JIT-compile on first use"
        if drv and rt and drv < rt:
            return fail(
                "torch-arch",
                text + ", and this driver is older than the toolkit that made the PTX",
                _arch_fix(m, cfg, cc),
                value=sm,
                subject=subject,
            )
        return warn(
            "torch-arch",
            text,
            "slow first start; a build with native kernels: " + _arch_fix(m, cfg, cc),
            value=sm,
            subject=subject,
        )
    summary = f"{name} ({sm}) is not in torch {m.torch.version}'s arch list [{built}]: 'no kernel image is available'"
    return fail(
        "torch-arch", summary, _arch_fix(m, cfg, cc), value=sm, expected=f"a {sm}-compatible kernel", subject=subject
    )


def _arch_fix(m: MachineFacts, cfg: PreflightConfig, cc: tuple[int, int]) -> str:
    variant = best_variant([cc], driver_cuda(m.nvml.cuda_driver_version))
    if variant is None:
        return f"no PyTorch CUDA build for sm_{cc[0]}{cc[1]} runs on this driver: upgrade the driver"
    command = install_command(variant.name, cfg.torch.wheel_index, replace=True)
    return f"install torch {variant.torch} built for {variant.name}: {command}"


def torch_libs(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """cuDNN and NCCL are present and are the versions the torch build was made with.

    Command line equivalent: python -c 'import torch; print(torch.backends.cudnn.version(), torch.cuda.nccl.version())'.
    """
    t = m.torch
    if t.error or not t.cuda:
        return [skip("torch-libs", "no CUDA build of torch (see torch-build)")]
    problems: list[tuple[Status, str]] = []
    if t.cudnn_version is None:
        problems.append((Status.WARN, "cuDNN not loadable (torch.backends.cudnn.version() is None)"))
    elif t.cudnn_compiled_version:
        problems += _cudnn_runtime_vs_compiled(t.cudnn_version, t.cudnn_compiled_version)
    if t.nccl_version is None and len(m.nvml.gpus) > 1:
        problems.append((Status.WARN, "NCCL not available: multi-GPU training falls back or fails"))
    problems += _pins_vs_installed(t.requires, t.installed_libs)
    value = {"cudnn": _cudnn_text(t.cudnn_version), "nccl": t.nccl_version}
    summary = f"cuDNN {value['cudnn']}, NCCL {t.nccl_version}"
    if not problems:
        return [ok("torch-libs", summary + ", as the torch build expects", value=value)]
    worst = Status.FAIL if any(s is Status.FAIL for s, _ in problems) else Status.WARN
    ld = m.host.env.get("LD_LIBRARY_PATH", "")
    hint = "reinstall torch's pinned nvidia-* packages (pip install --force-reinstall --no-deps 'PACKAGE==PIN')"
    if any(k in ld for k in ("cudnn", "cuda", "nccl")):
        hint = f"LD_LIBRARY_PATH ({ld}) puts other CUDA libraries first: remove them from it; or " + hint
    text = summary + ": " + "; ".join(p for _, p in problems)
    return [Result("torch-libs", worst, text, value=value, hint=hint)]


def _cudnn_text(version: int | None) -> str | None:
    if version is None:
        return None
    major, rest = divmod(version, 10000) if version >= 90000 else divmod(version, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def _cudnn_runtime_vs_compiled(runtime: int, compiled: str) -> list[tuple[Status, str]]:
    """torch's own rule (torch/backends/cudnn): same major, runtime minor >= compile minor."""
    rt = [int(x) for x in (_cudnn_text(runtime) or "0.0.0").split(".")]
    ct = [int(x) for x in compiled.split(".")[:2]]
    if rt[0] != ct[0] or rt[1] < ct[1]:
        return [
            (
                Status.FAIL,
                f"cuDNN runtime {_cudnn_text(runtime)} is incompatible with the {compiled} torch was compiled against",
            )
        ]
    return []


def _pins_vs_installed(requires: tuple[str, ...], installed: dict[str, str]) -> list[tuple[Status, str]]:
    out: list[tuple[Status, str]] = []
    for req in requires:
        spec = req.split(";")[0].strip()
        if "==" not in spec:
            continue
        name, pin = (s.strip() for s in spec.split("==", 1))
        if not name.startswith("nvidia-") or not any(k in name for k in ("cudnn", "nccl")):
            continue
        have = installed.get(name)
        if have is None:
            out.append((Status.WARN, f"{name} {pin} (pinned by torch) is not installed"))
        elif have != pin:
            out.append((Status.WARN, f"{name} is {have}, torch pins {pin}"))
    return out


def torch_extensions(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """torchvision and torchaudio, where installed, load their compiled ops against this torch.

    Command line equivalent: python -c 'import torch, torchvision; torch.ops.torchvision.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)'.
    """
    t = m.torch
    if t.error or not t.version:
        return [skip("torch-extensions", "no torch to load them against (see torch-build)")]
    if t.extensions is None:
        return [skip("torch-extensions", "not recorded (the snapshot predates the torchvision/torchaudio probe)")]
    installed = [e for e in t.extensions if e.version is not None]
    if not installed:
        names = " and ".join(e.name for e in t.extensions) or "torchvision and torchaudio"
        return [skip("torch-extensions", f"{names} not installed")]
    value = {e.name: e.version for e in installed}
    broken = [e for e in installed if e.error]
    if not broken:
        ran = ", ".join(f"{e.name} {e.version}" + (f" ({e.op} ran)" if e.op else "") for e in installed)
        return [ok("torch-extensions", f"{ran} against torch {t.version}", value=value)]
    summary = "; ".join(_extension_problem(e, t.version) for e in broken)
    build = build_name(t.version, t.cuda, t.hip)
    command = companions_command([e.name for e in broken], t.version, build, cfg.torch.wheel_index)
    hint = f"install the {build} build{'s' if len(broken) > 1 else ''} made for torch {t.version}: {command}"
    return [fail("torch-extensions", summary, hint, value=value, expected=_expected(broken, t.version))]


def _extension_problem(e: ExtensionFacts, torch_version: str) -> str:
    return f"{e.name} {e.version} does not load its compiled ops against torch {torch_version}: {e.error}"


def _expected(broken: list[ExtensionFacts], torch_version: str) -> str | None:
    releases = [f"{e.name} {r}.x" for e in broken if (r := companion_release(e.name, torch_version))]
    return ", ".join(releases) or None
