"""Child process: the smoke-test training loop of ``invoke verify``. Run by checks/verify/smoke/launch.py.

argv[1] is the spec file (JSON). The checkout is appended to sys.path, not prepended, so an installed package
(Hugging Face ``datasets``) wins over the checkout's own ``datasets/`` folder in the user's code.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[3]))

from checks.verify.smoke.child import main

if __name__ == "__main__":
    sys.exit(main(sys.argv))
