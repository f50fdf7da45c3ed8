"""The Invoke hooks of checks/cli/program.py, in-process: a PreflightProgram over a small collection, argv as a list.

The real CLI (``python -m invoke`` from the checkout) is tested end to end in tests/test_tasks.py; here each
mistake is one fast run of the program, and the pieces (usage_error, check_env_overrides) are unit tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import invoke
import invoke.main
import pytest
from invoke import Collection, Context, Program, task
from invoke.exceptions import ParseError

from checks import TOOL_VERSION
from checks.cli import flags
from checks.cli.flags import flag
from checks.cli.program import (
    CheckedConfig,
    PreflightProgram,
    env_names,
    lookalikes,
    take_over,
    usage_error,
    with_placeholder,
)
from checks.config import load_defaults
from checks.errors import PreflightError

seen: list[dict[str, Any]] = []


@task
def train(c: Context, steps: int = 0, price: float = 0.0, json: str = "", quick: bool = False) -> None:
    """Record the flags and the merged configuration value the tests look at."""
    seen.append({"steps": steps, "price": price, "json": json, "nofile_min": c.config.preflight.host.nofile_min})


@task
def boom(c: Context) -> None:
    """Fail as the library does: a plain exception with its exit code."""
    raise PreflightError("disk full", hint="free some space", code=1)


@dataclass(frozen=True)
class LaunchFlags:
    steps: int = flag(0, "steps")
    command: tuple[str, ...] = flags.command()


@flags.task()
def launch(c: Context, f: LaunchFlags) -> None:
    """Take a command after --, as verify does."""
    seen.append({"steps": f.steps, "command": f.command})


def run(argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> tuple[int, str, str]:
    """Run the program over a collection like tasks.py's; return (exit code, stdout, stderr)."""
    seen.clear()
    ns = Collection(train, boom, launch)
    ns.configure({"preflight": load_defaults()})
    program = PreflightProgram(namespace=ns, name="invoke", binary="invoke")
    # keep the user's own ~/.invoke.yaml and /etc/invoke.yaml out of the test
    program.config_class = lambda **kw: CheckedConfig(system_prefix=f"{tmp_path}/etc-", user_prefix=f"{tmp_path}/u-", **kw)  # type: ignore[assignment]  # fmt: skip
    try:
        program.run(["invoke", *argv])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _no_inherited_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in __import__("os").environ if n.startswith(("INVOKE_PREFLIGHT_", "INVOKE_RUNTIME_CONFIG"))]:
        monkeypatch.delenv(name)


def one_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-preflight: "), err
    return lines[0]


# --- task flags ---------------------------------------------------------------------------------------------


def test_valid_flags_run_the_task(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(["train", "--steps", "3", "--price=1.5"], capsys, tmp_path)[0] == 0
    expected = {"steps": 3, "price": 1.5, "json": "", "nofile_min": load_defaults()["host"]["nofile_min"]}
    assert seen == [expected]


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["train", "--step", "3"], ("train has no flag --step", "did you mean --steps?", "invoke --help train")),
        (["train", "--bogus"], ("train has no flag --bogus", "invoke --help train")),
        (["trian"], ("no task named 'trian'", "did you mean train?", "invoke --list")),
        (["train", "--steps", "abc"], ("train --steps takes an integer, not 'abc'",)),
        (["train", "--price", "cheap"], ("train --price takes a number, not 'cheap'",)),
        (["train", "--json"], ("train --json needs a value",)),
        (["train", "--quick=yes"], ("unexpected argument 'yes' after train", "on/off flags take no value")),
        (["train", "--steps", "abc", "--bogus"], ("train has no flag --bogus",)),
    ],
    ids=["typo", "unknown", "task-typo", "int", "float", "missing-value", "value-for-switch", "int-then-unknown"],
)
def test_flag_mistakes_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], needles: tuple[str, ...]
) -> None:
    code, out, err = run(argv, capsys, tmp_path)
    line = one_line(code, err)
    for needle in needles:
        assert needle in line, line
    assert seen == [] and out == ""
    assert ("did you mean" in line) == any("did you mean" in n for n in needles)


