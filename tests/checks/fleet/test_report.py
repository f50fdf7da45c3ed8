"""The fleet report over synthetic host outcomes: fail rows, tagging, outliers, JSON shape, text."""

from __future__ import annotations

from typing import Any

from checks.facts import AllreduceFacts, FleetFacts, HostOutcome, LinkFacts
from checks.fleet.render import render_fleet
from checks.fleet.report import build_fleet_report, link_scores
from checks.reports.bootstrap import DiskRow, GpuBenchRow, Inventory
from checks.result import Report, Status
from tests.factories import bootstrap_measurements, config

H100 = "NVIDIA H100 80GB HBM3"


def report(name: str, h2d: list[float], disk_read: float = 2000.0, driver: str = "ok") -> Report:
    results = [{"id": "driver", "status": driver, "summary": "driver 570", "value": None, "expected": None,
                "hint": None if driver == "ok" else "fix it", "subject": None, "duration_s": 0.0}]  # fmt: skip
    results += [{"id": "gpu-inventory", "status": "ok", "summary": H100, "value": H100, "expected": None, "hint": None,
                 "subject": f"gpu{i}", "duration_s": 0.0} for i in range(len(h2d))]  # fmt: skip
    bench = tuple(GpuBenchRow(i, v, 55.0, 2500.0, 700.0, "bfloat16", None, None) for i, v in enumerate(h2d))
    disk = DiskRow("/data", "ext4", True, 10**12, 1500.0, disk_read, 900.0, 2.0, "builtin", "local", "fadvise",
                   10**9, 10**9, False, None, (), 0)  # fmt: skip
    inventory = Inventory(len(h2d), (H100,) * len(h2d), "2.8.0", True, "2.27")
    measured = bootstrap_measurements(gpu_bench=bench, disks=(disk,), mounts=(), inventory=inventory)
    return Report.from_json(
        {"schema": 1, "host": name, "machine": "live", "results": results} | {"measurements": measured.to_json()}
    )


def outcome(name: str, **kw: Any) -> HostOutcome:
    return HostOutcome(name, "ok", None, report(name, **kw), 12.0, 0, "rsync")


def links(slow: str, names: list[str]) -> tuple[LinkFacts, ...]:
    return tuple(
        LinkFacts(a, b, 480.0 if slow in (a, b) else 9400.0, 0.1, "iperf3", 4) for a in names for b in names if a != b
    )


NAMES = ["h1", "h2", "h3", "h4"]
FLEET = FleetFacts(
    hosts=(
        outcome("h1", h2d=[55.0, 55.2]),
        outcome("h2", h2d=[54.8, 14.2]),
        outcome("h3", h2d=[55.1, 55.0], disk_read=300.0),
        outcome("h4", h2d=[55.3, 55.0]),
        HostOutcome(
            "h5", "fail", "unreachable: connection refused at 10.0.0.15:22 (no SSH server listening)", None, 0.1
        ),
    ),
    links=links("h1", NAMES),
    allreduce=(AllreduceFacts("nccl", 8, 1024**3, 20.0, 35.0, 0.05, 5),),
)


def tagged(r: Any, check_id: str, host: str | None = None, subject: str | None = None) -> list:
    return [
        res for h, res in r.results if res.id == check_id and h == host and (subject is None or res.subject == subject)
    ]


def test_failed_host_is_one_fail_row_and_the_others_keep_their_results() -> None:
    r = build_fleet_report(FLEET, config(), "ctl")
    (row,) = tagged(r, "host-bootstrap", "h5")
    assert row.status is Status.FAIL and "connection refused" in row.summary and "ssh HOST" in (row.hint or "")
    assert [x for h, x in r.results if h == "h5"] == [row]
    assert tagged(r, "driver", "h2")[0].status is Status.OK
    assert r.exit_code() == 1


def test_outliers_name_the_slow_gpu_host_link_and_disk() -> None:
    r = build_fleet_report(FLEET, config(), "ctl")
    (gpu,) = tagged(r, "fleet-outlier", "h2", "gpu1")
    assert gpu.status is Status.WARN and "host-to-device GB/s 14.2" in gpu.summary
    assert tagged(r, "fleet-outlier", "h1", "links") and tagged(r, "fleet-outlier", "h3", "disk")
    assert not tagged(r, "fleet-outlier", "h4")
    assert link_scores(FLEET.links)["h1"] == 480.0


def test_json_tags_every_result_and_lists_hosts() -> None:
    doc = build_fleet_report(FLEET, config(), "ctl").to_json()
    assert doc["schema"] == 1 and doc["machine"] == "fleet of 5 hosts (--hosts)" and doc["host"] == "ctl"
    assert all("host" in res for res in doc["results"])
    assert [h["host"] for h in doc["hosts"]] == ["h1", "h2", "h3", "h4", "h5"]
    assert doc["hosts"][4]["status"] == "fail" and doc["hosts"][4]["reason"].startswith("unreachable")
    assert (
        sum(h["counts"]["fail"] for h in doc["hosts"])
        + sum(1 for res in doc["results"] if res["host"] is None and res["status"] == "fail")
        == doc["counts"]["fail"]
    )
    m = doc["measurements"]
    assert set(m["links"][0]) >= {"src", "dst", "tcp_mbit_s", "rtt_ms", "tool"}
    assert set(m["allreduce"][0]) >= {"backend", "world_size", "bytes", "algbw_gb_s", "busbw_gb_s"}
    assert m["disks"][0]["host"] == "h1" and set(m["hosts"]) == {"h1", "h2", "h3", "h4"}


def test_text_shows_table_matrix_sweep_and_folds_identical_findings() -> None:
    hosts = tuple(outcome(n, h2d=[55.0], driver="fail") for n in ("h1", "h2")) + FLEET.hosts[4:]
    text = render_fleet(build_fleet_report(FleetFacts(hosts, links("h9", ["h1", "h2"])), config(), "ctl"))
    assert "fleet of 3 hosts from --hosts (controller ctl)" in text
    assert "TCP Mbit/s, row sends to column (iperf3)" in text
    assert "FAIL  driver @h1,h2" in text and "host-bootstrap @h5" in text
    assert text.rstrip().splitlines()[-1].startswith("next: fix ")
    lines = text.splitlines()
    row = lines.index(next(x for x in lines if x.startswith("TCP Mbit/s"))) + 2
    assert lines[row].split() == ["h1", "-", "9400"]


def test_links_not_measured_says_why() -> None:
    only = FleetFacts((outcome("h1", h2d=[55.0]),), links_skipped="needs two or more hosts that ran bootstrap")
    assert "links: not measured (needs two or more hosts" in render_fleet(build_fleet_report(only, config(), "ctl"))
