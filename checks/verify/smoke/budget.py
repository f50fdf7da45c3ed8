"""The whole command's budget as the training child spends it (child process; the rule is ``checks/verify/stop.py``).

The parent puts the deadline in ``RunSpec.stop``; the child keeps, of the time left after the warm-up, what the
phases after the measured steps need (``reserve``), and the extras after them run on what is left then: an
extra that does not fit is not run or is shortened, and is a ``Cut`` in the result naming the flag that gets it.
"""

from __future__ import annotations

import math
import time
from typing import Any

from checks.verify import stop as rule
from checks.verify.contract import Cut, RunSpec
from checks.verify.smoke.candidates import MIN_CANDIDATE_S


class Budget:
    """Seconds left, the reserve of the phases after the measured steps, and the cuts (into ``result["cuts"]``)."""

    def __init__(self, spec: RunSpec, result: dict[str, Any]) -> None:
        self.spec, self.result = spec, result

    def left(self) -> float:
        """Seconds of the budget left (infinite without one)."""
        stop = self.spec.stop
        return stop.deadline - time.monotonic() if stop is not None and stop.deadline > 0 else math.inf

    def deadline(self) -> float:
        """The monotonic deadline, 0 without one (the extras' own argument)."""
        left = self.left()
        return time.monotonic() + left if left < math.inf else 0.0

    def cut(self, part: str, summary: str, short_s: float) -> None:
        stop = self.spec.stop
        assert stop is not None
        fix = f"--budget {rule.more_budget(stop.budget_s, short_s)}"
        self.result.setdefault("cuts", []).append(Cut(part, summary, fix).to_json())

    def fits(self, part: str, needed: float, what: str) -> bool:
        """Whether an asked extra fits in the budget left; if not, it is a cut and does not run."""
        left = self.left()
        if needed <= left:
            return True
        self.cut(part, f"{what} not run: about {needed:.0f} s needed, {max(left, 0):.0f} s left", needed - left)
        return False

    def probe_seconds(self, asked: float) -> float:
        """verify.loader_probe_s, or what the budget leaves of it (0: not run, a cut)."""
        room = self.left() - rule.PROBE_START_S
        if room >= asked:
            return asked
        what = "the DataLoader alone (the measured loader advice)"
        if room < MIN_CANDIDATE_S * 2:
            self.cut("loader_alone", f"{what} not timed: {max(room, 0):.0f} s left", asked - room)
            return 0.0
        self.cut("loader_alone", f"{what} timed for {room:.1f} s of verify.loader_probe_s {asked:g} s", asked - room)
        return room

    def reserve(self, step_s: float, data_share: float, cuda: bool) -> float:
        """Seconds the phases after the measured steps need (the budget keeps them): the checkpoint round trip,
        the kernel profile, the loader probe when the warm-up waited for data."""
        s = self.spec
        out = 0.0
        if s.checkpoint:
            out += 2 * s.checkpoint.resume_steps * step_s + rule.CKPT_FIXED_S
        if cuda:
            out += s.profile_steps * step_s + rule.CKPT_FIXED_S
        if s.loader_probe and data_share >= s.loader_probe.min_share:
            out += s.loader_probe.seconds + rule.PROBE_START_S
        return out
