"""The fleet's drift table and results from hosts' reports (the environment section bootstrap writes)."""

from __future__ import annotations

from typing import Any

from checks.facts import HostOutcome
from checks.fleet.drift import drift_results, drift_table, environments
from checks.result import Report, Status


def host(name: str, **env: Any) -> HostOutcome:
    base = {"driver": "570.124.06", "torch": "2.8.0+cu128", "torch_cuda": "12.8", "nccl": "2.27.3", "python": "3.11.9",
            "packages": {"numpy": "2.1.0"}}  # fmt: skip
    report = Report(name, "live", (), {"environment": {**base, **env}})
    return HostOutcome(name=name, status="ok", reason=None, report=report, seconds=1.0)


def test_nccl_off_the_majority_fails_and_a_package_warns() -> None:
    hosts = (host("h1"), host("h2"), host("h3", nccl="2.21.5", packages={"numpy": "1.26.4"}))
    got = {(h, r.subject): r.status for h, r in drift_results(hosts)}
    assert got == {("h3", "NCCL"): Status.FAIL, ("h3", "numpy"): Status.WARN}
    table = drift_table(environments(hosts))
    assert table[0] == ["host", "NCCL", "numpy"] and table[3] == ["h3", "2.21.5", "1.26.4"]


def test_agreeing_hosts_and_old_reports_have_no_drift() -> None:
    old = HostOutcome(name="h9", status="ok", reason=None, report=Report("h9", "live", ()), seconds=1.0)
    hosts = (host("h1"), host("h2"), old)
    assert drift_results(hosts) == [] and drift_table(environments(hosts)) == []


def test_torch_and_cuda_build_drift_fail() -> None:
    hosts = (host("h1"), host("h2"), host("h3", torch="2.8.0+cu126", torch_cuda="12.6"))
    assert {r.subject for _, r in drift_results(hosts) if r.status is Status.FAIL} == {"torch", "CUDA build"}


def test_a_host_without_torch_is_one_fail_not_three() -> None:
    """Its CUDA build and NCCL are read from torch: missing with it, they are the torch row's consequence (with a
    CUDA torch on the others they made two more fail rows and two more table columns)."""
    hosts = (host("h1"), host("h2"), host("h3", torch=None, torch_cuda=None, nccl=None))
    assert [(h, r.subject, r.status) for h, r in drift_results(hosts)] == [("h3", "torch", Status.FAIL)]
    table = drift_table(environments(hosts))
    assert table[0] == ["host", "torch"] and table[3] == ["h3", "-"]
