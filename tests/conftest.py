"""Make the repository root importable for the tests, keep each test's cache folder private, and hold the
markers to their meaning.

``slow`` is wall time: a test (its setup, call and teardown, module fixtures it starts first included) that takes
more than about ``SLOW_S`` on the 2-core box. ``pytest --check-markers`` lists the unmarked tests over ``SLOW_S``
(and fails the run if there are any), so a marker is set by measurement, not by guess; it also lists the
``slow`` tests well under it, for a look: a test that only reads the result of a slow module fixture is one of
them and rightly slow (run alone, it pays for the fixture). ``measures`` marks tests whose verdict depends on how fast this
machine is (they time real work against a threshold): robust to a shared box where they can be, skipped with the
reason where they cannot.

The suite runs on pytest-xdist workers (``-n auto --dist loadfile`` in pyproject.toml: one per core, at most
``MAX_WORKERS``; a test file stays on one worker). A ``measures`` test has the box alone: it takes an exclusive
lock that every other test takes shared, from its setup (module fixtures first built there included) to its
teardown, so no other worker's test runs beside it. Files go to the workers heaviest first (the seconds each took
in an earlier whole run, ``tests/file_seconds.json``; ``pytest --record-file-seconds`` rewrites it), so the last
file a worker takes is a short one instead of the verify-across-hosts module.

Byte code: many tests start Python processes that import the checkout's modules (a torch child per verify run).
Where ``PYTHONDONTWRITEBYTECODE`` is set (as on the CI box) each of them compiled every module again; the suite
and its children write byte code instead, under ``.pytest_cache/pycache`` (``PYTHONPYCACHEPREFIX``), so no
``__pycache__`` folder appears in the checkout or in a test's own folders.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PYCACHE = ROOT / ".pytest_cache" / "pycache"
if not os.environ.get("PYTHONPYCACHEPREFIX"):  # a developer's own prefix is kept
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = str(PYCACHE)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # children inherit both (the xdist workers start after this)
sys.dont_write_bytecode = False
# Two workers each running a torch child: 4 OpenMP threads on 2 cores, and libgomp's threads spin at every barrier
# while the thread they wait for is off the core. A verify child beside one other torch process took 13-15 s of
# CPU (and of wall) instead of 3; with passive waiting, 3.6 s. A developer's own setting is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tests.fakes.cli import Here, in_process  # noqa: E402 - after the path and byte-code settings

SLOW_S = 1.0  # more than this (setup + call + teardown) on the 2-core box: mark it slow
FAST_S = 0.3  # a slow-marked test under this is listed for a look (a x3 margin under SLOW_S)
MAX_WORKERS = 4  # -n auto on a big box: more workers would only queue on the measures tests' lock
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")  # {test file: wall seconds in a whole run}

_seconds: defaultdict[str, float] = defaultdict(float)
_slow_marked: set[str] = set()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A live bootstrap keeps its disk measurements under $XDG_CACHE_HOME: never the real one from a test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture(autouse=True)
def _strict_agent_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every agent line a test's command writes is parsed strictly (``checks.verify.events.STRICT``): a line of a
    kind, or with a field, that no record names fails the test that ran it, where verify itself drops it."""
    from checks.verify import events

    monkeypatch.setattr(events, "STRICT", True)


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Here:
    """The tool's CLI run in this process (tests/fakes/cli.py): ``here(home, "bootstrap", "--json", "-")``."""
    return in_process(monkeypatch, capsys)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