def test_the_words_after_two_dashes_reach_the_task_one_argument_each(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["python", "-c", "print('a b')", "--lr", "3e-4", "--", "x"]  # flags and a second -- are the command's own
    assert run(["launch", "--steps", "2", "--", *argv], capsys, tmp_path)[0] == 0
    assert seen == [{"steps": 2, "command": tuple(argv)}]
    assert run(["launch"], capsys, tmp_path)[0] == 0
    assert seen == [{"steps": 0, "command": ()}]


@pytest.mark.parametrize("argv", [["train", "--", "python", "x.py"], ["launch", "train", "--", "ls"]])
def test_a_task_without_a_command_refuses_the_words_after_two_dashes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    line = one_line(*run(argv, capsys, tmp_path)[::2])
    assert "train takes no command after --" in line and "invoke --help train" in line
    assert seen == []


@pytest.mark.parametrize("core", [["-r", "CHECKOUT"], ["--search-root=CHECKOUT"], ["-c", "tasks"], ["--no-dedupe"]])
def test_the_flags_that_found_tasks_py_are_accepted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, core: list[str]
) -> None:
    """Invoke's own program used them to find tasks.py (README: invoke -r PATH_TO_CHECKOUT verify ...)."""
    argv = [word.replace("CHECKOUT", str(tmp_path)) for word in core]
    code, _, err = run([*argv, "train", "--steps", "4"], capsys, tmp_path)
    assert code == 0 and err == "" and seen[0]["steps"] == 4, err


def test_usage_error_leaves_other_exceptions_alone() -> None:
    assert usage_error(ValueError("from a broken task definition"), ()) is None
    assert usage_error(KeyError("x"), ()) is None
    assert isinstance(usage_error(ParseError("something else!"), ()), PreflightError)


# --- configuration files ------------------------------------------------------------------------------------


def test_a_missing_runtime_file_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "invoke.yml"
    assert f"{missing} does not exist" in one_line(*run(["-f", str(missing), "train"], capsys, tmp_path)[::2])
    monkeypatch.setenv("INVOKE_RUNTIME_CONFIG", str(missing))
    assert "INVOKE_RUNTIME_CONFIG" in one_line(*run(["train"], capsys, tmp_path)[::2])
    assert seen == []


def test_a_runtime_file_invoke_cannot_parse_by_its_name_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Invoke picks its parser by the suffix and raises UnknownFileType (a traceback) for any other: a process
    # substitution (-f <(...)) or a notes.txt is refused in one line, with the name to give it.
    text = tmp_path / "settings.txt"
    text.write_text("preflight: {}\n")
    line = one_line(*run(["-f", str(text), "train"], capsys, tmp_path)[::2])
    assert f"{text} has no .yaml, .yml or .json suffix" in line and "as in settings.yaml" in line, line
    assert seen == []


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("preflight: {gpu: 0.8}", "preflight.gpu must be a section"),
        ("preflight: {hostt: {nofile_min: 1}}", "did you mean preflight.host?"),
        ("preflight: {gpu: [\n", "is not valid YAML/JSON"),
        ("preflight:\n  gpu: 1\n   x: 2\n", "line 3, column 5: mapping values are not allowed here"),
        ("prefligth: {host: {nofile_min: 1}}", "unknown top-level key 'prefligth' in"),
        ("run: {echo: true}\nmine: 1", "unknown top-level key 'mine'"),
    ],
    ids=["scalar-for-section", "typo", "yaml-syntax", "yaml-line-column", "top-level-typo", "top-level-unknown"],
)
def test_a_bad_runtime_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    assert needle in one_line(*run(["train", "-f", str(config)], capsys, tmp_path)[::2])  # -f after the task too


