"""Text: byte-level and Hugging Face tokenizers on real English (CPython's pydoc topics), rejects, dtype, resume."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import numpy as np
import pytest

from datasets import text
from datasets.errors import StageFailure, UsageError
from datasets.journal import Journal
from datasets.request import Request
from datasets.stage import stage
from tests.datasets import jobs

NAMES = sorted(topics)[:40]


def corpus(root: Path) -> list[str]:
    """Write real prose as .txt files and one .jsonl; return the documents in staging order."""
    (root / "txt").mkdir(parents=True)
    docs = []
    lines = [json.dumps({"text": topics[name], "id": name}) for name in NAMES[20:]]
    (root / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    docs += [topics[name] for name in NAMES[20:]]
    for name in NAMES[:20]:
        (root / "txt" / f"{name}.txt").write_text(topics[name], encoding="utf-8")
    docs += [topics[name] for name in sorted(NAMES[:20])]
    return docs


def request(src: Path, dest: Path, **kw: Any) -> Request:
    """Text, up to 10 rejects, else the configured defaults."""
    return jobs.request(src, dest, **{"kind": "text", "max_rejects": "10", **kw})


def documents(dest: Path) -> list[bytes]:
    tokens, offsets = np.load(dest / "tokens.npy"), np.load(dest / "doc_offsets.npy")
    return [tokens[a:b].astype(np.uint8).tobytes() for a, b in itertools.pairwise(offsets)]


def test_byte_level_tokens_give_back_the_documents(tmp_path: Path) -> None:
    docs = corpus(tmp_path / "src")
    done = stage(request(tmp_path / "src", tmp_path / "ds"))
    assert np.load(done.dest / "tokens.npy", mmap_mode="r").dtype == np.uint16
    assert documents(done.dest) == [d.encode() for d in docs]
    assert done.manifest.contents.counts.staged == 40
    assert done.manifest.contents.tokenizer is not None and done.manifest.contents.tokenizer.name == "byte-level"
    assert stage(request(tmp_path / "src", tmp_path / "ds")).noop


def test_bad_lines_and_non_utf8_files_are_rejected_and_rolled_back(tmp_path: Path) -> None:
    docs = corpus(tmp_path / "src")
    with (tmp_path / "src" / "a.jsonl").open("a") as fh:
        fh.write("{not json\n" + json.dumps({"body": "no text field"}) + "\n")
    (tmp_path / "src" / "txt" / "zz-latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 100)
    done = stage(request(tmp_path / "src", tmp_path / "ds"))
    reasons = [r.reason for r in done.manifest.contents.rejects]
    assert reasons[:2] == ["not a JSON line", "no string field 'text'"]
    assert reasons[2].startswith("not UTF-8 at byte 3")
    assert documents(done.dest) == [d.encode() for d in docs]


def test_too_many_rejected_lines_fail(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text("{}\n" * 5 + json.dumps({"text": "ok"}) + "\n")
    with pytest.raises(StageFailure, match="5 documents rejected"):
        stage(request(tmp_path / "src", tmp_path / "ds", max_rejects="1"))


@pytest.mark.slow
def test_hugging_face_tokenizer_from_a_local_file(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    docs = corpus(tmp_path / "src")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=600, special_tokens=["[UNK]"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(docs, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    done = stage(request(tmp_path / "src", tmp_path / "ds", text={"tokenizer": str(tmp_path / "tokenizer.json")}))
    tokens, offsets = np.load(done.dest / "tokens.npy"), np.load(done.dest / "doc_offsets.npy")
    assert tokens.dtype == np.uint16 and len(tokens) < sum(len(d) for d in docs) / 2  # BPE compresses
    assert tok.decode(tokens[offsets[0] : offsets[1]].tolist()) == docs[0]


def wordlevel(tmp_path: Path, size: int) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(size)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "big.json"))
    return tmp_path / "big.json"


@pytest.mark.slow
def test_vocabulary_past_uint16_uses_uint32_and_a_forced_uint16_is_refused(tmp_path: Path) -> None:
    path = wordlevel(tmp_path, 70_000)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("w1 w69999 w65536 w2")
    done = stage(request(tmp_path / "src", tmp_path / "ds", text={"tokenizer": str(path)}))
    tokens = np.load(done.dest / "tokens.npy")
    assert tokens.dtype == np.uint32 and tokens.tolist() == [1, 69999, 65536, 2]
    with pytest.raises(UsageError, match="does not fit uint16"):
        stage(request(tmp_path / "src", tmp_path / "ds16", text={"tokenizer": str(path), "token_dtype": "uint16"}))


def test_token_ids_past_the_dtype_are_an_error_not_a_wrap() -> None:
    with pytest.raises(UsageError):
        text.token_dtype(1 << 33, "auto")
    assert text.token_dtype(65_536, "auto") == np.dtype("<u2")
    assert text.token_dtype(65_537, "auto") == np.dtype("<u4")


def test_crash_mid_tokenization_resumes_to_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus(tmp_path / "src")
    monkeypatch.setattr(text, "BATCH_BYTES", 4096)  # many journaled steps
    straight = stage(request(tmp_path / "src", tmp_path / "straight")).dest
    real_append, calls = Journal.append, {"n": 0}

    def crash_after_some(self: Journal, event: dict) -> None:
        calls["n"] += 1
        if calls["n"] == 25:
            raise KeyboardInterrupt  # the process dies here
        real_append(self, event)

    monkeypatch.setattr(Journal, "append", crash_after_some)
    with pytest.raises(KeyboardInterrupt):
        stage(request(tmp_path / "src", tmp_path / "ds"))
    monkeypatch.setattr(Journal, "append", real_append)
    resumed = stage(request(tmp_path / "src", tmp_path / "ds"))
    assert "resuming an unfinished run" in resumed.notes
    for name in ("tokens.npy", "doc_offsets.npy"):
        assert (resumed.dest / name).read_bytes() == (straight / name).read_bytes()
