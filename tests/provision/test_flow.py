"""The host flow's pieces that need no host: the module line it runs there, how it reads the answer, and how it
waits for hosts side by side (the flow itself runs against real sshd in test_remote.py and the verify and fleet
host suites)."""

from __future__ import annotations

import _thread
import concurrent.futures
import signal
import sys
import threading
import time

import pytest

from provision.flow import at_once, in_parallel, json_tail, module_script
from provision.remote import Completed, Prepared
from tests.waiting import until


def test_a_module_runs_from_the_checkout_with_the_hosts_python_and_quoted_arguments() -> None:
    prepared = Prepared("'/opt/py 3/bin/python'", "/home/me/gpu preflight", "/tmp/run.x", True, False)
    assert module_script(prepared, "checks.probe.tcp", ["rtt", "10.0.0.1", "a b"]) == (
        "cd '/home/me/gpu preflight' && exec env -u SLURM_JOB_NODELIST '/opt/py 3/bin/python' -m checks.probe.tcp "
        "rtt 10.0.0.1 'a b'"
    )
    assert module_script(prepared, "checks.verify.user.node", []).endswith("-m checks.verify.user.node")


def test_the_answer_is_the_last_json_line_else_the_exit_and_the_last_stderr_line() -> None:
    assert json_tail(Completed(0, 'warming up\n{"port": 29500}\n', "")) == {"port": 29500}
    assert json_tail(Completed(1, "", "Traceback\nImportError: no torch\n")) == {
        "error": "exit 1: ImportError: no torch"
    }
    assert json_tail(Completed(-1, "half a line", "")) == {"error": "exit -1: no output"}
    assert json_tail(Completed(2, "", "x" * 1000)) == {"error": f"exit 2: {'x' * 300}"}


def test_jobs_side_by_side_come_back_in_order() -> None:
    assert at_once([lambda: 1, lambda: 2, lambda: 3]) == [1, 2, 3]
    assert at_once([lambda: time.sleep(5)], join_s=0.1) == [None]  # one that does not finish in time

    def slow() -> str:
        time.sleep(0.2)  # finishes after the fast one: the futures still come back in the jobs' order
        return "slow"

    futures = in_parallel([slow, lambda: "fast"], 2, threading.Event())
    assert [f.result() for f in futures] == ["slow", "fast"]


def main_waits_on_its_jobs() -> bool:
    """The main thread is inside in_parallel's wait for its futures (not still submitting them: Ctrl-C there is
    not this test's case)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    called = None
    while frame is not None:
        if frame.f_code.co_name == "in_parallel":
            return called is not None and called.f_code is concurrent.futures.wait.__code__
        called, frame = frame, frame.f_back
    return False


def test_ctrl_c_while_waiting_sets_stop_and_the_jobs_reach_it_before_it_is_raised() -> None:
    stop, seen = threading.Event(), list[bool]()

    def job() -> None:
        until(main_waits_on_its_jobs, 10, what="in_parallel to wait on its jobs")
        _thread.interrupt_main()  # what Ctrl-C does to the main thread
        seen.append(stop.wait(10))

    start = time.monotonic()
    # interrupt_main does nothing while SIGINT is ignored, as it is in a suite started as a background job
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            in_parallel([job], 4, stop)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stop.is_set() and seen == [True] and time.monotonic() - start < 5
