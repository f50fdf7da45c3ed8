"""Credentials in a ``--source`` never leave stage-data: not in stdout, stderr, progress bars, manifest or journal.

Each test runs ``invoke stage-data`` as a user does, against a real loopback HTTP server (or a loopback sshd),
with credentials planted in every place a URL carries them: userinfo, a query token, a signed URL's signature and
credential, and a token-like path segment. Then every byte the run printed and every file under the test's
folder (destination, staging folder and journal, HOME) is searched for them, raw and percent-encoded.
"""

from __future__ import annotations

import http.server
import io
import json
import socket
import tarfile
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from datasets.sources import file_name, parse
from tests.datasets.photos import image_tree
from tests.datasets.servers import sshd
from tests.fakes.cli import Run, invoke
from tests.loopback import serve

pytestmark = pytest.mark.slow

PASSWORD = "pw-Hunter2xyz"
TOKEN = "tok-Q9x8y7w6v5"
SIGNATURE = "5d41402abc4b2a76b9719d911017c592ae1f0c8b3e7d2a9f"
CREDENTIAL = "AKIAEXAMPLE7Q/20261201/us-east-1/s3/aws4_request"
PATH_TOKEN = "AbCdEf0123456789AbCdEf0123456789"
SECRETS = (PASSWORD, TOKEN, SIGNATURE, CREDENTIAL, PATH_TOKEN)
QUERY = f"token={TOKEN}&X-Amz-Signature={SIGNATURE}&X-Amz-Credential={quote(CREDENTIAL, safe='')}"


