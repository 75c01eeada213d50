"""The HTML report in a real headless browser (Debian's `chromium`), driven over the Chrome DevTools
Protocol on a pipe (`--remote-debugging-pipe`: JSON messages ending in NUL on fds 3/4, stdlib only).

Checks: the page loads from file:// without any network request, every embedded plot decodes, the
console shows no errors or exceptions, a collapsed tree node opens on a real mouse click, a quoted
span's link scrolls to and flashes its passage offsets, "expand all" opens every node. Screenshots
are written to tmp_path (and to $CLARIFY_SCREENSHOT_DIR when set, to look at them).

Install the browser with `apt-get install -y chromium`; without it the test is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import polars as pl
import pytest

from clarify.batch.report import html as report
from tests.cdp import CHROMIUM, Browser
from tests.fixtures_report import HOSTILE, N_QUESTIONS, copy_run, rekey

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian package 'chromium' is not installed (apt-get install -y chromium)"
    ),
]


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


def _publish(path: Path) -> None:
    dest = os.environ.get("CLARIFY_SCREENSHOT_DIR")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(dest) / path.name)


def test_report_renders_and_tree_expands_in_chromium(report_runs, tmp_path, browser):
    out = report.write_report(report_runs, tmp_path / "report.html")
    url = out.resolve().as_uri()
    browser.open_page(url)

    # Rendered: title, both run sections, every plot decoded to a real image.
    assert browser.js("document.title").startswith("clarify report")
    assert browser.js("[...document.querySelectorAll('section.run')].map(s => s.id)") == ["run-0", "run-1"]
    imgs = browser.js("[...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    # comparison plot + 4 per run; no forest plot (3 questions are too few for intervals: eval/paired.py MIN_N)
    # and no quality-cost plot (no cost per device recorded)
    assert len(imgs) == 9
    assert all(ok and w > 300 and h > 200 for ok, w, h in imgs)
    # The status colours really apply (computed style, not just class names).
    colours = browser.js(
        "Object.fromEntries(['root','valid','pruned','duplicate'].map(s => [s,"
        " getComputedStyle(document.querySelector('#r0-q0 .badge.b-' + s)).backgroundColor]))"
    )
    assert len(set(colours.values())) == 4, colours
    # Wide tables scroll inside their box; the page itself never scrolls sideways.
    assert browser.js("document.documentElement.scrollWidth <= window.innerWidth") is True
    browser.screenshot(tmp_path / "report_top.png")

    # A collapsed node of the first question opens on a real click, and its passages show.
    sel = "#r0-q0 details.node[data-status='valid']"
    assert browser.js(f'document.querySelector("{sel}").open') is False
    # (a closed <details> keeps its content laid out but content-visibility-hidden: ask checkVisibility)
    assert browser.js(f'document.querySelector("{sel} > .nbody").checkVisibility()') is False
    browser.click(f"{sel} > summary")
    assert browser.js(f'document.querySelector("{sel}").open') is True
    assert browser.js(f'document.querySelector("{sel} > .nbody").checkVisibility()') is True
    assert browser.js(f'document.querySelector("{sel} > .nbody").getBoundingClientRect().height') > 50
    assert browser.js(f'document.querySelectorAll("{sel} > .nbody li.passage").length') >= 5
    # A passage's text is in the run's store once (batch/report/render.py text_store): empty until the passage
    # opens, then its text from passages.parquet, as text
    first = f"{sel} > .nbody li.passage"
    pid = browser.js(f'document.querySelector("{first}").dataset.passageId')
    assert browser.js(f'document.querySelector("{first} .ptext").textContent') == ""
    browser.click(f"{first} > details > summary")
    want = pl.read_parquet(report_runs[0] / "passages.parquet").filter(pl.col("passage_id") == pid)["text"][0]
    # the toggle event comes after the click's task: wait for it (up to 5 s)
    shown = browser.js(f"""new Promise(done => {{ const t0 = Date.now(); (function poll() {{
        const text = document.querySelector("{first} .ptext").textContent;
        if (text || Date.now() - t0 > 5000) {{ done(text); }} else {{ setTimeout(poll, 20); }} }})(); }})""")
    assert shown == want
    assert browser.js(f'document.querySelector("{first} .ptext").checkVisibility()') is True
    # The hostile question the model proposed (pruned) is shown as text, not run.
    pruned = "#r0-q0 details.node[data-status='pruned'] > summary .dq"
    assert browser.js(f'document.querySelector("{pruned}").textContent').endswith(HOSTILE)
    browser.screenshot(tmp_path / "report_node.png")

    # A quoted span links to its highlighted offsets inside the source passage.
    link = "#r0-q0 p.answer a.qspan"
    href = browser.js(f"document.querySelector(\"{link}\").getAttribute('href')")
    browser.click(link)
    assert browser.js("location.hash") == href
    flashed = browser.js(
        "[...document.querySelectorAll('mark.flash')].map(m => m.closest('li.passage').dataset.passageId)"
    )
    assert flashed and len(set(flashed)) == 1
    top = browser.js(f"document.getElementById({json.dumps(href[1:])}).getBoundingClientRect().top")
    assert 0 <= top <= 1100  # scrolled into view
    browser.screenshot(tmp_path / "report_span.png")

    # "expand all" opens every node of the question.
    browser.click("#r0-q0 button[data-act='expand']")
    assert browser.js("[...document.querySelectorAll('#r0-q0 details.node')].every(d => d.open)") is True

    # A link of the (folded) question index into a collapsed question (other run) opens it.
    assert browser.js("document.getElementById('r1-q1').open") is False
    browser.click("#run-1 details.qindex-box > summary")
    assert browser.js("document.querySelector('#run-1 details.qindex-box').open") is True
    browser.click("#run-1 table.qindex a[href='#r1-q1']")
    assert browser.js("document.getElementById('r1-q1').open") is True
    assert _until(browser, "document.querySelectorAll('#r1-q1 details.node').length") > 0  # its packed body, in

    for name in ("report_top.png", "report_node.png", "report_span.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
        _publish(tmp_path / name)
    assert browser.errors() == []
    # The listener is live: a console error would have been caught.
    browser.js("console.error('probe')")
    deadline = time.monotonic() + 10
    while not browser.errors() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert browser.errors() == ["console.error: ['probe']"]
    assert [u for u in browser.requests() if not u.startswith(("file:", "data:", "about:"))] == []


# Every element wider than the viewport, or reaching past its right edge, outside a box that scrolls
# sideways on purpose (.scroll): [tag.class, right edge].
OVERFLOW_JS = """[...document.querySelectorAll('body *')].filter(e => !e.closest('.scroll') && e.checkVisibility())
  .map(e => [e.tagName + '.' + e.className, Math.round(e.getBoundingClientRect().right)])
  .filter(([, right]) => right > window.innerWidth)"""


def test_first_screen_shows_the_headline_and_the_first_tree(report_runs, tmp_path, browser):
    """At 1280x800 the first screen holds the headline metrics and the first question's tree; nothing is
    wider than the page, a long value (the engine's model id) wraps inside its cell."""
    import json as _json

    run = tmp_path / "runs" / "smol-asqa"
    copy_run(report_runs[0], run)
    summary = _json.loads((run / "summary.json").read_text())
    assert summary["metrics"]["d_f1"] is None  # no reader: an n/a card
    long_id = "smollm2-135m-instruct@4e4d7b27b48f:chat:float32:batch-invariant:vllm-0.32.0:torch-2.13.0+cpu" * 2
    (run / "summary.json").write_text(_json.dumps({**summary, "engine_model_id": long_id}))
    out = report.write_report([run], tmp_path / "report.html")
    browser.open_page(out.resolve().as_uri(), height=800)
    assert browser.js("[window.innerWidth, window.innerHeight]") == [1280, 800]
    assert browser.js("document.documentElement.scrollWidth <= window.innerWidth") is True
    assert browser.js(OVERFLOW_JS) == []
    box = browser.js("""(() => { const r = e => { const b = document.querySelector(e).getBoundingClientRect();
        return [b.top, b.bottom]; };
      return {headline: r('#run-0 .headline'), tree: r('#r0-q0 ul.tree.root-level'),
              root: r('#r0-q0 details.node[data-status=root] > summary'),
              first_child: r('#r0-q0 details.node[data-status=root] ul.tree details.node > summary')}; })()""")
    assert 0 < box["headline"][0] < box["headline"][1] <= 800, box
    assert box["headline"][1] <= box["tree"][0] < 800 and box["root"][1] <= 800, box
    assert box["first_child"][1] <= 800, box  # the tree's first disambiguation is on the first screen too
    na = browser.js("document.querySelector('#run-0 .metric[data-metric~=d_f1]').innerText")
    assert "n/a" in na and "needs a reader" in na
    shot = browser.screenshot(tmp_path / "report_first_screen.png")
    assert shot.read_bytes()[:4] == b"\x89PNG"
    _publish(shot)

    # The folded run summary, opened: the long model id wraps in its cell, the page stays 1,280 px wide.
    browser.click("#run-0 details.summary-box > summary")
    assert browser.js("document.querySelector('#run-0 details.summary-box').open") is True
    cell = browser.js(f"""(() => {{ const td = [...document.querySelectorAll('#run-0 table.summary td')]
        .find(td => td.textContent === {_json.dumps(long_id)}); const b = td.getBoundingClientRect();
        return [b.right, b.height]; }})()""")
    assert cell[0] <= 1280 and cell[1] > 30, cell  # inside the page, on several lines
    assert browser.js(OVERFLOW_JS) == []
    assert browser.js("document.documentElement.scrollWidth <= window.innerWidth") is True
    browser.screenshot(tmp_path / "report_summary_open.png")
    _publish(tmp_path / "report_summary_open.png")
    assert browser.errors() == []


def _until(browser, expression: str, timeout_s: float = 10.0):
    """The value of `expression` once it is truthy (report.js inflates packed bodies asynchronously)."""
    return browser.js(f"""new Promise(done => {{ const t0 = Date.now(); (function poll() {{
        const v = ({expression}); if (v || Date.now() - t0 > {timeout_s * 1000}) {{ done(v); }}
        else {{ setTimeout(poll, 20); }} }})(); }})""")


def test_a_report_of_500_questions_is_small_and_draws_only_what_is_open(report_runs, tmp_path, browser):
    """A run at the shipped data's full size (500 ASQA questions: the scripted run's tables copied under
    new question and passage ids, fixtures_report.rekey): the report is under 10 MB because every closed
    question's body and the passage texts are packed (html.pack), and the first screen lays out one tree,
    not 500. A closed question opens with its tree (a click, or a link of the question index), its passages
    fill, its quoted spans link to their offsets, its "expand all" opens every node."""
    run = rekey(report_runs[0], tmp_path / "runs" / "big", copies=-(-500 // N_QUESTIONS))
    out = report.write_report([run], tmp_path / "report.html")
    n = pl.read_parquet(run / "questions.parquet").height
    assert n >= 500 and out.stat().st_size < 10 * 2**20
    timing = browser.first_screen_ms(out.resolve().as_uri())
    print(f"first screen of {n} questions, {out.stat().st_size / 2**20:.1f} MB: {timing}")  # bench_report.py times it
    assert browser.js("document.querySelectorAll('details.question').length") == n
    assert browser.js("document.querySelectorAll('script.qz').length") == n - 1  # all but the open first one
    first_nodes = browser.js("document.querySelectorAll('#r0-q0 details.node').length")
    assert first_nodes > 0 and browser.js("document.querySelectorAll('details.node').length") == first_nodes

    # a click on a closed question in the middle: its tree comes in, the same as the first question's shape
    q = f"r0-q{n // 2}"
    assert browser.js(f"document.querySelector('#{q} details.node')") is None
    browser.click(f"#{q} > summary")
    assert _until(browser, f"document.querySelectorAll('#{q} details.node').length") > 0
    assert browser.js(f"document.querySelector('#{q} > script.qz')") is None
    assert browser.js(f"document.querySelectorAll('#{q} > .qbody').length") == 1
    # its passage text fills from the packed store when it opens
    node = f"#{q} details.node[data-status='valid']"
    first = f"{node} > .nbody li.passage"
    pid = browser.js(f'document.querySelector("{first}").dataset.passageId')
    browser.click(f"{node} > summary")
    browser.click(f"{first} > details > summary")
    want = pl.read_parquet(run / "passages.parquet").filter(pl.col("passage_id") == pid)["text"][0]
    assert _until(browser, f'document.querySelector("{first} .ptext").textContent') == want
    # "expand all" opens every node of that question
    browser.click(f"#{q} button[data-act='expand']")
    assert browser.js(f"[...document.querySelectorAll('#{q} details.node')].every(d => d.open)") is True

    # a link of the question index into a packed question: opened, filled, scrolled to
    last = f"r0-q{n - 1}"
    browser.click("#run-0 details.qindex-box > summary")
    browser.click(f"#run-0 table.qindex a[href='#{last}']")
    assert browser.js(f"document.getElementById('{last}').open") is True
    assert _until(browser, f"document.querySelectorAll('#{last} details.node').length") > 0
    # a quoted span of it links to its offsets in the source passage
    link = f"#{last} p.answer a.qspan"
    href = browser.js(f"document.querySelector(\"{link}\").getAttribute('href')")
    browser.click(link)
    assert browser.js("location.hash") == href
    assert _until(browser, "document.querySelectorAll('mark.flash').length") > 0
    assert browser.errors() == []