_BOX_LOCK = "gpu_preflight_box_lock"  # the key in each worker's workerinput
_made_locks: list[Path] = []  # the controller's: the one lock file of this run, made when the first worker starts
# How the box lock went, per worker (sent to the controller at its end) and summed there: the seconds the measures
# tests held the box alone, and the seconds tests waited for the lock (shared: for a measures test to finish).
_box: defaultdict[str, float] = defaultdict(float)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: the controller, once per worker it starts
def pytest_configure_node(node: Any) -> None:
    if not _made_locks:
        fd, name = tempfile.mkstemp(prefix="gpu-preflight-tests-", suffix=".lock")
        os.close(fd)
        _made_locks.append(Path(name))
    node.workerinput[_BOX_LOCK] = str(_made_locks[0])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = getattr(item.config, "workerinput", {}).get(_BOX_LOCK)  # None outside xdist: one process needs no lock
    if path is None:
        yield
        return
    alone = item.get_closest_marker("measures") is not None
    with open(path, "a") as fh:
        asked = time.monotonic()
        fcntl.flock(fh, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        got = time.monotonic()
        _box[f"{'alone' if alone else 'shared'}_waited_s"] += got - asked
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            if alone:
                _box["alone_held_s"] += time.monotonic() - got
                _box["alone_tests"] += 1


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _made_locks:  # the controller, once its workers are done
        path.unlink(missing_ok=True)
    _made_locks.clear()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-file-seconds",
        action="store_true",
        help=f"write each test file's seconds in this run to {FILE_SECONDS.name} (the heaviest-first order)",
    )
    parser.addoption(
        "--check-markers",
        action="store_true",
        help=f"list tests not marked slow that took over {SLOW_S} s (and fail), and slow ones under {FAST_S} s",
    )


def heaviest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """``items`` with their files in decreasing recorded seconds (a file not recorded: the median of those that
    are), each file's tests in their own order; ties keep the collection order. Every worker sorts the same
    collection the same way, as xdist requires."""
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))
    known = sorted(seconds[f] for f in files if f in seconds)
    default = known[len(known) // 2] if known else 0.0
    rank = {f: (-seconds.get(f, default), i) for i, f in enumerate(files)}
    return sorted(items, key=lambda item: rank[item.nodeid.split("::")[0]])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _slow_marked.update(item.nodeid for item in items if item.get_closest_marker("slow"))
    try:
        recorded = json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        recorded = {}
    items[:] = heaviest_first(items, recorded)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] += report.duration


def mislabelled(seconds: dict[str, float], slow: set[str]) -> tuple[list[str], list[str]]:
    """(unmarked tests over SLOW_S, slow-marked tests under FAST_S), slowest first and fastest first."""
    unmarked = sorted((s, n) for n, s in seconds.items() if n not in slow and s > SLOW_S)
    marked = sorted((s, n) for n, s in seconds.items() if n in slow and s < FAST_S)
    return [f"{s:6.2f} s  {n}" for s, n in reversed(unmarked)], [f"{s:6.2f} s  {n}" for s, n in marked]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    if _box:  # under xdist: what holding the box alone cost the other workers
        terminalreporter.line(
            f"box lock: {int(_box['alone_tests'])} measures tests held the box alone for {_box['alone_held_s']:.0f} s;"
            f" other tests waited {_box['shared_waited_s']:.0f} s for them, they waited {_box['alone_waited_s']:.0f} s"
        )
    if not config.getoption("--check-markers"):
        return
    unmarked, marked = mislabelled(dict(_seconds), _slow_marked)
    terminalreporter.section("markers against wall time")
    terminalreporter.line(f"not marked slow, over {SLOW_S} s: {len(unmarked)}")
    for line in unmarked:
        terminalreporter.line("  " + line)
    terminalreporter.line(f"marked slow, under {FAST_S} s: {len(marked)}")
    for line in marked:
        terminalreporter.line("  " + line)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: the controller, as each worker ends
def pytest_testnodedown(node: Any, error: Any) -> None:
    for key, value in getattr(node, "workeroutput", {}).get(_BOX_LOCK, {}).items():
        _box[key] += value


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        session.config.workeroutput[_BOX_LOCK] = dict(_box)  # type: ignore[attr-defined]
    if session.config.getoption("--record-file-seconds") and not hasattr(session.config, "workerinput"):
        per_file: defaultdict[str, float] = defaultdict(float)
        for nodeid, seconds in _seconds.items():
            per_file[nodeid.split("::")[0]] += seconds
        text = json.dumps({f: round(s, 1) for f, s in sorted(per_file.items())}, indent=1) + "\n"
        tmp = FILE_SECONDS.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(FILE_SECONDS)
    if session.config.getoption("--check-markers") and exitstatus == 0 and mislabelled(dict(_seconds), _slow_marked)[0]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
