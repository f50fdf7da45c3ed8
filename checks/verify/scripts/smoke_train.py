"""Child process: the smoke-test training loop of ``invoke verify``. Run by checks/verify/smoke/launch.py.

argv[1] is the spec file (JSON). Under torchrun (``verify --nproc``/``--hosts``) each rank points its output at
``rankN.log`` in its working folder (the run's folder, N its local rank) before anything else, where the launcher
reads it; torchrun's own output stays in torchrun.log. The checkout is appended to sys.path, not prepended, so an installed package
(Hugging Face ``datasets``) wins over the checkout's own ``datasets/`` folder in the user's code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def own_log() -> None:
    local = os.environ.get("LOCAL_RANK")
    if local is not None and "TORCHELASTIC_RUN_ID" in os.environ:
        fd = os.open(f"rank{int(local)}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


own_log()
sys.path.append(str(Path(__file__).resolve().parents[3]))

from checks.verify.smoke.child import main  # noqa: E402 - after own_log and the path

if __name__ == "__main__":
    sys.exit(main(sys.argv))
