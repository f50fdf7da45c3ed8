"""The agent's lines and their records (``checks/verify/events.py``): every kind the agent writes has one, every
field of a real run's lines is named by it, and a line that is not one is kept out, never raised on."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from checks.typedjson import ContractError
from checks.verify import events
from checks.verify.events import KINDS, Event, StepLine, parse, parse_line
from checks.verify.user.launch import INJECT, StopRule, run_command

SCRIPTS = Path(__file__).resolve().parent / "user" / "scripts"


def test_every_kind_the_agent_writes_has_a_record() -> None:
    """The agent's source, read: each ``_say("kind", ...)`` names a record's kind, and each record is written."""
    source = (INJECT / "_gpu_preflight_agent.py").read_text(encoding="utf-8")
    said = set(re.findall(r'_say\(\s*"([a-z-]+)"', source))
    assert said == set(KINDS), (said - set(KINDS), set(KINDS) - said)


def test_a_record_writes_the_line_it_was_read_from() -> None:
    """``to_json`` writes the agent's line back (a node's run crosses to the controller so), ``host`` only when
    tagged."""
    line = {"event": "step", "t": 3.0, "pid": 7, "i": 2, "data_wait": 0.1, "h2d": 0.0, "forward": 0.2}
    line |= {"backward": 0.3, "optimizer": 0.05, "host_start": 1.0, "host_end": 1.7, "enqueue_s": 0.6}
    line |= {"fetch": [[1.0, 1.1]], "loss": 2.5, "rank": 1, "world_size": 2}
    step = parse(line, strict=True)
    assert isinstance(step, StepLine) and step.fetch == ((1.0, 1.1),) and step.key == 1 and not step.lead
    assert parse(step.to_json(), strict=True) == step and "host" not in step.to_json()
    tagged = dataclasses.replace(step, host="b")
    assert parse(json.loads(json.dumps(tagged.to_json())), strict=True) == tagged


def test_a_line_no_record_reads_is_kept_out_or_in_the_tests_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify drops an unknown kind, a broken line or a mistyped field and keeps an unknown field out of the
    record; the tests' strict parse raises on each, naming it."""
    hello = {"event": "hello", "t": 1.0, "pid": 3}
    monkeypatch.setattr(events, "STRICT", False)
    assert parse_line("not json") is None and parse_line('{"event": "later", "t": 1, "pid": 1}') is None
    assert parse({"event": "torch", "t": 1.0, "pid": "three", "version": "2.8"}) is None  # mistyped
    assert parse(hello | {"new": 1}) == parse(hello)  # an unknown field: the rest is read
    monkeypatch.setattr(events, "STRICT", True)
    with pytest.raises(ContractError, match="'new'"):
        parse(hello | {"new": 1})
    with pytest.raises(ContractError, match="unknown kind: 'later'"):
        parse_line('{"event": "later", "t": 1, "pid": 1}')


@pytest.mark.slow
def test_every_line_of_a_real_run_is_its_record_field_by_field(tmp_path: Path) -> None:
    """A real command under the agent (``data_bound.py``: hello, torch, loader, device, steps, the FLOP count):
    each line parsed strictly (the tests' setting), none dropped."""
    assert events.STRICT  # tests/conftest.py
    run = run_command([sys.executable, "data_bound.py"], StopRule(2, 3, first_step_s=120), str(SCRIPTS), None,
                      subprocess.DEVNULL)  # fmt: skip
    kinds = {type(e).KIND for e in run.events}
    assert {"hello", "torch", "loader", "device", "step", "flops"} <= kinds, kinds
    assert run.dropped == 0 and all(isinstance(e, Event) for e in run.events)
