"""Every source the repository cites resolves inside it: an entry of docs/sources.md.

Code, templates and docs cite a threshold's or fact's source as ``docs/sources.md#<entry>`` (``sources.md#<entry>``
from inside docs/). This test reads the entries (``### <entry>`` headings of docs/sources.md) and fails on a
citation of a missing entry, on a link inside docs/sources.md to a missing entry, and on a citation of the design
notes that are not in the repository (by a path into their folders, a section mark into them, or one of their file
names: ``OUTSIDE`` spells each way, split so that this file does not cite them itself).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = Path("docs") / "sources.md"
SCANNED_DIRS = ("checks", "datasets", "provision", "templates", "docs", "tests")
SCANNED_TOP = ("tasks.py", "README.md", "BENCHMARKS.md", "pyproject.toml")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini"}

ENTRY = re.compile(r"^### ([a-z0-9-]+)\s*$", re.MULTILINE)
HEADING = re.compile(r"^### (.*)$", re.MULTILINE)
CITATION = re.compile(r"(?:docs/)?sources\.md#([A-Za-z0-9_.-]*[A-Za-z0-9_-])")
LOCAL_LINK = re.compile(r"\]\(#([^)]*)\)")
# The design notes outside the repository, by every spelling the code has used for them. The file names are
# written split so that this file does not cite them itself.
NOTES = ("compat", "health-checks", "communication-and-planning", "diagnosis", "data-staging", "cluster-engines")
OUTSIDE = [
    re.compile(r"\bref/[a-z-]+\.md"),
    re.compile("shared/" + "reference"),
    re.compile(r"\bref §"),
    re.compile(r"(?<![\w/-])(" + "|".join(NOTES) + r"|instrument-unchanged-scripts)\.md\b"),
]


def entries(root: Path) -> list[str]:
    """The entry names of docs/sources.md, in order (duplicates kept, so a test can see them)."""
    return ENTRY.findall((root / SOURCES).read_text())


def scanned_files(root: Path) -> Iterator[Path]:
    """The repository's text files that can cite a source (not this test: it spells the forbidden forms)."""
    me = Path(__file__).resolve()
    for name in SCANNED_TOP:
        if (root / name).is_file():
            yield root / name
    for top in SCANNED_DIRS:
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root).parts
            if any(p.startswith(".") or p == "__pycache__" for p in rel):
                continue
            if path.is_file() and path.suffix in SUFFIXES and path.resolve() != me:
                yield path


def problems(root: Path) -> list[str]:
    """``path:line: what`` for every citation that does not resolve inside the repository."""
    known = set(entries(root))
    docs_pages = {p.name for p in (root / "docs").glob("*.md")}
    out = []
    for path in scanned_files(root):
        rel = path.relative_to(root)
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for name in CITATION.findall(line):
                if name not in known:
                    out.append(f"{rel}:{number}: sources.md#{name} is no entry of {SOURCES}")
            for pattern in OUTSIDE:
                for match in pattern.finditer(line):
                    if match.group(0) in docs_pages:  # a page of docs/ that took one of the notes' names
                        continue
                    out.append(f"{rel}:{number}: {match.group(0)!r} cites notes outside the repository")
            if rel == SOURCES:
                out += [f"{rel}:{number}: #{a} is no entry" for a in LOCAL_LINK.findall(line) if a not in known]
    return out


def test_every_citation_resolves_to_an_entry_of_sources_md() -> None:
    assert problems(REPO) == []


def test_sources_md_entries_are_unique_and_every_heading_is_an_entry() -> None:
    names = entries(REPO)
    assert len(names) > 50, names
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert HEADING.findall((REPO / SOURCES).read_text()) == names  # a heading that is not a plain entry name


def test_every_entry_is_cited_by_the_code_the_templates_the_docs_or_another_entry() -> None:
    """An entry nothing cites any more is a source of nothing: drop it with the last citation."""
    text = (REPO / SOURCES).read_text()
    cited = set(LOCAL_LINK.findall(text)) | {
        name
        for path in scanned_files(REPO)
        if path.relative_to(REPO) != SOURCES
        for name in CITATION.findall(path.read_text(errors="replace"))
    }
    assert [name for name in entries(REPO) if name not in cited] == []


def test_the_code_and_templates_cite_sources_md() -> None:
    cited = {
        name
        for path in scanned_files(REPO)
        if path.relative_to(REPO) != SOURCES
        for name in CITATION.findall(path.read_text(errors="replace"))
    }
    assert {"cuda-driver-compat", "nvml-topology", "verdict-rules", "zero-model-states", "rsync-resume"} <= cited


