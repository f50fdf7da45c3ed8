"""checks/units.py: small but real figures never print as 0, and nearly all never as 100%; a size says its unit."""

from __future__ import annotations

from checks.units import GB, GIB, KIB, MIB, TIB, count, duration, money, percent, size_binary, size_decimal


def test_a_share_that_is_neither_none_nor_all_keeps_its_side() -> None:
    assert [percent(x) for x in (0.0, 0.004, 0.5, 0.996, 1.0)] == ["0%", "<1%", "50%", ">99%", "100%"]


def test_counts_scale_their_unit() -> None:
    assert [count(n) for n in (512, 3_100, 1_900_000, 7e9)] == ["512", "3.1K", "1.9M", "7.0B"]


def test_the_binary_constants_are_powers_of_two_and_the_decimal_one_a_power_of_ten() -> None:
    assert (KIB, MIB, GIB, TIB) == (2**10, 2**20, 2**30, 2**40)
    assert GB == 10**9


def test_a_decimal_size_is_in_powers_of_ten_as_disks_and_links_are_sold() -> None:
    assert [size_decimal(n) for n in (512, 21_000, 1_234_567, 3.4e9)] == ["512 B", "21 KB", "1.2 MB", "3.4 GB"]
    assert size_decimal(GIB) == "1.1 GB"  # the same bytes read larger in decimal units


def test_a_binary_size_is_in_powers_of_two_as_memory_and_free_space_are_counted() -> None:
    assert [size_binary(n) for n in (0, 512 * KIB, 243.6 * MIB, 3 * GIB, 50 * GIB, 1.5 * TIB)] == [
        "0.0 MiB",
        "0.5 MiB",
        "243.6 MiB",
        "3.0 GiB",
        "50.0 GiB",
        "1.5 TiB",
    ]
    assert size_binary(10**9) == "953.7 MiB"  # a decimal GB is less than a GiB


def test_money_and_durations_for_a_tiny_run() -> None:
    assert [money(x) for x in (0.0042, 0.0125, 1234.5, 0.0)] == ["$0.0042", "$0.01", "$1,234.50", "$0.00"]
    assert [duration(h) for h in (0.0157, 0.15, 2.5)] == ["56.5 s", "9.0 min", "2.50 h"]
