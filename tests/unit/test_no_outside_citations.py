"""Comments, docstrings and documents cite only what a reader of the repository has.

They cite docs/architecture.md by section, or the public specification they follow (OpenAI chat
completions, MCP, WHATWG server-sent events, an RFC section, the Redis docs), never an issue number
or a document outside the repository; an upstream project's issue is cited by its full URL.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What is scanned: the product packages, tests, benchmarks, examples, docs, deployment files and
#: the top-level documents and configuration.
SCANNED_DIRS = ("smith_client", "smith_worker", "tests", "bench", "examples", "docs", "deploy", ".ci")
SCANNED_FILES = ("README.md", "BENCHMARKS.md", "Makefile", "pyproject.toml", "Procfile")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"}

#: References a reader of the repository cannot follow: the design documents and research notes
#: kept outside it, issue numbers, and an upstream issue as ``owner/repo#N`` instead of its URL.
OUTSIDE = re.compile(
    "|".join(
        (
            r"seed §",
            r"seed's",
            r"the seed",
            r"design-0",
            r"[Ii]ssue[ -][0-9]+",
            r"issues? #?[0-9]+",
            r"DESIGN\.md",
            r"research/",
            r"arq-notes",
            r"mcp-notes",
            r"perf-anchors",
            r"perf-turn2",
            r"review-architecture",
            r"agents-notes",
            r"web-and-ops-notes",
            r"anchors\.md",
            r"(?<![\w/.])[\w.-]+/[\w.-]+#[0-9]+",
        )
    )
)
#: A section sign is a citation of a numbered section; only an RFC's (``RFC 9110 §15.6.4``) is public.
SECTION = re.compile(r"§")
RFC_BEFORE = re.compile(r"RFC [0-9]+ $")


def scanned_files() -> list[Path]:
    """Every file scanned, this test's own file excluded (it spells the patterns)."""
    files = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts):
                files.append(path)
    own = Path(__file__).resolve()
    return [path for path in files if path.resolve() != own]


def outside_references(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line of ``text`` citing something outside the repository."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        sections = [m for m in SECTION.finditer(line) if not RFC_BEFORE.search(line[: m.start()])]
        if OUTSIDE.search(line) or sections:
            found.append((number, line.strip()))
    return found


def references_by_file() -> dict[str, list[tuple[int, str]]]:
    """Relative path → its lines citing something outside the repository (files with none left out)."""
    result = {}
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary data
        found = outside_references(text)
        if found:
            result[path.relative_to(ROOT).as_posix()] = found
    return result


def test_the_patterns_catch_what_they_should():
    for line in (
        "# see seed §6.3",
        "the seed's defaults",
        "(issue 18)",
        "Issue 12 acceptance 1",
        "issues 9 and 11",
        "before the issue-10 merge",
        "(DESIGN.md §8)",
        "research/mcp-notes.md",
        "(arq-notes.md §1.9)",
        "(python-arq/arq#385)",
        "(§14.1: concurrently)",
    ):
        assert outside_references(line), line
    for line in (
        "RFC 9110 §15.6.4",
        "https://github.com/python-arq/arq/issues/485",
        "docs/architecture.md, Tool calls",
        "random.Random(args.seed)",
        "#status { color: #555; }",
    ):
        assert not outside_references(line), line


def test_comments_and_documents_cite_nothing_outside_the_repository():
    found = references_by_file()
    report = "\n".join(f"{path}:{number}: {line}" for path, lines in sorted(found.items()) for number, line in lines)
    assert not found, (
        "cite docs/architecture.md (by section) or the public spec instead; issue numbers belong in commit "
        "messages:\n" + report
    )