SEED_CITATION = re.compile(r"seed article[^§\n]{0,40}§(\d+\.\d+)")
SEED_SECTION = re.compile(r"^- §(\d+\.\d+):", re.MULTILINE)


def test_every_cited_section_of_the_seed_article_is_summarised_in_its_entry() -> None:
    """The seed article is not in the repository: its entry says what each section the code cites says."""
    text = (REPO / SOURCES).read_text()
    entry = text.split("### seed-article", 1)[1].split("\n#", 1)[0]
    summarised = set(SEED_SECTION.findall(entry))
    cited = {
        (str(path.relative_to(REPO)), section)
        for path in scanned_files(REPO)
        if path.relative_to(REPO) != SOURCES
        for section in SEED_CITATION.findall(path.read_text(errors="replace"))
    }
    assert len(cited) > 10
    assert sorted((where, s) for where, s in cited if s not in summarised) == []


def _tree(tmp_path: Path, text: str, where: str = "checks/thing.py") -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / SOURCES).write_text("# Sources\n\n### real-entry\n\nA fact. See [real-entry](#real-entry).\n")
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / where).write_text(text)
    return tmp_path


def test_a_resolving_citation_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path, "X = 1  # the limit (docs/sources.md#real-entry)\n")
    assert problems(root) == []


@pytest.mark.parametrize(
    ("where", "text", "found"),
    [
        ("checks/thing.py", "X = 1  # docs/sources.md#no-such-entry\n", "sources.md#no-such-entry is no entry"),
        ("docs/page.md", "see [it](sources.md#gone)\n", "sources.md#gone is no entry"),
        ("templates/defaults.yaml", "a: 1  # (ref/" + "compat.md §4)\n", "cites notes outside"),
        ("datasets/x.py", '"""From ../shared/' + 'reference/x.md."""\n', "cites notes outside"),
        ("checks/plan/m.py", "Q = 0.5  # (ref §6.2)\n", "cites notes outside"),
        ("checks/verify/m.py", "# the rule (" + "diagnosis.md §2.6)\n", "cites notes outside"),
        ("docs/sources.md", "### real-entry\n\nSee [other](#missing-entry).\n", "#missing-entry is no entry"),
    ],
)
def test_a_citation_that_does_not_resolve_fails(tmp_path: Path, where: str, text: str, found: str) -> None:
    root = _tree(tmp_path, "", "checks/empty.py")
    (root / where).parent.mkdir(parents=True, exist_ok=True)
    (root / where).write_text(text)
    got = problems(root)
    assert len(got) == 1 and found in got[0], got
    assert got[0].startswith(f"{where}:"), got


# "issue N" points to a tracker the repository never links: the code, docs and BENCHMARKS.md say what happened (the
# fact, the measurement) or cite an entry of docs/sources.md. tests/bench writes BENCHMARKS.md's text, so it is held
# too; the other tests are not.
TRACKER = re.compile(r"\b[Ii]ssue #?\d")
TRACKER_KNOWN: set[str] = set()  # files allowed a mention: none left


def tracker_mentions(root: Path) -> list[str]:
    """``path:line`` of every "issue N" in the product, the docs, BENCHMARKS.md and tests/bench."""
    out = []
    for path in scanned_files(root):
        rel = path.relative_to(root)
        if rel.parts[0] == "tests" and rel.parts[:2] != ("tests", "bench"):
            continue
        lines = path.read_text(errors="replace").splitlines()
        out += [f"{rel}:{n}" for n, line in enumerate(lines, 1) if TRACKER.search(line)]
    return out


def test_no_issue_numbers_outside_the_known_files() -> None:
    left = [where for where in tracker_mentions(REPO) if where.split(":")[0] not in TRACKER_KNOWN]
    assert left == []


@pytest.mark.parametrize("text", ["# the cap (issue 10)\n", "x = 1  # see Issue 9\n", "# from issue #12\n"])
def test_an_issue_number_is_found(tmp_path: Path, text: str) -> None:
    root = _tree(tmp_path, text)
    assert tracker_mentions(root) == ["checks/thing.py:1"]


def test_words_that_only_contain_issue_pass(tmp_path: Path) -> None:
    root = _tree(tmp_path, "# the issue is the driver; 3 issues, tissue 4\n")
    assert tracker_mentions(root) == []
