"""gpu-preflight's start-up file for ``invoke verify -- COMMAND`` (standard library only, no torch).

verify copies this folder's two files into a temporary folder and puts that folder first on ``PYTHONPATH``, so
every Python process the command starts imports this file at start-up (``site`` imports the first
``sitecustomize`` on ``sys.path``). It runs the ``sitecustomize`` that would have run without it (the user's,
a distribution's) and then arms the agent, which installs its hooks only once the process imports torch.
"""

from __future__ import annotations

import os
import sys


def _chain() -> None:
    """Import the next ``sitecustomize`` on ``sys.path`` (ours hidden meanwhile), as if ours were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401 - the next one on the path: the user's own, or a distribution's
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        theirs = sys.modules.get("sitecustomize")
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        if theirs is not None and theirs is not ours:
            sys.modules["_gpu_preflight_user_sitecustomize"] = theirs


def _arm() -> None:
    if not os.environ.get("GPU_PREFLIGHT_EVENTS"):
        return
    import _gpu_preflight_agent

    _gpu_preflight_agent.arm()


try:
    _chain()
finally:
    _arm()
