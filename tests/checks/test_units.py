"""checks/units.py: small but real figures never print as 0, and nearly all never as 100%."""

from __future__ import annotations

from checks.units import count, duration, money, percent, size


def test_a_share_that_is_neither_none_nor_all_keeps_its_side() -> None:
    assert [percent(x) for x in (0.0, 0.004, 0.5, 0.996, 1.0)] == ["0%", "<1%", "50%", ">99%", "100%"]


def test_counts_and_sizes_scale_their_unit() -> None:
    assert [count(n) for n in (512, 3_100, 1_900_000, 7e9)] == ["512", "3.1K", "1.9M", "7.0B"]
    assert [size(n) for n in (512, 21_000, 1_234_567, 3.4e9)] == ["512 B", "21 KB", "1.2 MB", "3.4 GB"]


def test_money_and_durations_for_a_tiny_run() -> None:
    assert [money(x) for x in (0.0042, 0.0125, 1234.5, 0.0)] == ["$0.0042", "$0.01", "$1,234.50", "$0.00"]
    assert [duration(h) for h in (0.0157, 0.15, 2.5)] == ["56.5 s", "9.0 min", "2.50 h"]
