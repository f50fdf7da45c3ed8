"""The exchange A/B's noise guard (``checks/verify/user/exchange.py``): its figure replaces the comm hook's only
where its repeats agree within ``verify.exchange_ab_tolerance``. The re-runs are faked by what ``measure`` makes of
them: each leg's mean step per run."""

from __future__ import annotations

from checks.config import make_config
from checks.reports.verify import DdpFigures, RankRow
from checks.verify.user import exchange
from checks.verify.user import judge as j

TOLERANCE = make_config().verify.exchange_ab_tolerance
HOOK = DdpFigures(
    world_size=2,
    backend="gloo",
    per_rank=(RankRow(0, median_s=0.2, own_s=0.1), RankRow(1, median_s=0.2, own_s=0.1)),
    comm_exposed_ms=77.0,
    comm_share=0.385,
)


def judged(sync: list[float], skip: list[float]) -> DdpFigures:
    ab = exchange.figures({"sync": sync, "skip": skip}, TOLERANCE)
    assert ab is not None
    return j.with_exchange(HOOK, ab)


def test_repeats_that_agree_replace_the_hooks_figure() -> None:
    d = judged([0.200, 0.204], [0.120, 0.118])  # spreads 4 + 2 ms: 3% of a 202 ms step
    assert d.ab is not None and d.ab.agreed is True and d.ab.noise is None and d.ab.tolerance == TOLERANCE
    assert d.comm_exposed_ms == 83.0 and d.comm_share == round(0.083 / 0.202, 4)
    assert "noise" not in d.ab.to_json() and d.ab.to_json()["agreed"] is True


def test_one_run_of_a_leg_is_too_noisy_to_call_and_the_hook_stands() -> None:
    """The case found: one repeat of each leg read 16 ms of exchange against the hook's 77 ms."""
    d = judged([0.200], [0.184])
    assert d.ab is not None and d.ab.agreed is False
    assert (d.comm_exposed_ms, d.comm_share) == (77.0, 0.385)  # the hook's
    assert d.ab.noise == (
        "too noisy to call: 1 unchanged and 1 skipped run(s), and one run of a leg does not show how far its "
        "repeats agree"
    )


def test_repeats_that_disagree_are_too_noisy_to_call_with_their_spread() -> None:
    d = judged([0.180, 0.220], [0.120, 0.190])  # spreads 40 + 70 ms: 55% of a 200 ms step
    assert d.ab is not None and d.ab.agreed is False and (d.comm_exposed_ms, d.comm_share) == (77.0, 0.385)
    assert d.ab.noise is not None
    assert "differ by 40.0 ms (unchanged) and 70.0 ms (skipped), 55% of the 200.0 ms step, over the 10%" in d.ab.noise
    assert d.ab.sync_spread_s == 0.04 and d.ab.no_sync_spread_s == 0.07  # the spread itself is reported


def test_the_tolerance_is_the_sum_of_both_spreads_against_the_step() -> None:
    assert exchange.noise([0.195, 0.205], [0.100, 0.109], 0.10) is None  # 10 + 9 ms of a 200 ms step: 9.5%
    assert exchange.noise([0.195, 0.205], [0.100, 0.111], 0.10) is not None  # 10 + 11 ms: 10.5%
    assert exchange.figures({"sync": [0.2], "skip": []}, 0.10) is None  # no run of a leg: no A/B at all
