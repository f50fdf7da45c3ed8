"""``invoke diff A B``: what differs between a box that worked (A) and this one (B), ranked by what it breaks.

break: training will not start or will hang (losing the GPUs, the driver or torch's CUDA build, torch's CUDA
build vs the driver, GPU arch vs the build's arch list, NCCL major/minor, Python minor, a package A has and B
lacks); slow: it runs slower (fewer GPUs, power cap, PCIe, clocks, NUMA placement, cores, memory, shm); info:
everything else. Versions compare by PEP 440 (``packaging.version``),
not as strings.

JSON (``"diff": 1``)::

    {"diff": 1, "tool": ..., "a": "snapshot a.json", "b": "live",
     "counts": {"break": 1, "slow": 0, "info": 3},
     "differences": [{"rank": "break", "field": "nccl", "a": "2.21.5", "b": "2.27.3", "reason": "..."}],
     "not_compared": ["A: ...", "B: ..."]}
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from checks import TOOL_NAME, TOOL_VERSION
from checks.env.view import Side
from checks.tables.torchbuilds import coverage, parse_cuda

DIFF_SCHEMA = 1
RANKS = ("break", "slow", "info")
_ENV_ONLY = frozenset({"os", "glibc", "nvcc", "cpu_flags"})
_SLOW = {
    "power_limit_w": "a lower power limit runs the GPU slower (a 4090 capped at 250 W of 450 W: ~20%, the seed article §1.3)",
    "pcie": "a narrower or older PCIe link slows host-device copies (docs/sources.md#pcie-link)",
    "sm_clock_max_mhz": "a lower clock ceiling caps compute",
    "cores": "fewer usable cores feed fewer DataLoader workers (the seed article §4.2)",
    "mem_gib": "less RAM limits workers, page cache and pinned memory",
    "shm_mib": "a smaller /dev/shm limits DataLoader workers and NCCL's shared memory (docs/sources.md#dev-shm)",
    "local_cpus": "fewer CPUs on this GPU's NUMA node: its DataLoader workers and pinned copies beyond them cross the socket",
}
# The per-GPU fields of _SLOW that belong to the card itself, so compare only between like cards (local_cpus is
# the host's: it compares across models too).
_CARD_OWN = frozenset({"power_limit_w", "pcie", "sm_clock_max_mhz"})
# Fields where more is slower (B having fewer is info).
_SLOW_MORE = {
    "cross_socket_pairs": "more GPU pairs cross the sockets without NVLink (path SYS): their P2P and all-reduce "
    "traffic goes over UPI/QPI (NCCL models it at 10-40 GB/s), see gpu-topology",
}
_INFO = {
    "torch": "a different torch release: kernels, defaults and numerics can differ",
    "nvcc": "the CUDA toolkit builds extensions (flash-attn, apex, DeepSpeed ops): rebuild them for this one",
    "glibc": "wheels built against a newer glibc do not load on an older one",
}


@dataclass(frozen=True)
class Difference:
    rank: str
    field: str
    a: Any
    b: Any
    reason: str


@dataclass(frozen=True)
class Diff:
    a: str
    b: str
    differences: tuple[Difference, ...]
    not_compared: tuple[str, ...]

    def counts(self) -> dict[str, int]:
        return {r: sum(d.rank == r for d in self.differences) for r in RANKS}

    def exit_code(self) -> int:
        """1 when a breaking difference exists."""
        return 1 if self.counts()["break"] else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "diff": DIFF_SCHEMA,
            "tool": f"{TOOL_NAME} {TOOL_VERSION}",
            "a": self.a,
            "b": self.b,
            "counts": self.counts(),
            "differences": [asdict(d) for d in self.differences],
            "not_compared": list(self.not_compared),
        }


def version(text: Any) -> Version | None:
    try:
        return Version(str(text))
    except InvalidVersion:
        return None


def same_release(a: Any, b: Any, parts: int) -> bool:
    """True when ``a`` and ``b`` share their first ``parts`` release numbers (PEP 440; strings when not versions)."""
    va, vb = version(a), version(b)
    if va is None or vb is None:
        return str(a).split(".")[:parts] == str(b).split(".")[:parts]
    return (va.release + (0,) * parts)[:parts] == (vb.release + (0,) * parts)[:parts]


def direction(a: Any, b: Any) -> str:
    va, vb = version(a), version(b)
    if va is None or vb is None or va == vb:
        return ""
    return " (B is older)" if vb < va else " (B is newer)"


def diff(a: Side, b: Side) -> Diff:
    """Every field both sides can speak of that differs, ranked; plus what could not be compared."""
    out: list[Difference] = []
    fit = driver_fit(a, b)
    keys = [k for k in {**a.fields, **b.fields} if (k in a.fields and k in b.fields) or _one_sided_ok(k, a, b)]
    for key in keys:
        va, vb = a.fields.get(key), b.fields.get(key)
        if va == vb or (key.startswith("gpu") and "." in key and (va is None or vb is None)):
            continue
        if key in _ENV_ONLY and ((va is None and a.missing) or (vb is None and b.missing)):
            continue  # a file that predates the environment section: listed under not_compared
        if va is not None and vb is not None and version(va) is not None and version(va) == version(vb):
            continue  # "2.1" and "2.1.0" are the same version (PEP 440)
        if key in _STACK:
            out.append(cuda_stack(key, va, vb, b, fit))
        elif other := _other_model(key, a, b):
            out.append(Difference("info", key, va, vb, other))
        else:
            out.append(rank(key, va, vb))
    out += fit + arch_fit(a, b)
    out.sort(key=lambda d: RANKS.index(d.rank))
    not_compared = [f"A ({a.label}): {m}" for m in a.missing] + [f"B ({b.label}): {m}" for m in b.missing]
    if ("cross_socket_pairs" in a.fields) != ("cross_socket_pairs" in b.fields):
        not_compared.append("NUMA placement: only one side records GPU topology (2+ GPUs, snapshots that have it)")
    return Diff(a.label, b.label, tuple(out), tuple(not_compared))


def _other_model(key: str, a: Side, b: Side) -> str | None:
    """A per-GPU figure that is the card's own (power limit, clock ceiling, link) where the two sides hold different
    GPU models at that index: not a slower setting of the same card, so not ranked slow (an H200's 1,980 MHz
    ceiling is not a slowdown from a 4090's 3,105)."""
    gpu, _, leaf = key.partition(".")
    if not (gpu.startswith("gpu") and leaf in _CARD_OWN):
        return None
    name_a, name_b = a.fields.get(f"{gpu}.name"), b.fields.get(f"{gpu}.name")
    if name_a is None or name_b is None or name_a == name_b:
        return None
    return f"another GPU model ({name_a} vs {name_b}): not comparable; bootstrap judges each card by its datasheet"


def _one_sided_ok(key: str, a: Side, b: Side) -> bool:
    """A package or variable on one side only is a difference when the other side lists its packages at all."""
    prefix = key.split(":", 1)[0] + ":"
    if ":" not in key:
        return False
    return any(k.startswith(prefix) for k in a.fields) and any(k.startswith(prefix) for k in b.fields)


def rank(key: str, a: Any, b: Any) -> Difference:
    """Rank one differing field with the reason it matters."""
    if key.startswith("package:"):
        if b is None:
            return Difference("break", key, a, b, "missing on B: `import` fails where A's code uses it")
        if a is None:
            return Difference("info", key, a, b, "only on B")
        return Difference("info", key, a, b, "a different version" + direction(a, b))
    if key.startswith("var:"):
        return Difference("info", key, a, b, "changes what CUDA, NCCL or torch do at run time")
    if key in ("nccl", "python") and (a is None or b is None):
        return Difference("info", key, a, b, "only one side has it (a CPU or ROCm torch has no NCCL)")
    if key == "nccl":
        if a and b and not same_release(a, b, 2):
            return Difference(
                "break", key, a, b, "NCCL major/minor differ: ranks that mix them hang at the first collective"
            )
        return Difference("info", key, a, b, "NCCL patch release differs")
    if key == "python":
        if a and b and not same_release(a, b, 2):
            return Difference(
                "break", key, a, b, "Python minor differs: compiled extensions and wheels are built per minor"
            )
        return Difference("info", key, a, b, "Python patch release differs")
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "numa_node":
        return Difference("info", key, a, b, "this GPU sits on another NUMA node: pin its rank and workers to its CPUs")
    if leaf in _SLOW_MORE:
        if _magnitude(b) > _magnitude(a):
            return Difference("slow", key, a, b, _SLOW_MORE[leaf] + " (B has more)")
        return Difference("info", key, a, b, "B has no more of them")
    if leaf in _SLOW:
        worse = _magnitude(b) < _magnitude(a)
        if worse:
            return Difference("slow", key, a, b, _SLOW[leaf] + " (B has less)")
        return Difference("info", key, a, b, "B has at least as much")
    return Difference("info", key, a, b, _INFO.get(leaf, "differs") + (direction(a, b) if leaf in _INFO else ""))


_STACK = frozenset({"gpu_count", "driver", "driver_cuda", "torch_cuda"})
_FIT_ROW = "torch_cuda vs driver"


def cuda_stack(key: str, a: Any, b: Any, bside: Side, fit: list[Difference]) -> Difference:
    """Rank a difference of what CUDA training stands on: the GPUs, the driver and torch's CUDA build.

    Losing one of them (A has it, B has none) is a break; a reason that refers to another row names one that
    this diff holds (``fit`` is the driver-fit row, when there is one)."""
    if key == "gpu_count":
        return _gpu_count(a, b)
    if key == "torch_cuda":
        if a and not b:
            return Difference(
                "break", key, a, b, f"B's torch ({bside.fields.get('torch')}) is not built for CUDA (a CPU or ROCm "
                "build): torch.cuda.is_available() is False, training on the GPU cannot start",
            )  # fmt: skip
        if not a:
            return Difference("info", key, a, b, "only B's torch is built for CUDA")
        b_driver = bside.fields.get("driver_cuda")
        if fit:
            runs = f"B's driver cannot run it: see the `{_FIT_ROW}` row"
        elif b_driver:
            runs = f"B's driver (CUDA {b_driver}) runs it"
        else:
            runs = "B has no driver to run it"
        return Difference("info", key, a, b, f"torch is built for another CUDA; {runs}")
    if key == "driver" and a and not b:
        return Difference(
            "break", key, a, b, "B has no NVIDIA driver (NVML cannot load one): no GPU is usable, CUDA cannot start"
        )
    if not a:
        return Difference("info", key, a, b, "only B has it")
    if key == "driver_cuda":
        return Difference("info", key, a, b, "the newest CUDA the driver supports" + direction(a, b))
    too_old = f"; too old for B's torch: see the `{_FIT_ROW}` row" if fit else ""
    return Difference("info", key, a, b, "a different driver" + direction(a, b) + too_old)


def _gpu_count(a: Any, b: Any) -> Difference:
    """No GPU on B is a break; fewer is slow; more is info (per-GPU fields compare the GPUs both have)."""
    have, had = _magnitude(b) or (0.0,), _magnitude(a) or (0.0,)
    if had[0] and not have[0]:
        return Difference("break", "gpu_count", a, b, f"B has no GPU (A has {a}): training on CUDA cannot start")
    if have < had:
        return Difference(
            "slow", "gpu_count", a, b, f"B has fewer GPUs ({b} of {a}): a job sized for A runs on fewer ranks, "
            f"or does not start if it asks for {a} (torchrun --nproc-per-node {a})",
        )  # fmt: skip
    return Difference("info", "gpu_count", a, b, "B has more GPUs: per-GPU fields are compared for the GPUs both have")


def driver_fit(a: Side, b: Side) -> list[Difference]:
    """B's torch needs a driver for its CUDA major (minor-version compatibility covers the rest, docs/sources.md#cuda-driver-compat)."""
    build, driver = parse_cuda(b.fields.get("torch_cuda")), parse_cuda(b.fields.get("driver_cuda"))
    if build is None or driver is None or build[0] <= driver[0]:
        return []
    a_build, a_driver = parse_cuda(a.fields.get("torch_cuda")), parse_cuda(a.fields.get("driver_cuda"))
    if a_build == build and a_driver == driver:
        return []  # the same mismatch on both: not a difference
    reason = (
        f"B's torch is built for CUDA {build[0]}.{build[1]} but B's driver supports CUDA {driver[0]}.{driver[1]}: "
        "torch.cuda.is_available() is False there"
    )
    return [Difference("break", _FIT_ROW, f"{a.fields.get('torch_cuda')} on driver CUDA {a.fields.get('driver_cuda')}",
                       f"{b.fields.get('torch_cuda')} on driver CUDA {b.fields.get('driver_cuda')}", reason)]  # fmt: skip


def arch_fit(a: Side, b: Side) -> list[Difference]:
    """Each of B's GPUs needs code in B's torch arch list (SASS for it, or PTX to JIT, docs/sources.md#torch-device-requirement)."""
    if b.arch_list is None or not b.arch_list:
        return []
    out = []
    for cc in sorted(set(b.gpu_ccs)):
        if coverage(b.arch_list, cc).covered:
            continue
        if a.arch_list == b.arch_list and cc in a.gpu_ccs:
            continue  # A had the same gap
        out.append(
            Difference(
                "break",
                f"sm_{cc[0]}{cc[1]} vs arch list",
                " ".join(a.arch_list or ()) or None,
                " ".join(b.arch_list),
                f"B's torch has no kernels for its GPU (compute capability {cc[0]}.{cc[1]}): "
                "'no kernel image is available'",
            )
        )
    return out


def _magnitude(value: Any) -> tuple[float, ...]:
    """Numbers for ordering: 24.0 -> (24.0,), "gen4 x16" -> (4.0, 16.0) (generation first, then width); None -> ()."""
    if isinstance(value, (int, float)):
        return (float(value),)
    return tuple(float(x) for x in re.findall(r"\d+", str(value or "")))
