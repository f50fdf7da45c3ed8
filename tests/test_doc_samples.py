"""The sample outputs in README.md and docs/ are what the tool prints today.

A sample is a ```text block whose first line is ``$ COMMAND``. Where the command's output does not depend on the
machine (a replayed snapshot, an analytic plan), it is run here and the block must match it line for line; a line
that is only ``...`` stands for any number of lines left out. Live samples (a bootstrap of this machine) cannot be
replayed: they must still show a row of every check the runner has. On a mismatch the test prints the
command's whole output to paste.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakes.cli import REPO, Here

DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
# Commands whose output depends only on the checkout: what is run here.
REPLAYABLE = re.compile(
    r"^(NO_COLOR=1 )?invoke (bootstrap --machine tests/fixtures/\S+\.json|plan --params .*"
    r"|plan --model tests\.\S+ .*--machine tests/fixtures/\S+\.json)$"
)
LIVE_BOOTSTRAP = re.compile(r"^(NO_COLOR=1 )?invoke bootstrap$")
# The runner's gpu-bench check reports as these rows.
BENCH = {row: "gpu-bench" for row in ("gpu-h2d", "gpu-d2h", "gpu-d2d", "gpu-matmul")}


@dataclass(frozen=True)
class Sample:
    doc: Path
    line: int  # 1-based line of the ``$`` line
    command: str
    lines: tuple[str, ...]  # what the doc shows after the command, up to the block's end or the next ``$``

    def __str__(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}: $ {self.command}"


def samples(doc: Path) -> list[Sample]:
    """Every ``$ command`` in the doc's ```text blocks, with the lines shown under it."""
    found: list[Sample] = []
    block: list[tuple[int, str]] | None = None
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if block is None:
            block = [] if line.strip() == "```text" else None
            continue
        if line.strip() == "```":
            found += _split(doc, block)
            block = None
        else:
            block.append((number, line))
    return found


def _split(doc: Path, block: list[tuple[int, str]]) -> list[Sample]:
    starts = [i for i, (_, line) in enumerate(block) if line.startswith("$ ")]
    ends = [*starts[1:], len(block)] if starts else []
    return [
        Sample(doc, block[s][0], block[s][1][2:], tuple(line.rstrip() for _, line in block[s + 1 : e]))
        for s, e in zip(starts, ends, strict=True)
    ]


# A torch version's local label names the wheel it came from (2.13.0+cpu, 2.13.0+cu130): where the line says
# which torch measured something, a sample holds on either wheel of the same release.
_TORCH_BUILD = re.compile(r"(torch \d+\.\d+\.\d+)\+\w+")


def _same(doc_line: str, printed: str) -> bool:
    return doc_line == printed or _TORCH_BUILD.sub(r"\1", doc_line) == _TORCH_BUILD.sub(r"\1", printed)


def matches(shown: tuple[str, ...], printed: list[str]) -> bool:
    """Whether the doc's lines are the printed ones, each ``...`` line standing for zero or more lines (a torch
    version's wheel label aside)."""
    if not shown:
        return not printed
    head, rest = shown[0], shown[1:]
    if head.strip() == "...":
        return any(matches(rest, printed[i:]) for i in range(len(printed) + 1))
    return bool(printed) and _same(head, printed[0]) and matches(rest, printed[1:])


ALL = [s for doc in DOCS for s in samples(doc)]
REPLAYED = [s for s in ALL if REPLAYABLE.match(s.command)]
LIVE = [s for s in ALL if LIVE_BOOTSTRAP.match(s.command)]


