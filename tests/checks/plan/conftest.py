"""plan's tests run the task in this process from this folder, so that ``--model plan_models:...`` imports the
models here as a user's own module would be imported."""

from __future__ import annotations

import pytest

from tests.fakes.cli import Here, in_process
from tests.fakes.plan import MODELS


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Here:
    monkeypatch.chdir(MODELS)
    return in_process(monkeypatch, capsys)