def test_a_good_runtime_file_takes_effect(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "good.yaml"
    config.write_text("preflight: {host: {nofile_min: 7}}\n")
    assert run(["-f", str(config), "train"], capsys, tmp_path)[0] == 0
    assert seen[0]["nofile_min"] == 7


def test_a_misspelled_top_level_key_names_the_key_it_meant(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "invoke.yaml"
    config.write_text("prefligth:\n  host: {nofile_min: 7}\n")  # Invoke alone runs on the defaults
    line = one_line(*run(["-f", str(config), "train"], capsys, tmp_path)[::2])
    assert line.endswith("(did you mean preflight?)") and seen == []


def test_the_user_file_may_hold_other_projects_keys_but_no_misspelling(tmp_path: Path) -> None:
    user, project = tmp_path / "u-invoke.yaml", tmp_path / "project" / "invoke.yaml"
    project.parent.mkdir()
    project.write_text("preflight: {host: {nofile_min: 7}}\n")
    user.write_text("run: {echo: false}\ndeploy: {region: eu}\n")  # another Invoke project's own section
    config = CheckedConfig(system_prefix=f"{tmp_path}/etc-", user_prefix=f"{tmp_path}/u-")
    config.set_project_location(str(project.parent))
    config.load_project()
    assert config.preflight.host.nofile_min == 7 and config.deploy.region == "eu"
    user.write_text("prefilght: {host: {nofile_min: 7}}\n")
    with pytest.raises(PreflightError, match=r"unknown top-level key 'prefilght' .*did you mean preflight\?"):
        config.load_project()
    project.write_text("deploy: {region: eu}\n")  # the checkout's own file serves gpu-preflight alone
    user.unlink()
    with pytest.raises(PreflightError, match=r"unknown top-level key 'deploy'"):
        config.load_project()


def test_the_user_file_is_validated_before_the_project_file_loads(tmp_path: Path) -> None:
    (tmp_path / "u-invoke.yaml").write_text("preflight: {hostt: {}}\n")
    config = CheckedConfig(system_prefix=f"{tmp_path}/etc-", user_prefix=f"{tmp_path}/u-")
    config.set_project_location(str(tmp_path / "project"))
    with pytest.raises(PreflightError, match=r"u-invoke\.yaml"):
        config.load_project()


# --- INVOKE_PREFLIGHT_* variables ---------------------------------------------------------------------------


def test_env_names_follow_invokes_underscore_scheme() -> None:
    names = env_names(load_defaults())
    assert names["INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTION"][0] == ("gpu", "power_min_fraction")
    assert "INVOKE_PREFLIGHT_HOST_NOFILE_MIN" in names


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTION", "abc", "a number"),
        ("INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTON", "0.5", "did you mean INVOKE_PREFLIGHT_GPU_POWER_MIN_FRACTION?"),
        ("INVOKE_PREFLIGHT_BENCH_ENABLED", "false", "use 1 or 0"),
        ("INVOKE_PREFLIGHT_HOST_NOFILE_MIN", "1e6", "an integer"),
        ("INVOKE_PREFLIGHT_ALLOC_CONF_RC_FILES", "~/.zshrc", "-f FILE"),
    ],
    ids=["not-a-number", "typo-name", "bool-word", "float-for-int", "list"],
)
def test_bad_variables_stop_the_run_before_invoke_casts_them(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    value: str,
    needle: str,
) -> None:
    monkeypatch.setenv(name, value)
    assert needle in one_line(*run(["train"], capsys, tmp_path)[::2])
    assert seen == []


