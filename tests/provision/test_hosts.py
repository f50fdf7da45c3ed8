"""Host lists: --hosts, hosts files (DeepSpeed style), SLURM node lists, and strings a shell must never see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from checks.errors import ExitStatus, PreflightError
from provision.hosts import HostSpec, expand_nodelist, parse_host, parse_host_list, read_hosts_file, select_hosts
from tests.fakes.cli import assert_usage_error, invoke

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("gpu1", HostSpec("gpu1", "gpu1")),
        ("root@10.0.0.5", HostSpec("root@10.0.0.5", "10.0.0.5", user="root")),
        (
            "ubuntu@gpu-2.example.org:2222",
            HostSpec("ubuntu@gpu-2.example.org:2222", "gpu-2.example.org", "ubuntu", 2222),
        ),
        ("[fe80::1]:22", HostSpec("[fe80::1]:22", "fe80::1", port=22)),
        ("me@[2001:db8::7]", HostSpec("me@[2001:db8::7]", "2001:db8::7", user="me")),
        ("node_7", HostSpec("node_7", "node_7")),
    ],
)
def test_host_strings_parse(text: str, spec: HostSpec) -> None:
    assert parse_host(text) == spec


@pytest.mark.parametrize(
    "text",
    [
        "h1;touch /tmp/x",
        "$(touch x)",
        "`id`",
        "h1 h2",
        "h1|nc",
        "h1&",
        "'h1'",
        '"h1"',
        "h1\nh2",
        "-oProxyCommand=sh",
        "user name@h1",
        "h1:99999",
        "h1:port",
        "[not-v6]",
        "",
        "a@b@c;",
    ],
)
def test_dangerous_or_malformed_host_strings_are_refused(text: str) -> None:
    with pytest.raises(PreflightError) as info:
        parse_host(text)
    assert info.value.code == ExitStatus.USAGE
    assert "bad host" in str(info.value)


def test_host_list_allows_spaces_around_commas_and_rejects_duplicates() -> None:
    assert [s.host for s in parse_host_list("h1, h2 ,h3")] == ["h1", "h2", "h3"]
    with pytest.raises(PreflightError, match="listed twice"):
        parse_host_list("h1,h1")
    with pytest.raises(PreflightError, match="empty"):
        parse_host_list(" , ")


def test_hosts_file_reads_deepspeed_slots_and_our_fields(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text(
        "# the training hosts\n\ngpu1 slots=8\nroot@10.1.0.2:2222 slots=4 python=/opt/conda/bin/python addr=10.2.0.2\n"
        "gpu3   # no slots\n"
    )
    specs = read_hosts_file(path)
    assert [s.name for s in specs] == ["gpu1", "root@10.1.0.2:2222", "gpu3"]
    assert specs[0].slots == 8
    assert (specs[1].user, specs[1].port, specs[1].python, specs[1].addr) == (
        "root",
        2222,
        "/opt/conda/bin/python",
        "10.2.0.2",
    )
    assert specs[2].slots is None


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("gpu1 slots=eight", "slots must be a number"),
        ("gpu1 gpus=8", "unknown field"),
        ("gpu1 python=$(id)", "not allowed"),
        ("gpu1;id", "bad host"),
    ],
)
def test_bad_hosts_file_lines_name_file_and_line(tmp_path: Path, line: str, needle: str) -> None:
    path = tmp_path / "hostfile"
    path.write_text(f"ok-host\n{line}\n")
    with pytest.raises(PreflightError, match=needle) as info:
        read_hosts_file(path)
    assert f"{path}:2" in str(info.value)


def test_missing_or_empty_hosts_file(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match="does not exist"):
        read_hosts_file(tmp_path / "nope")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(PreflightError, match="names no host"):
        read_hosts_file(tmp_path / "empty")


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[1-2],b3,c[08-10]", ["a1", "a2", "b3", "c08", "c09", "c10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ],
)
def test_slurm_nodelists_expand(nodelist: str, names: list[str]) -> None:
    assert expand_nodelist(nodelist) == names


@pytest.mark.parametrize("nodelist", ["gpu[01-03", "gpu]1[", "gpu[a-b]", "gpu[[1]]"])
def test_malformed_slurm_nodelists_are_usage_errors(nodelist: str) -> None:
    with pytest.raises(PreflightError, match="SLURM_JOB_NODELIST"):
        expand_nodelist(nodelist)


def test_select_hosts_precedence(tmp_path: Path) -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-2]"}
    assert select_hosts("h1", "", env, True)[1] == "--hosts"
    assert [s.name for s in select_hosts("", "", env, True)[0]] == ["n1", "n2"]
    assert select_hosts("", "", env, False) == ([], "")  # hosts.slurm: false
    assert select_hosts("", "", {"SLURM_JOB_NODELIST": "n1"}, True) == ([], "")  # one node: this machine only
    (tmp_path / "f").write_text("x1\n")
    assert select_hosts("", str(tmp_path / "f"), env, True)[1].startswith("--hosts-file")
    with pytest.raises(PreflightError, match="not both"):
        select_hosts("h1", str(tmp_path / "f"), env, True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "hosts", ["h1;touch {marker}", "$(touch {marker})", "h1,`touch {marker}`", "h1 && touch {marker}"]
)
def test_cli_refuses_shell_metacharacters_before_any_connection(tmp_path: Path, hosts: str) -> None:
    marker = tmp_path / "pwned"
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "bootstrap", "--hosts", hosts.format(marker=marker)],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("gpu-preflight: bad host") and "Traceback" not in proc.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_cli_refuses_machine_with_hosts(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "bootstrap", "--hosts", "h1", "--machine", "x.json"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "cannot be combined" in proc.stderr


# --- passwords: refused, never printed ----------------------------------------------------------------------

SECRET = "s3cr:et@pw"  # a password may hold ':' and '@' too


@pytest.mark.parametrize(
    "text", [f"bob:{SECRET}@gpu1", f"bob:{SECRET}@gpu1:2222", f"ssh://bob:{SECRET}@gpu1", "bob:@gpu1"]
)
def test_a_password_in_a_host_string_is_refused_without_echoing_it(text: str) -> None:
    with pytest.raises(PreflightError) as info:
        parse_host_list(f"gpu0,{text}")
    message = str(info.value)
    assert info.value.code == ExitStatus.USAGE and "passwords are not supported" in message
    assert "SSH key" in message and "ssh-agent" in message and "~/.ssh/config" in message
    assert "s3cr" not in message and "et@pw" not in message


def test_a_password_in_a_hosts_file_is_refused_without_echoing_it(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text(f"gpu0 slots=2\nbob:{SECRET}@gpu1 slots=2\ngpu2 password={SECRET}\n")
    with pytest.raises(PreflightError, match="passwords are not supported") as info:
        read_hosts_file(path)
    assert f"{path}:2" in str(info.value) and "s3cr" not in str(info.value)
    path.write_text(f"gpu2 password={SECRET}\n")  # a field of its own
    with pytest.raises(PreflightError, match="passwords are not supported") as info:
        read_hosts_file(path)
    assert f"{path}:1" in str(info.value) and "s3cr" not in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ("bootstrap", "--hosts", f"bob:{SECRET}@gpu1"),
        ("verify", "--hosts", f"gpu0,bob:{SECRET}@gpu1"),
        ("bootstrap", "--hosts-file", "HOSTFILE"),
        ("verify", "--hosts-file", "HOSTFILE"),
        ("bootstrap", f"bob:{SECRET}@gpu1"),  # --hosts forgotten: the positional-word hint
        (f"bob:{SECRET}@gpu1",),  # not a task
    ],
    ids=["bootstrap", "verify", "bootstrap-file", "verify-file", "no-flag", "no-task"],
)
def test_the_cli_refuses_a_password_in_one_line_that_never_holds_it(tmp_path: Path, argv: tuple[str, ...]) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"gpu0\nbob:{SECRET}@gpu1\n")
    run = invoke(tmp_path, *(str(hostfile) if word == "HOSTFILE" else word for word in argv), timeout=60)
    line = assert_usage_error(run)
    assert "s3cr" not in run.out + run.err and "et@pw" not in run.out + run.err, run.why()
    assert "passwords are not supported" in line, line
