"""rsync's failures as the user reads them: ssh's own line (not rsync's "unexplained error"), a hint naming the
host, no retries of a host that never answered. ``.invalid`` never resolves (RFC 2606): no network is needed."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from datasets import transfer
from datasets.errors import StageFailure
from datasets.sources import Fetch
from datasets.stage import stage
from tests.datasets import jobs

UNRESOLVABLE = "ssh -o BatchMode=yes -o ConnectTimeout=5"


def test_unresolvable_host_says_what_ssh_said_naming_the_host(tmp_path: Path) -> None:
    """rsync's own last line was "unexplained error (code 255)"; ssh's "Could not resolve hostname" was lost."""
    fetch = Fetch(ssh_command=UNRESOLVABLE, retries=0, http_timeout_s=5.0)
    with pytest.raises(StageFailure) as caught:
        stage(jobs.request("nohost.invalid:/data/train", tmp_path / "ds", fetch=fetch))
    error = caught.value
    assert "ssh: Could not resolve hostname nohost.invalid" in error.message, error.message
    assert "unexplained error" not in error.message and "\n" not in error.message
    assert "nohost.invalid" in (error.hint or "") and "ssh nohost.invalid true" in (error.hint or ""), error.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made before the source was reached


@pytest.mark.parametrize("attempt", range(8))  # rsync exits 255 or, racing ssh's exit, 12: both must read the same
def test_rsync_copy_from_an_unresolvable_host_says_what_ssh_said_at_once(tmp_path: Path, attempt: int) -> None:
    started = time.monotonic()
    with pytest.raises(StageFailure) as caught:
        transfer.rsync(
            "nohost.invalid:/data", tmp_path / "dst", remote=True, ssh_command=UNRESOLVABLE, retries=3, progress=print
        )
    message, hint = caught.value.message, caught.value.hint or ""
    assert re.search(r"rsync from nohost\.invalid:/data failed \(exit (255|12)\): ssh: Could not resolve", message)
    assert hint == "check the host name nohost.invalid in --source or ~/.ssh/config; try: ssh nohost.invalid true"
    assert time.monotonic() - started < 5, "retried a host that does not resolve (back-off of 1 + 2 + 4 s)"


def test_rsync_reason_is_its_own_line_not_the_generic_trailer() -> None:
    stderr = (
        b'rsync: [sender] change_dir "/data/nope" failed: No such file or directory (2)\n'
        b"rsync error: some files/attrs were not transferred (see previous errors) (code 23) at main.c(1338)\n"
    )
    assert (
        transfer.stderr_reason(stderr)
        == 'rsync: [sender] change_dir "/data/nope" failed: No such file or directory (2)'
    )
    assert transfer.stderr_reason(b"rsync error: unexplained error (code 255) at io.c(285)\n").startswith("rsync error")
    assert transfer.stderr_reason(b"") == "no message"
