"""Facts about PyTorch CUDA builds: which GPU architectures a build's kernels run on, and which build to
install for a GPU and driver. Pure data and arithmetic; sources are docs/sources.md#torch-wheel-arch-lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")

# Devices a code SM must not run on although the "same major, lower minor" rule says it would: the Jetson
# parts (torch 2.14 DEVICE_REQUIREMENT, docs/sources.md#torch-device-requirement).
_EXCLUDED = {
    (7, 0): {(7, 2)},
    (8, 0): {(8, 7)},
    (8, 6): {(8, 7)},
    (5, 0): {(5, 3)},
    (6, 0): {(6, 2)},
    (10, 0): {(10, 1)},
}


@dataclass(frozen=True)
class Arch:
    """One entry of ``torch.cuda.get_arch_list()``: SASS (``sm_90``) or PTX (``compute_90``)."""

    kind: str  # "sm" or "compute"
    cc: tuple[int, int]
    suffix: str  # "a"/"f": architecture-specific, not forward compatible

    @property
    def label(self) -> str:
        return f"{self.kind}_{self.cc[0]}{self.cc[1]}{self.suffix}"


def parse_arch(text: str) -> Arch | None:
    m = _ARCH.match(text.strip())
    if not m:
        return None
    return Arch(m.group(1), (int(m.group(2)), int(m.group(3))), m.group(4))


def sass_runs_on(arch: Arch, device: tuple[int, int]) -> bool:
    """SASS runs on the same major with an equal or higher minor (docs/sources.md#torch-device-requirement)."""
    if arch.kind != "sm":
        return False
    if arch.suffix:
        return arch.cc == device
    if device in _EXCLUDED.get(arch.cc, set()):
        return False
    return arch.cc[0] == device[0] and arch.cc[1] <= device[1]


def ptx_runs_on(arch: Arch, device: tuple[int, int]) -> bool:
    """PTX JIT-compiles for the same or any newer architecture."""
    return arch.kind == "compute" and not arch.suffix and arch.cc <= device


@dataclass(frozen=True)
class Coverage:
    sass: tuple[str, ...]
    ptx: tuple[str, ...]

    @property
    def covered(self) -> bool:
        return bool(self.sass or self.ptx)


def coverage(arch_list: tuple[str, ...], device: tuple[int, int]) -> Coverage:
    """Which entries of a build's arch list can run on a device of compute capability ``device``."""
    archs = [a for a in (parse_arch(t) for t in arch_list) if a is not None]
    return Coverage(
        sass=tuple(a.label for a in archs if sass_runs_on(a, device)),
        ptx=tuple(a.label for a in archs if ptx_runs_on(a, device)),
    )


@dataclass(frozen=True)
class Variant:
    """A PyTorch CUDA wheel variant (index name ``cuXYZ``) and the code SMs its wheels carry."""

    name: str
    cuda: tuple[int, int]
    sms: frozenset[tuple[int, int]]
    torch: str  # which torch releases publish it


# Newest first. docs/sources.md#torch-wheel-arch-lists: cu128 carries sm_70 only for torch 2.8-2.10, so it is left out here
# (V100 gets cu126); cu118-cu126 carry 5.0 ... 9.0.
_OLD = frozenset({(5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)})
_NEW = frozenset({(7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)})
VARIANTS = (
    Variant("cu130", (13, 0), _NEW, ">= 2.9"),
    Variant("cu128", (12, 8), _NEW, ">= 2.7"),
    Variant("cu126", (12, 6), _OLD, ">= 2.6"),
    Variant("cu124", (12, 4), _OLD, "2.4 - 2.6"),
    Variant("cu121", (12, 1), _OLD, "2.1 - 2.5"),
    Variant("cu118", (11, 8), _OLD | {(3, 7)}, "2.0 - 2.7"),
)


def variant_covers(variant: Variant, device: tuple[int, int]) -> bool:
    return any(sass_runs_on(Arch("sm", sm, ""), device) for sm in variant.sms)


def best_variant(devices: list[tuple[int, int]], driver_cuda: tuple[int, int] | None) -> Variant | None:
    """The newest variant the driver can run whose kernels cover every device (None: there is none)."""
    for variant in VARIANTS:
        if driver_cuda is not None and variant.cuda > driver_cuda:
            continue
        if all(variant_covers(variant, d) for d in devices):
            return variant
    return None


# PyTorch's own wheel index: one folder per build (cpu, cu118 ... cu128, cu130). pytorch.org/get-started/locally
# prints these commands, and torch 2.14's reinstall hint names the same address (docs/sources.md#cuda-error-strings).
PYTORCH_WHEEL_INDEX = "https://download.pytorch.org/whl"
CPU_BUILD = "cpu"


def install_command(variant_name: str, wheel_index: str = "", replace: bool = False) -> str:
    """A pip command one can paste for a build (``cu128``, ``cpu``): the configured index, else PyTorch's own.

    ``replace``: a torch is installed already, and ``pip install torch`` would call it satisfied whatever its
    build, so it is uninstalled first. Never ``--no-deps``: the CUDA builds need their nvidia-* packages.
    """
    index = (wheel_index or PYTORCH_WHEEL_INDEX).rstrip("/")
    command = f"pip install torch --index-url {index}/{variant_name}"
    return f"pip uninstall -y torch && {command}" if replace else command


def parse_cuda(text: str | None) -> tuple[int, int] | None:
    """'12.8' -> (12, 8)."""
    if not text:
        return None
    m = re.match(r"^(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def driver_cuda(version: int | None) -> tuple[int, int] | None:
    """NVML's 12080 -> (12, 8)."""
    if not version:
        return None
    return version // 1000, (version % 1000) // 10


# torch 2.N's torchvision release: pytorch/vision's README table, which pytorch.org's "previous versions" pip lines
# follow; torchaudio 2.N is released with torch 2.N (docs/sources.md#torch-companion-versions).
TORCHVISION_FOR = {
    (2, 0): "0.15", (2, 1): "0.16", (2, 2): "0.17", (2, 3): "0.18", (2, 4): "0.19", (2, 5): "0.20", (2, 6): "0.21",
    (2, 7): "0.22", (2, 8): "0.23", (2, 9): "0.24", (2, 10): "0.25", (2, 11): "0.26", (2, 12): "0.27", (2, 13): "0.28",
}  # fmt: skip


def companion_release(name: str, torch_version: str) -> str | None:
    """The torchvision or torchaudio release (``0.23``, ``2.8``) made for a torch version; None: not in the table."""
    m = re.match(r"^(\d+)\.(\d+)", torch_version)
    if not m:
        return None
    minor = (int(m.group(1)), int(m.group(2)))
    if name == "torchaudio":
        return f"{minor[0]}.{minor[1]}" if minor in TORCHVISION_FOR else None
    return TORCHVISION_FOR.get(minor) if name == "torchvision" else None


def build_name(torch_version: str, cuda: str | None, hip: str | None) -> str:
    """The wheel index folder of a torch build: its local label (``2.8.0+cu128``), else from its CUDA or ROCm."""
    label = torch_version.partition("+")[2]
    if re.match(r"^(cu\d+|cpu|rocm[\d.]+)$", label):
        return label
    if cuda and (rt := parse_cuda(cuda)):
        return f"cu{rt[0]}{rt[1]}"
    if hip and (m := re.match(r"^(\d+)\.(\d+)", hip)):
        return f"rocm{m.group(1)}.{m.group(2)}"
    return CPU_BUILD


def companions_command(names: list[str], torch_version: str, build: str, wheel_index: str = "") -> str:
    """Replace ``names`` (torchvision, torchaudio) by the builds made for this torch, leaving torch as it is: pip
    keeps an installed package that satisfies a bare name whatever its build, so they are uninstalled first, and
    ``torch==VERSION`` from the same index holds torch where it is while pip picks their matching releases."""
    index = (wheel_index or PYTORCH_WHEEL_INDEX).rstrip("/")
    public = torch_version.partition("+")[0]
    pre = ""
    if re.search(r"(dev|a|b|rc)\d", public):  # a nightly: its companions come from the nightly folder
        index, pre = f"{index}/nightly", " --pre"
    wanted = []
    for name in names:
        release = companion_release(name, public)
        wanted.append(f"'{name}=={release}.*'" if release and not pre else name)
    return (
        f"pip uninstall -y {' '.join(names)} && "
        f"pip install{pre} torch=={public} {' '.join(wanted)} --index-url {index}/{build}"
    )
