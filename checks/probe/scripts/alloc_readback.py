"""Child process (started by a fresh login shell): what does torch make of the allocator variable?

argv[1] names the variable. Prints {"env", "settings", "source", "error"} as one JSON line. On a GPU the
CUDA caching allocator's own snapshot is the proof (pytorch/pytorch#183387 showed an exported variable that
torch silently ignored); without one, torch's shared allocator-config parser is read back.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main(variable: str) -> dict[str, Any]:
    out: dict[str, Any] = {"env": os.environ.get(variable), "settings": None, "source": None, "error": None}
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"torch cannot be imported: {exc}"
        return out
    try:
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")
            settings = torch.cuda.memory._snapshot().get("allocator_settings")
            if settings is not None:
                out["settings"] = ",".join(f"{k}:{v}" for k, v in sorted(dict(settings).items()))
                out["source"] = "cuda-snapshot"
                return out
        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        if getter is not None:
            out["settings"] = str(getter())
            out["source"] = "accelerator-api"
    except Exception as exc:  # noqa: BLE001 - torch rejecting the value is the answer we report
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
    sys.stdout.flush()
