"""Network judgements (downloads, links, all-reduce) over facts, and URL redaction."""

from __future__ import annotations

import pytest

from checks.facts import AllreduceFacts, DownloadFacts, LinkFacts, NetFacts
from checks.machine.network import allreduce_results, intra_node_gb_s, link_results, net_download, net_measurements
from checks.probe.net import redact, scrub, secrets_of
from checks.result import Status
from tests.factories import config, machine

NET = config().network
MIB = 1024**2


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:hunter2@data.example.org/x.tar", "https://***@data.example.org/x.tar"),
        ("https://ghp_abcdefghijklmnopqrstuvwxyz0123@raw.example.com/a", "https://***@raw.example.com/a"),
        ("https://s3.example.com/b/k?X-Amz-Signature=abc123&X-Amz-Expires=60", "https://s3.example.com/b/k?X-Amz-Signature=***&X-Amz-Expires=***"),
        ("https://h.example/files/AbCdEf0123456789AbCdEf0123/data.bin", "https://h.example/files/***/data.bin"),
        ("http://[::1]:8080/f#token=zzz", "http://[::1]:8080/f"),
        ("http://127.0.0.1:9/plain/file.tar", "http://127.0.0.1:9/plain/file.tar"),
    ],
)  # fmt: skip
def test_redact_hides_every_kind_of_secret(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_scrub_removes_secrets_from_error_text() -> None:
    url = "https://bob:pa55word@h.example/f?token=s3cr3t-VALUE"
    text = (
        f"ConnectionError: HTTPSConnectionPool(host='h.example'): Max retries with url: /f?token=s3cr3t-VALUE ({url})"
    )
    cleaned = scrub(text, url)
    for secret in ("pa55word", "s3cr3t-VALUE", "bob"):
        assert secret not in cleaned
    assert set(secrets_of(url)) >= {"pa55word", "s3cr3t-VALUE"}


def test_downloads_are_judged() -> None:
    fast = DownloadFacts("https://a/x", 118.0, 12.0, 64 * MIB, 0.6, 200)
    slow = DownloadFacts("https://b/x", 3.2, 250.0, 8 * MIB, 2.6, 200)
    broken = DownloadFacts("https://c/x?k=***", error="HTTP 403 Forbidden", status=403)
    results = net_download(machine(net=NetFacts(downloads=(fast, slow, broken))), config())
    assert [r.status for r in results] == [Status.OK, Status.WARN, Status.FAIL]
    assert results[0].summary.startswith("https://a/x: 118.0 MB/s, 12 ms to the first response")
    assert results[2].subject == "https://c/x?k=***" and "proxy" in (results[2].hint or "")


def test_no_url_skips_and_measurements_carry_redacted_urls() -> None:
    skipped = net_download(
        machine(net=NetFacts(skipped="no URL configured (preflight.network.download_urls)")), config()
    )
    assert skipped[0].status is Status.SKIP and "download_urls" in skipped[0].summary
    assert net_download(machine(), config())[0].status is Status.SKIP
    rows = net_measurements(machine(net=NetFacts(downloads=(DownloadFacts("https://a/x?k=***", 5.0, 3.0),))))
    assert rows is not None and rows[0].to_json() == {"url": "https://a/x?k=***", "mb_s": 5.0, "latency_ms": 3.0,
                                                      "bytes": 0, "status": None, "error": None}  # fmt: skip
    assert net_measurements(machine()) is None


def test_links_are_judged_against_the_seed_thresholds() -> None:
    links = [LinkFacts("a", "b", 9400.0, 0.2, "iperf3", 4), LinkFacts("b", "a", 25000.0, 0.2),
             LinkFacts("a", "c", 941.0, 0.3), LinkFacts("c", "a", error="connection refused")]  # fmt: skip
    results = link_results(links, NET)
    assert [r.status for r in results] == [Status.WARN, Status.OK, Status.FAIL, Status.FAIL]
    assert results[0].subject == "a->b" and results[0].summary == "9.4 Gbit/s TCP (iperf3, 4 streams), RTT 0.20 ms"
    assert "firewall" in (results[3].hint or "")


def sweep(*busbw: float, backend: str = "gloo", world: int = 2) -> list[AllreduceFacts]:
    return [AllreduceFacts(backend, world, MIB * 4**i, b * world / (2 * (world - 1)), b) for i, b in enumerate(busbw)]


def test_allreduce_skip_fail_and_levelled_ok() -> None:
    assert allreduce_results([], "skipped: needs two or more hosts", [], [], NET)[0].status is Status.SKIP
    failed = allreduce_results([], "failed on h2: exit 1: Connection refused", [], [], NET)[0]
    assert failed.status is Status.FAIL and "NCCL_SOCKET_IFNAME" in (failed.hint or "")
    link = [LinkFacts("a", "b", 1000.0)]
    ok = allreduce_results(sweep(0.05, 0.11, 0.118), None, link, [], NET)[0]
    assert ok.status is Status.OK and "94% of the slowest TCP link (1.0 Gbit/s = 0.125 GB/s)" in ok.summary


def test_allreduce_warns_when_the_largest_message_is_too_small_or_the_link_is_missed() -> None:
    rising = allreduce_results(sweep(0.02, 0.05, 0.09), None, [LinkFacts("a", "b", 1000.0)], [], NET)[0]
    assert rising.status is Status.WARN and "too small" in rising.summary
    missed = allreduce_results(sweep(0.03, 0.031), None, [LinkFacts("a", "b", 1000.0)], [], NET)[0]
    assert missed.status is Status.WARN and "GLOO_SOCKET_IFNAME" in (missed.hint or "")


def test_nccl_summary_names_the_intra_node_datasheet_link() -> None:
    h100 = "NVIDIA H100 80GB HBM3"
    assert intra_node_gb_s([h100]) == 450.0
    assert intra_node_gb_s(["NVIDIA GeForce RTX 4090"]) == pytest.approx(31.5)
    assert intra_node_gb_s(["Unknown card"]) is None
    rows = sweep(20.0, 40.0, 41.0, backend="nccl", world=16)
    r = allreduce_results(rows, None, [LinkFacts("a", "b", 100000.0)], [h100], NET)[0]
    assert "intra-node datasheet link 450 GB/s" in r.summary
