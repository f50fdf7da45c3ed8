"""Child process: report the torch build as one JSON line. Run by checks/probe/torch.py; imports no project code."""

from __future__ import annotations

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
    }


if __name__ == "__main__":
    print(json.dumps(main()))
    sys.stdout.flush()
