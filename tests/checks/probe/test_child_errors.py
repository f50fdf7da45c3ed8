"""What a failed child's stderr boils down to: the line that says what went wrong (checks/probe/torch.py)."""

from __future__ import annotations

import pytest

from checks.probe.torch import ChildFailed, _parse_child, telling_line

# The end of what torchrun prints when a rank's NCCL init fails (torch 2.x, two ranks; paths shortened).
TORCHRUN_TAIL = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "allreduce.py", line 120, in <module>
[rank0]:     dist.all_reduce(x)
[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1971, invalid usage, NCCL version 2.21.5
[rank0]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
E1204 03:59:37.123000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "torch/distributed/run.py", line 905, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
allreduce.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_03:59:37
  exitcode  : 1 (pid: 141)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_the_ranks_exception_is_the_reason_not_torchruns_closing_table() -> None:
    assert telling_line(TORCHRUN_TAIL).startswith("[rank0]: torch.distributed.DistBackendError: NCCL error in:")
    assert telling_line("Traceback (most recent call last):\n  File 'x.py'\nValueError: bad shape\n") == (
        "ValueError: bad shape"
    )
    assert telling_line("just a note\n=====\n") == "just a note"  # no exception: the last line with words
    assert telling_line("") == "no output"


def test_a_child_without_json_fails_with_that_line() -> None:
    with pytest.raises(ChildFailed) as failed:
        _parse_child(1, "", TORCHRUN_TAIL)
    assert str(failed.value).startswith("exited with 1: [rank0]: torch.distributed.DistBackendError: NCCL error")
    assert "=====" not in str(failed.value)
