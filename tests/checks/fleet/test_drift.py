"""The fleet's drift table and results from hosts' reports (the environment section bootstrap writes)."""

from __future__ import annotations

from typing import Any

from checks.fleet.drift import drift_results, drift_table, environments
from checks.reports.bootstrap import BootstrapMeasurements
from checks.result import Status
from tests.factories import bootstrap_measurements, environment

BASE = {"driver": "570.124.06", "torch": "2.8.0+cu128", "torch_cuda": "12.8", "nccl": "2.27.3", "python": "3.11.9",
        "packages": {"numpy": "2.1.0"}}  # fmt: skip


def host(name: str, **env: Any) -> tuple[str, BootstrapMeasurements]:
    """A host's measurements as its report's typed reader gives them, its environment changed by ``env``."""
    return name, bootstrap_measurements(environment=environment(**{**BASE, **env}))


def fleet(*hosts: tuple[str, BootstrapMeasurements]) -> dict[str, BootstrapMeasurements]:
    return dict(hosts)


def test_nccl_off_the_majority_fails_and_a_package_warns() -> None:
    hosts = fleet(host("h1"), host("h2"), host("h3", nccl="2.21.5", packages={"numpy": "1.26.4"}))
    got = {(h, r.subject): r.status for h, r in drift_results(environments(hosts))}
    assert got == {("h3", "NCCL"): Status.FAIL, ("h3", "numpy"): Status.WARN}
    table = drift_table(environments(hosts))
    assert table[0] == ["host", "NCCL", "numpy"] and table[3] == ["h3", "2.21.5", "1.26.4"]


def test_agreeing_hosts_and_old_reports_have_no_drift() -> None:
    old = ("h9", bootstrap_measurements(environment=None))  # a report written before the environment block
    hosts = fleet(host("h1"), host("h2"), old)
    assert set(environments(hosts)) == {"h1", "h2"}
    assert drift_results(environments(hosts)) == [] and drift_table(environments(hosts)) == []


def test_torch_and_cuda_build_drift_fail() -> None:
    hosts = fleet(host("h1"), host("h2"), host("h3", torch="2.8.0+cu126", torch_cuda="12.6"))
    failed = {r.subject for _, r in drift_results(environments(hosts)) if r.status is Status.FAIL}
    assert failed == {"torch", "CUDA build"}


def test_a_host_without_torch_is_one_fail_not_three() -> None:
    """Its CUDA build and NCCL are read from torch: missing with it, they are the torch row's consequence (with a
    CUDA torch on the others they made two more fail rows and two more table columns)."""
    hosts = fleet(host("h1"), host("h2"), host("h3", torch=None, torch_cuda=None, nccl=None))
    assert [(h, r.subject, r.status) for h, r in drift_results(environments(hosts))] == [("h3", "torch", Status.FAIL)]
    table = drift_table(environments(hosts))
    assert table[0] == ["host", "torch"] and table[3] == ["h3", "-"]