def write_full_samples() -> None:
    """Rewrite every replayable sample shown whole (no ``...``) with what its command prints now."""
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8").splitlines(keepends=True)
        for sample in reversed([s for s in samples(doc) if REPLAYABLE.match(s.command)]):
            if any(line.strip() == "..." for line in sample.lines):
                print(f"{sample}: shortened by hand, not rewritten")
                continue
            words = shlex.split(sample.command)
            env = {**os.environ, "NO_COLOR": "1"}
            out = subprocess.run(
                [sys.executable, "-m", "invoke", *words[words.index("invoke") + 1 :]],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            start = sample.line  # 0-based index of the first line after the $ line
            text[start : start + len(sample.lines)] = [line.rstrip() + "\n" for line in out.splitlines()]
        doc.write_text("".join(text), encoding="utf-8")


def test_the_docs_have_samples_to_check() -> None:
    assert {s.doc.name for s in REPLAYED} >= {"README.md", "checks.md", "plan.md"}, [str(s) for s in ALL]
    assert LIVE, "docs/checks.md's live bootstrap sample is gone"


def test_a_torch_wheel_label_does_not_make_a_sample_stale() -> None:
    line = "  sizes: measured on the meta device (bfloat16, batches 1 and 2, torch 2.13.0+cpu)"
    assert matches((line,), [line.replace("+cpu", "+cu130")])
    assert not matches((line,), [line.replace("2.13.0+cpu", "2.12.0+cpu")])  # another release is another sample


def test_ellipsis_matches_any_run_of_lines_and_nothing_else() -> None:
    assert matches(("a", "  ...", "d"), ["a", "b", "c", "d"]) and matches(("a", "...", "b"), ["a", "b"])
    assert not matches(("a", "...", "d"), ["a", "b", "c"]) and not matches(("a", "b"), ["a", "c"])


@pytest.mark.parametrize(
    "sample",
    # plan --model measures the model in a torch child (about 10 s on the 2-core box)
    [pytest.param(s, marks=[pytest.mark.slow] if " --model " in s.command else []) for s in REPLAYED],
    ids=str,
)
def test_replayable_sample_is_what_the_command_prints(sample: Sample, here: Here, tmp_path: Path) -> None:
    words = shlex.split(sample.command)
    args = words[2:] if words[0] == "NO_COLOR=1" else words[1:]
    run = here(tmp_path, *args)
    printed = [line.rstrip() for line in run.out.splitlines()]
    assert matches(sample.lines, printed), f"{sample} is stale; the command prints now:\n" + "\n".join(printed)


@pytest.mark.parametrize("sample", LIVE, ids=str)
def test_live_bootstrap_sample_shows_every_check_of_the_runner(sample: Sample) -> None:
    from checks.machine.runner import CHECKS

    status = re.compile(r"^  (OK|WARN|FAIL|SKIP|ERROR)\s+([a-z0-9-]+)")
    grouped = re.compile(r"^  SKIP  \d+ skipped .*: ([a-z0-9, -]+)$")  # several skips with one reason
    rows: list[str] = []
    for line in sample.lines:
        if m := grouped.match(line):
            rows += m.group(1).split(", ")
        elif m := status.match(line):
            rows.append(m.group(2))
    shown = {BENCH.get(r, r) for r in rows}
    missing = [c for c, _ in CHECKS if c not in shown]
    assert not missing, f"{sample} lacks the rows of {missing}: run `NO_COLOR=1 invoke bootstrap` and paste"


# --- the commands a user pastes -------------------------------------------------------------------------------------

# A piece of a shell line (split at ``&&``, ``||``, ``;``, ``|``) that runs the tool: ``invoke ...`` after any
# ``VAR=value`` words, or ``invoke`` started by another program (``srun ... invoke``, ``torchrun ... -m invoke``,
# ``exec .venv/bin/invoke``).
RUNS_A_PROGRAM = re.compile(r"^\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:exec\s+)?(?:\S*/)?(?:invoke|srun|torchrun|python3?)\s")
INLINE = re.compile(r"`((?:[A-Z_][A-Z0-9_]*=\S+ )*invoke [^`]*)`")


@dataclass(frozen=True)
class Pasted:
    doc: Path
    line: int
    args: tuple[str, ...]  # the words after ``invoke``, up to ``--`` (the command a task runs is the user's)

    def __str__(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}: invoke {shlex.join(self.args)}"


def shell_lines(doc: Path) -> list[tuple[int, str]]:
    """The lines of the doc's ```sh and untagged blocks, and the ``$ `` lines of its ```text blocks."""
    found: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if fence is None:
            fence = text[3:] if text.startswith("```") else None
        elif text == "```":
            fence = None
        elif fence in ("sh", "") or (fence == "text" and text.startswith("$ ")):
            found.append((number, text.removeprefix("$ ")))
    return found


def after_invoke(words: list[str]) -> tuple[str, ...] | None:
    at = next((i for i, word in enumerate(words) if word.rsplit("/", 1)[-1] == "invoke"), None)
    if at is None:
        return None
    args = words[at + 1 :]
    return tuple(args[: args.index("--")] if "--" in args else args)


def pasted(doc: Path) -> list[Pasted]:
    """Every ``invoke`` command line of the doc's shell blocks."""
    found: list[Pasted] = []
    for number, line in shell_lines(doc):
        for piece in re.split(r"&&|\|\||;|\|", line):
            if RUNS_A_PROGRAM.match(piece + " ") and (args := after_invoke(shlex.split(piece, comments=True))):
                found.append(Pasted(doc, number, args))
    return found


PASTED = [p for doc in DOCS for p in pasted(doc)]


def parse(args: tuple[str, ...]) -> list[str]:
    """Parse ``invoke ARGS`` as the tool's program does, up to running anything; return the tasks it would run."""
    import tasks
    from checks.cli.program import PreflightProgram

    program = PreflightProgram(namespace=tasks.ns, name="invoke", binary="invoke")
    keep = sys.dont_write_bytecode  # Invoke's parse_core sets it from --write-pyc, for this whole process
    try:
        program.create_config()
        program.parse_core(["invoke", *args])
        program.parse_collection()
        program.parse_tasks()
    finally:
        sys.dont_write_bytecode = keep
    return [str(context.name) for context in program.tasks]


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A HOME without a ``~/.invoke.yaml``: the parse reads the checkout's configuration only."""
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.mark.usefixtures("own_home")
def test_the_docs_shell_blocks_run_the_tool() -> None:
    tasks = {name for p in PASTED for name in parse(p.args)}
    assert len(PASTED) >= 30 and tasks >= {"bootstrap", "snapshot", "plan", "sbatch", "stage-data", "verify"}, tasks


@pytest.mark.usefixtures("own_home")
@pytest.mark.parametrize("command", PASTED, ids=str)
def test_a_pasted_command_names_a_task_and_only_its_flags(command: Pasted) -> None:
    """Parsed by the tool's own program: an unknown task or flag, a missing value or one of the wrong type fails."""
    assert parse(command.args), f"{command} runs no task"


def inline_mistakes(text: str) -> list[str]:
    """``invoke TASK --flag`` in the prose (placeholders allowed: ``invoke diff A B``) whose task or ``--flag`` does
    not exist, as ``LINE: `SPAN`: what``."""
    import tasks

    contexts = {c.name: c for c in tasks.ns.to_contexts()}
    wrong: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        for span in INLINE.findall(line):
            words = span.split()
            words = words[words.index("invoke") + 1 :]
            words = words[: words.index("--")] if "--" in words else words
            while words and words[0] in ("-f", "--config", "-r", "--search-root", "-h", "--help", "-l", "--list"):
                words = words[1:] if words[0] in ("-l", "--list") else words[2:]  # Invoke's flag and its value
            if not words or words[0].isupper() or words[0] == "...":
                continue  # a placeholder: `invoke -f FILE TASK`, `invoke --help TASK`
            context = contexts.get(words[0])
            flags = set(context.flags) | set(context.inverse_flags) if context else set()
            bad = [w for w in words[1:] if w.startswith("--") and w.split("=", 1)[0] not in flags]
            if context is None or bad:
                wrong.append(f"{number}: `{span}`: {bad or 'no such task'}")
    return wrong


def test_inline_commands_name_tasks_and_their_flags() -> None:
    """A renamed or misspelt flag cannot stay in the prose either."""
    wrong = [f"{doc.relative_to(REPO)}:{m}" for doc in DOCS for m in inline_mistakes(doc.read_text(encoding="utf-8"))]
    assert not wrong, "\n".join(wrong)


@pytest.mark.usefixtures("own_home")
def test_a_misspelt_flag_or_task_is_caught() -> None:
    from checks.errors import PreflightError

    with pytest.raises(PreflightError, match="--jsn"):
        parse(("bootstrap", "--jsn", "r.json"))
    planted = (
        "`invoke bootstrap --jsn r.json`, `invoke diff A B --json d.json`, `invoke -f FILE TASK`, `invoke bootsrap`"
    )
    assert [m.split(": ", 2)[2] for m in inline_mistakes(planted)] == ["['--jsn']", "no such task"]


# --- formats.md: the JSON report and the fixtures --------------------------------------------------------------------

FORMATS = REPO / "docs" / "formats.md"


def test_the_json_report_example_is_what_its_replay_writes(here: Here, tmp_path: Path) -> None:
    """formats.md's shortened JSON report: the top-level fields, each result shown (its timing aside) and each
    measurement shown are those of the replay it names, which has as many results as it says."""
    text = FORMATS.read_text(encoding="utf-8")
    said = re.search(r"\(replay of `(tests/fixtures/machines/\S+\.json)`, (\d+) results in full\)", text)
    assert said, "formats.md no longer names the replay its JSON example comes from"
    shown = json.loads(text.split("```json\n", 1)[1].split("```", 1)[0])
    run = here(tmp_path, "bootstrap", "--machine", said.group(1), "--json", "-")
    report = run.report()
    assert len(report["results"]) == int(said.group(2))
    assert {k: v for k, v in shown.items() if k not in ("results", "measurements")} == {
        k: report[k] for k in shown if k not in ("results", "measurements")
    }
    actual = {(r["id"], r["subject"]): r for r in report["results"]}
    for result in shown["results"]:
        assert {**actual[result["id"], result["subject"]], "duration_s": result["duration_s"]} == result
    for key, value in shown["measurements"].items():
        assert report["measurements"][key] == value, key


def test_the_fixture_table_lists_every_fixture() -> None:
    table = set(re.findall(r"^\| `([\w.-]+\.json)` \|", FORMATS.read_text(encoding="utf-8"), re.M))
    files = {p.name for p in (REPO / "tests" / "fixtures" / "machines").glob("*.json")}
    assert table == files, (
        f"formats.md lists {sorted(table - files)} that do not exist and lacks {sorted(files - table)}"
    )


if __name__ == "__main__":  # python -m tests.test_doc_samples: refresh the samples shown whole
    write_full_samples()


VERIFY_SAMPLE = re.compile(r"^(NO_COLOR=1 )?invoke verify --json \S+$")


@pytest.mark.slow
def test_the_verify_sample_has_verifys_rows_and_its_data_row_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/verify.md's live sample (times vary, so not replayed): its rows are the rows a short ``invoke verify``
    run on this box writes, in its order (bootstrap's gate rows apart: they depend on the box), and its data row,
    which does not depend on timing, names the data, the DataLoader settings and the note verify gives the default
    synthetic data."""
    from tests.fakes.builtin import builtin, config

    (sample,) = [s for s in ALL if VERIFY_SAMPLE.match(s.command)]
    ids = [m.group(2) for line in sample.lines if (m := re.match(r"^  (OK|WARN|FAIL|SKIP)\s+(\S+)", line))]
    judged, _, _ = builtin(tmp_path, monkeypatch, config(steps=2, warmup=1, image_size=64))
    ran = [r.id for r in judged.report.results if r.id not in judged.background]
    assert [i for i in ids if i in ran or i.startswith("verify-")] == ran, (ids, ran)
    row = next(line for line in sample.lines if " verify-data " in line).split("verify-data", 1)[1].strip()
    assert row == next(r.summary for r in judged.report.results if r.id == "verify-data"), row