def test_good_variables_are_cast_and_take_effect(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INVOKE_PREFLIGHT_HOST_NOFILE_MIN", "9")
    monkeypatch.setenv("INVOKE_PREFLIGHT_PROBE_TORCH_TIMEOUT_S", "2.5")  # an int is fine for a float key
    monkeypatch.setenv("INVOKE_PREFLIGHT_BENCH_ENABLED", "0")
    assert run(["train"], capsys, tmp_path)[0] == 0
    assert seen[0]["nofile_min"] == 9


def test_listing_the_tasks_needs_no_valid_variables(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INVOKE_PREFLIGHT_BENCH_ENABLED", "false")
    code, out, _ = run(["--list"], capsys, tmp_path)
    assert code == 0 and "train" in out


# --- Invoke's own program hands over ----------------------------------------------------------------------


def test_take_over_runs_the_command_line_of_invokes_program_loading_tasks_py(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stock = Program(name="Invoke", binary="inv[oke]", binary_names=["invoke", "inv"])
    monkeypatch.setattr(invoke.main, "program", stock)
    monkeypatch.setenv("HOME", str(tmp_path))  # the user's own ~/.invoke.yaml stays out
    ns = Collection(train)
    ns.configure({"preflight": load_defaults()})
    seen.clear()
    take_over(ns)  # imported, not loaded by Invoke's program: nothing runs
    assert seen == []
    stock.argv = ["invoke", "train", "--steps", "3"]  # what Program.run sets before it loads tasks.py
    with pytest.raises(SystemExit) as done:
        take_over(ns)
    assert done.value.code == 0 and seen[0]["steps"] == 3
    stock.argv = ["invoke", "train", "--step", "3"]
    with pytest.raises(SystemExit) as refused:
        take_over(ns)
    assert refused.value.code == 2 and "train has no flag --step" in capsys.readouterr().err
    stock.collection = ns  # Invoke's program has loaded its collection: this is no longer its load
    seen.clear()
    take_over(ns)
    assert seen == []


def test_the_program_that_takes_over_prints_gpu_preflights_version(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was built with the version of Invoke's own program; Invoke answers a plain ``invoke --version`` itself."""
    stock = Program(name="Invoke", binary="inv[oke]", binary_names=["invoke", "inv"], version=invoke.__version__)
    monkeypatch.setattr(invoke.main, "program", stock)
    monkeypatch.setenv("HOME", str(tmp_path))
    stock.argv = ["invoke", "--version"]
    with pytest.raises(SystemExit):
        take_over(Collection(train))
    assert capsys.readouterr().out == f"gpu-preflight {TOOL_VERSION} (Invoke {invoke.__version__})\n"


def test_a_plain_exception_of_the_library_is_its_line_and_its_code(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert run(["boom"], capsys, tmp_path)[::2] == (1, "gpu-preflight: disk full (free some space)\n")


# --- -h after a task ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetFlags:
    hosts: str = flag("", "the hosts")
    json: str = flag("", "a path")


@flags.task()
def fleet(c: Context, f: FleetFlags) -> None:
    """Take a flag whose name starts with h, as bootstrap's --hosts does."""
    seen.append({"hosts": f.hosts})


def test_h_after_a_task_shows_its_help_even_when_a_flag_starts_with_h(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ns = Collection(fleet)
    for _ in range(2):  # a second program over the same task still has the help texts
        program = PreflightProgram(namespace=ns, name="invoke", binary="invoke")
        program.config_class = lambda **kw: CheckedConfig(system_prefix=f"{tmp_path}/etc-", user_prefix=f"{tmp_path}/u-", **kw)  # type: ignore[assignment]  # fmt: skip
        seen.clear()
        with pytest.raises(SystemExit) as exc:
            program.run(["invoke", "fleet", "-h"])
        out, err = capsys.readouterr()
        assert exc.value.code in (0, None) and err == "" and seen == []
        assert "Usage: invoke [--core-opts] fleet" in out
        assert "--hosts=STRING" in out and "the hosts" in out and "-h STRING" not in out


@task(positional=["a", "b"])
def compare(c: Context, a: str, b: str) -> None:
    """Take two positional arguments, as the diff task does."""
    seen.append({"a": a, "b": b})


@pytest.mark.parametrize("argv", [["compare", "-h"], ["compare", "x", "--help"], ["compare", "x", "y", "-h"]])
def test_h_after_a_task_with_positional_arguments_is_not_taken_as_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    program = PreflightProgram(namespace=Collection(compare), name="invoke", binary="invoke")
    program.config_class = lambda **kw: CheckedConfig(system_prefix=f"{tmp_path}/etc-", user_prefix=f"{tmp_path}/u-", **kw)  # type: ignore[assignment]  # fmt: skip
    seen.clear()
    with pytest.raises(SystemExit) as exc:
        program.run(["invoke", *argv])
    out, err = capsys.readouterr()
    assert exc.value.code in (0, None) and err == "" and seen == []
    assert "Usage: invoke [--core-opts] compare" in out


def test_a_flag_that_takes_a_fraction_shows_its_placeholder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(["--help", "train"], capsys, tmp_path)
    assert code == 0 and err == ""
    names = [line.strip().split("  ")[0] for line in out.splitlines() if "--price" in line or "--steps" in line]
    assert names == ["-p NUM, --price=NUM", "-s INT, --steps=INT"]  # Invoke itself writes only INT and STRING
    assert with_placeholder("-q, --quick", {"--price"}) == "-q, --quick"


def test_a_configuration_file_that_is_not_read_is_named_with_what_is(tmp_path: Path) -> None:
    project, here = tmp_path / "checkout", tmp_path / "mine"
    project.mkdir()
    here.mkdir()
    (here / "invoke.yml").write_text("preflight: {}\n")  # the user's project while tasks.py is found with -r
    (here / "preflight.yaml").write_text("verify: {}\n")  # a name Invoke never reads
    read = project / "invoke.yaml"
    read.write_text("preflight: {}\n")
    lines = lookalikes([read], str(project), here)
    assert [line.split(" is not read")[0] for line in lines] == [
        f"gpu-preflight: warning: {here / 'invoke.yml'}",
        f"gpu-preflight: warning: {here / 'preflight.yaml'}",
    ]
    assert all(f"configuration files read: {read} (" in line for line in lines)
    assert lookalikes([read], str(project), project) == []  # the project's own file is read: no warning
    none = lookalikes([], None, here)[0]
    assert "read: none (the defaults and INVOKE_PREFLIGHT_* variables apply)" in none
