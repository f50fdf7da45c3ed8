"""``invoke sbatch``: a ready sbatch script that checks a job's nodes with the cluster's own engine.

The script runs ``invoke bootstrap`` once per node under ``srun`` (the nodes meet at the job's first node, and rank
0 writes one report for the job: checks/fleet/job.py), then ``invoke verify`` on every node: the tool's training script, or
the user's own command under ``torchrun``, as one run across the job's nodes judged in one report on the first
node (checks/verify/job.py). The job runs
where Slurm starts it, the folder ``sbatch`` ran in (``$SLURM_SUBMIT_DIR``, or ``sbatch --chdir``), so the user's
``python train.py`` finds train.py and the reports go to ``reports/slurm-<job id>/`` beside it; the tool is found
by its checkout (``invoke -r CHECKOUT``). Nothing here runs anything: the text is printed or written.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from checks.errors import PreflightError

_TIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")  # sbatch(1) --time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
_VERIFY = 'exec "$PY" -m invoke -r "$PREFLIGHT" verify --json "$REPORTS/verify-$SLURMD_NODENAME.json"'
RDZV_PORT = 29500  # torchrun's default rendezvous port (docs/sources.md#torchrun-env)


@dataclass(frozen=True)
class SbatchRequest:
    nodes: int
    gpus_per_node: int  # 0: a job without GPUs (no --gpus-per-node line; one training process per node)
    time: str
    partition: str
    account: str
    checkout: str
    python: str
    command: tuple[str, ...] = ()  # the user's training command; empty: verify's own training script


def check(r: SbatchRequest) -> None:
    """Refuse what sbatch would refuse, before a script is written (exit 2)."""
    if r.nodes < 1:
        raise PreflightError(f"--nodes {r.nodes}: a job needs at least 1 node", hint="e.g. --nodes 2")
    if r.gpus_per_node < 0:
        raise PreflightError(f"--gpus-per-node {r.gpus_per_node} is negative", hint="0 for a job without GPUs")
    if not _TIME.match(r.time):
        raise PreflightError(
            f"--time {r.time!r} is not a Slurm time", hint="MM, HH:MM:SS or D-HH:MM:SS, e.g. --time 00:30:00"
        )
    for name, value in (("--partition", r.partition), ("--account", r.account)):
        if value and not re.fullmatch(r"[\w.,+-]+", value):
            raise PreflightError(f"{name} {value!r}: only letters, digits and . , + - _ are allowed")


def render(r: SbatchRequest) -> str:
    check(r)
    q = shlex.quote
    procs = max(1, r.gpus_per_node)
    lines = [
        "#!/bin/bash",
        "# gpu-preflight: check every node of this job with Slurm itself, then judge training on them.",
        "# Submit it from your project's folder (`sbatch FILE`): your command runs there, as it does by hand, and the",
        "# reports go to reports/slurm-<job id>/ beside it.",
        "#SBATCH --job-name=gpu-preflight",
        f"#SBATCH --nodes={r.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={r.gpus_per_node}"] if r.gpus_per_node else []),
        f"#SBATCH --time={r.time}",
        "#SBATCH --output=gpu-preflight-%j.out",
        *([f"#SBATCH --partition={r.partition}"] if r.partition else []),
        *([f"#SBATCH --account={r.account}"] if r.account else []),
        "set -uo pipefail",
        "# No cd: the job runs in the folder sbatch ran in ($SLURM_SUBMIT_DIR, or sbatch --chdir).",
        f"export PREFLIGHT=${{GPU_PREFLIGHT_CHECKOUT:-{q(r.checkout)}}}  # gpu-preflight's checkout (its tasks.py)",
        f"export PY=${{GPU_PREFLIGHT_PYTHON:-{q(r.python)}}}  # the training environment's Python on every node",
        'export REPORTS="reports/slurm-$SLURM_JOB_ID"',
        'mkdir -p "$REPORTS" || exit 2',
        "# The job's first node hosts the rendezvous, at the address slurmd knows it by (NodeAddr).",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "HEAD_ADDR=$(scontrol show node \"$HEAD\" -o | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
        'export MASTER_ADDR="${MASTER_ADDR:-${HEAD_ADDR:-$HEAD}}"',
        "",
        "# 1. Every node checks itself; rank 0 writes the job's report, naming the nodes as Slurm does.",
        'srun --ntasks-per-node=1 "$PY" -m invoke -r "$PREFLIGHT" bootstrap --json "$REPORTS/bootstrap.json"',
        "checked=$?",
        "",
    ]
    if r.command:
        # The command as it runs on one box (python train.py ...): --no-python runs its words as they are. One that
        # is a torchrun command already keeps its own options.
        torchrun = (
            '"$PY" -m torch.distributed.run --nnodes="$SLURM_NNODES" '
            f"--nproc-per-node={procs} --rdzv-backend=c10d "
            f'--rdzv-endpoint="$MASTER_ADDR:{RDZV_PORT}" --rdzv-id="$SLURM_JOB_ID" --no-python'
        )
        own = r.command[0].endswith("torchrun") or "torch.distributed.run" in r.command[:3]
        torchrun = "" if own else torchrun + " "
        user = " ".join(q(w) for w in r.command)
        lines += [
            "# 2. Your training, unchanged, under torchrun across the job's nodes; verify writes one report on the first.",
            "srun --ntasks-per-node=1 bash -c " + q(f"{_VERIFY} -- {torchrun}{user}"),
        ]
    else:
        lines += [
            "# 2. verify's training script as one DDP run across the job's nodes (one report, on the first node;",
            "#    pass your command after -- to judge your own).",
            "srun --ntasks-per-node=1 bash -c " + q(_VERIFY),
        ]
    lines += [
        "verified=$?",
        'echo "gpu-preflight: reports in $PWD/$REPORTS (bootstrap exit $checked, verify exit $verified)"',
        "exit $(( checked > verified ? checked : verified ))",
    ]
    return "\n".join(lines) + "\n"