def tar_gz(tree: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(tree, arcname="pets")
    return buf.getvalue()


def handler(blobs: dict[str, bytes]) -> type[http.server.BaseHTTPRequestHandler]:
    """Serve ``blobs`` by path (the query is ignored, as a signed-URL server checks it); /forbidden/ is 403,
    /drop/ cuts the connection mid-body."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = urlsplit(self.path).path
            if path.startswith("/forbidden/"):
                self.send_error(403, "signature does not match")
                return
            data = blobs.get(path.replace("/drop/", "/", 1))
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", '"v1"')
            self.end_headers()
            if not body:
                return
            if path.startswith("/drop/"):
                self.wfile.write(data[:100])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(data)

    return Handler


def leaks(run: Run, folder: Path) -> list[str]:
    """Every place a planted secret shows up: the run's output, or any file under ``folder``."""
    found = []
    forms = {s: (s.encode(), quote(s, safe="").encode()) for s in SECRETS}
    texts = {"stdout": run.out.encode(), "stderr": run.err.encode()}
    texts.update({str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()})
    for where, data in texts.items():
        found += [f"{secret} in {where}" for secret, encoded in forms.items() if any(e in data for e in encoded)]
    return found


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("secret-src")
    good = image_tree(root / "good", per_class=2)
    broken = image_tree(root / "broken", per_class=2)
    (broken / "fish" / "zz-broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return {f"/{PATH_TOKEN}/pets.tar.gz": tar_gz(good), f"/{PATH_TOKEN}/broken.tar.gz": tar_gz(broken)}


def url(base: str, path: str) -> str:
    return base.replace("http://", f"http://alice:{PASSWORD}@") + f"/{path}?{QUERY}"


def test_a_staged_download_keeps_its_credentials_out_of_output_manifest_and_journal(
    archives: dict[str, bytes], tmp_path: Path
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    conf = tmp_path / "invoke.yaml"
    conf.write_text(f'preflight:\n  stage:\n    dest_roots: ["{disk}"]\n')
    stage = ("-f", str(conf), "stage-data", "--size", "16", "--source")
    with serve(handler(archives)) as base:
        good, broken = url(base, f"{PATH_TOKEN}/pets.tar.gz"), url(base, f"{PATH_TOKEN}/broken.tar.gz")
        staged = invoke(tmp_path, *stage, good, "--progress")
        again = invoke(tmp_path, *stage, good)
        failed = invoke(tmp_path, *stage, broken, "--max-rejects", "0")
    assert staged.code == 0 and "download" in staged.err and "staged 6 images into" in staged.out, staged.why()
    assert f"staging to {disk}" in staged.err  # the name of the default destination comes from the URL
    assert again.code == 0 and "already staged" in again.out, again.why()
    assert failed.code == 1 and "1 image rejected" in failed.err, failed.why()
    doc = json.loads((disk / "staged" / "pets-16px" / "manifest.json").read_text())
    assert doc["source"]["spec"] == base.replace("http://", "http://***@") + (
        "/***/pets.tar.gz?token=***&X-Amz-Signature=***&X-Amz-Credential=***"
    )
    journal = disk / "staged" / ".broken-16px.staging" / "journal.jsonl"
    assert journal.is_file()  # the failed run's journal is kept for the resume, and is searched below
    assert leaks(staged, tmp_path) + leaks(again, tmp_path) + leaks(failed, tmp_path) == []


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("forbidden/pets.tar.gz", "answered HTTP 403"),
        ("drop/" + PATH_TOKEN + "/pets.tar.gz", "download of http://***@127.0.0.1"),
        ("missing/pets.tar.gz", "answered HTTP 404"),
    ],
)
def test_failed_downloads_word_the_error_without_credentials(
    archives: dict[str, bytes], tmp_path: Path, path: str, reason: str
) -> None:
    with serve(handler(archives)) as base:
        run = invoke(
            tmp_path,
            "stage-data",
            "--source",
            url(base, path),
            "--dest",
            str(tmp_path / "ds"),
            INVOKE_PREFLIGHT_STAGE_RETRIES="0",
        )
    assert run.code == 1 and reason in run.err, run.why()
    assert leaks(run, tmp_path) == []


def test_an_unreachable_server_and_the_requests_error_that_repeats_the_query(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = invoke(
        tmp_path,
        "stage-data",
        "--source",
        url(f"http://127.0.0.1:{port}", "x/pets.tar.gz"),
        "--dest",
        str(tmp_path / "d"),
    )
    assert run.code == 1 and f"cannot reach http://***@127.0.0.1:{port}/x/pets.tar.gz?token=***" in run.err, run.why()
    # The reason is the OS's, not urllib3's retry wrapper, which repeats the query (and ran to ~300 characters).
    assert run.err.strip().endswith("=***: Connection refused") and "Max retries" not in run.err
    assert leaks(run, tmp_path) == []


def test_a_password_in_an_ssh_source_is_refused_and_the_key_it_points_at_works(
    archives: dict[str, bytes], tmp_path: Path
) -> None:
    tree = image_tree(tmp_path / "remote" / "pets", per_class=2)
    (tmp_path / "keys").mkdir()
    with sshd(tmp_path / "keys") as ssh:
        refused = invoke(
            tmp_path, "stage-data", "--source", f"root:{PASSWORD}@127.0.0.1:{tree}", "--dest", str(tmp_path / "a")
        )
        keyed = invoke(
            tmp_path,
            "stage-data",
            "--source",
            f"root@127.0.0.1:{tree}",
            "--dest",
            str(tmp_path / "b"),
            "--size",
            "16",
            INVOKE_PREFLIGHT_STAGE_SSH_COMMAND=ssh,
        )
    assert refused.code == 2 and "root:***@127.0.0.1:... carries a password" in refused.err, refused.why()
    assert "ssh-copy-id root@127.0.0.1" in refused.err and not (tmp_path / "a").exists()
    assert keyed.code == 0 and "staged 6 images" in keyed.out, keyed.why()
    assert leaks(refused, tmp_path) == []


def test_a_token_like_last_segment_is_not_used_as_a_name() -> None:
    assert file_name(f"https://h/dl/{PATH_TOKEN}?sig=1") == "download"
    assert file_name("https://h/data/train.tar.gz?sig=1") == "train.tar.gz"
    src = parse(f"https://u:{PASSWORD}@h/{PATH_TOKEN}/train.tar.gz?token={TOKEN}")
    assert (src.spec, src.name, src.archive) == ("https://***@h/***/train.tar.gz?token=***", "train", True)


def test_an_unexpected_error_quoting_the_url_is_worded_and_scrubbed(tmp_path: Path) -> None:
    """A library error stage-data does not know by type, quoting the URL whole, still leaves without secrets."""
    import requests

    from datasets.errors import StageFailure
    from datasets.stage import stage
    from tests.datasets import jobs

    class Odd(requests.Session):
        def head(self, url: str | bytes, **kwargs: object) -> requests.Response:
            raise ValueError(f"cannot parse {url!s}")

    source = f"https://u:{PASSWORD}@h.example/{PATH_TOKEN}/x.tar?token={TOKEN}"
    with pytest.raises(StageFailure) as caught:
        stage(jobs.request(source, tmp_path / "ds"), session=Odd())
    message = caught.value.message or ""
    assert message.startswith("gpu-preflight: ValueError: cannot parse https://***@h.example/***/x.tar")
    assert not any(secret in message for secret in SECRETS)
