"""Child process: report the torch build as one JSON line. Run by checks/probe/torch.py; imports no project code."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import warnings
from importlib import metadata
from typing import Any


def _try(fn: Any, default: Any = None) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a missing library is an answer (None), not a crash
        return default


def _libs() -> dict[str, str]:
    out = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-"):
            out[name] = dist.version
    return out


def _torchvision_op(torch: Any) -> bool:
    """One compiled op on tiny CPU tensors: a torchvision built for another torch fails here (or at import)."""
    torch.ops.torchvision.nms(torch.zeros((1, 4)), torch.zeros(1), 0.5)
    return True


def _torchaudio_op(torch: Any) -> bool:
    """torchaudio loads libtorchaudio at import; its own check compares the library's CUDA with torch's."""
    import torchaudio._extension as ext

    check = getattr(ext, "_check_cuda_version", None)
    if check is None or not getattr(ext, "_IS_TORCHAUDIO_EXT_AVAILABLE", False):
        return False  # a torchaudio without the compiled library: importing it was the whole test
    check()
    return True


# package -> (the op called, how); imported after torch, as a training script does
_EXTENSIONS = {
    "torchvision": ("torchvision::nms", _torchvision_op),
    "torchaudio": ("torchaudio::cuda_version", _torchaudio_op),
}


def _version(name: str, module: Any) -> str:
    """The module's own ``__version__`` (``0.23.0+cu128`` names the build), else the distribution's."""
    if getattr(module, "__version__", None):
        return str(module.__version__)
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def _extension(name: str, torch: Any) -> dict[str, Any]:
    """Import ``name`` beside this torch and call one of its compiled ops; the error is the answer."""
    if importlib.util.find_spec(name) is None:
        return {"name": name}
    op, call = _EXTENSIONS[name]
    module = None
    try:
        module = importlib.import_module(name)
        called = call(torch)
    except Exception as exc:  # noqa: BLE001 - what fails is the fact this probe reports
        text = (str(exc).strip().splitlines() or [""])[0]
        return {
            "name": name,
            "version": _version(name, module),
            "op": op,
            "error": f"{type(exc).__name__}: {text}"[:300],
        }
    return {"name": name, "version": _version(name, module), "op": op if called else None}


def main() -> dict[str, Any]:
    try:
        import torch
    except ModuleNotFoundError:
        return {"error": "torch is not installed", "error_kind": "missing"}
    except Exception as exc:  # noqa: BLE001
        return {"error": f"import torch failed: {type(exc).__name__}: {exc}", "error_kind": "import-error"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
    init = [str(w.message) for w in caught if "CUDA" in str(w.message) or "cuda" in str(w.message)]
    compiled = _try(lambda: torch._C._cudnn.getCompileVersion())
    nccl = _try(lambda: torch.cuda.nccl.version())
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "arch_list": _try(lambda: list(torch.cuda.get_arch_list()), []),
        "cudnn_version": _try(lambda: torch.backends.cudnn.version()) if torch.version.cuda else None,
        "cudnn_compiled_version": ".".join(str(x) for x in compiled) if compiled else None,
        "nccl_version": ".".join(str(x) for x in nccl[:3])
        if isinstance(nccl, tuple)
        else (str(nccl) if nccl else None),
        "cuda_available": available,
        "device_count": _try(lambda: torch.cuda.device_count(), 0) if available else 0,
        "cuda_init_error": init[0] if init and not available else None,
        "requires": [r for r in (metadata.requires("torch") or []) if r.startswith("nvidia-")],
        "installed_libs": _libs(),
        "extensions": [_extension(name, torch) for name in _EXTENSIONS],
    }


if __name__ == "__main__":
    print(json.dumps(main()))
    sys.stdout.flush()
