"""The process readers of the sampling seam, against real processes."""

from __future__ import annotations

import subprocess
import sys

from checks.probe.sample import process_exists, process_tree

PARENT = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']) for _ in range(2)]\n"
    "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
    "time.sleep(30)\n"
)


def test_process_tree_finds_the_children_of_a_real_process() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        kids = {int(p) for p in parent.stdout.readline().split()}
        assert process_tree(parent.pid) == {parent.pid, *kids}
        assert process_exists(parent.pid)
    finally:
        for pid in process_tree(parent.pid) - {parent.pid}:
            subprocess.run(["kill", str(pid)], check=False)
        parent.kill()
        parent.wait()


def test_an_exited_process_does_not_exist_and_its_tree_is_itself() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not process_exists(child.pid)
    assert process_tree(child.pid) == {child.pid}


def test_a_zombie_does_not_count_as_running() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(200):  # not reaped yet: a zombie until wait()
        if not process_exists(child.pid):
            break
        subprocess.run(["sleep", "0.01"], check=False)
    assert not process_exists(child.pid)
    child.wait()
