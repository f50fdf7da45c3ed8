"""A torchrun command read apart (``checks/verify/torchrun.py``), as ``--hosts`` and the solo leg read it."""

from __future__ import annotations

from checks.verify import torchrun
from checks.verify.torchrun import Torchrun


def test_the_node_flags_go_and_the_rest_stays_in_order() -> None:
    argv = ["env", "A=1", "torchrun", "--nnodes", "2", "--rdzv-endpoint=h:29500", "--max-restarts", "3", "--standalone",
            "train.py", "--lr", "0.1"]  # fmt: skip
    assert torchrun.parse(argv) == Torchrun(
        ("env", "A=1"), ("torchrun",), ("--max-restarts", "3"), ("train.py", "--lr", "0.1")
    )


def test_python_m_and_a_module_program() -> None:
    parts = torchrun.parse(["python3", "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "pkg.train", "x"])
    assert parts == Torchrun((), ("python3", "-m", "torch.distributed.run"), ("-m",), ("pkg.train", "x"))


def test_what_is_not_torchrun_or_has_no_program_says_so() -> None:
    assert torchrun.parse(["python", "train.py"]) == torchrun.NOT_TORCHRUN
    assert torchrun.parse([]) == torchrun.NOT_TORCHRUN
    assert torchrun.parse(["torchrun", "--nnodes", "2"]) == torchrun.NO_PROGRAM
