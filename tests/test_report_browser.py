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
import queue
import shutil
import subprocess
import threading
import time
from base64 import b64decode
from pathlib import Path

import polars as pl
import pytest

from clarify.batch.report import html as report
from tests.fixtures_report import HOSTILE, copy_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian package 'chromium' is not installed (apt-get install -y chromium)"
    ),
]


class Browser:
    """Headless chromium with one page, spoken to over the DevTools pipe (flattened sessions)."""

    def __init__(self, user_data_dir: Path):
        cmd_r, self._cmd_w = os.pipe()  # we write commands; chromium reads them on fd 3
        self._evt_r, evt_w = os.pipe()  # chromium writes replies/events on fd 4

        def wire_fds():  # runs in the child before exec: put the pipe ends on fds 3 and 4
            a, b = os.dup(cmd_r), os.dup(evt_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        flags = [
            "--headless",
            "--no-sandbox",  # we run as root in CI containers
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={user_data_dir}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            [CHROMIUM, *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            close_fds=False,
            preexec_fn=wire_fds,
        )
        os.close(cmd_r)
        os.close(evt_w)
        self._next_id = 0
        self._replies: dict[int, queue.Queue] = {}
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._events_cv = threading.Condition(self._lock)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.session: str | None = None

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line.decode("utf-8", "replace").rstrip())

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self._evt_r, 1 << 20)
            if not chunk:
                return
            buf += chunk
            *msgs, buf = buf.split(b"\0")
            for raw in msgs:
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        q = self._replies.get(msg["id"])
                    if q is not None:
                        q.put(msg)
                else:
                    with self._events_cv:
                        self.events.append(msg)
                        self._events_cv.notify_all()

    def send(
        self, method: str, params: dict | None = None, *, session: bool = True, timeout: float = 60.0
    ) -> dict:
        with self._lock:
            self._next_id += 1
            mid = self._next_id
            self._replies[mid] = q = queue.Queue()
        msg = {"id": mid, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        try:
            reply = q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(
                f"no reply to {method} in {timeout}s; chromium stderr: {self.stderr_lines[-5:]}"
            ) from None
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        with self._events_cv:
            while True:
                for ev in self.events:
                    if ev["method"] == method:
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {method} event in {timeout}s")
                self._events_cv.wait(left)

    def open_page(self, url: str, height: int = 1100) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, session=False
        )["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str):
        res = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in res:
            raise RuntimeError(f"JS error in {expression!r}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (press + release) at the centre of the element `selector`."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.left + Math.min(r.width / 2, 40), r.top + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
            )

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(b64decode(data))
        return path

    def errors(self) -> list[str]:
        out = []
        with self._lock:
            events = list(self.events)
        for ev in events:
            p = ev.get("params", {})
            if ev["method"] == "Runtime.exceptionThrown":
                out.append(
                    f"exception: {p['exceptionDetails'].get('text')} {p['exceptionDetails'].get('exception')}"
                )
            elif ev["method"] == "Runtime.consoleAPICalled" and p.get("type") in (
                "error",
                "assert",
                "warning",
            ):
                out.append(
                    f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p.get('args', [])]}"
                )
            elif ev["method"] == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry']['text']} ({p['entry'].get('url')})")
        return out

    def requests(self) -> list[str]:
        with self._lock:
            return [
                ev["params"]["request"]["url"]
                for ev in self.events
                if ev["method"] == "Network.requestWillBeSent"
            ]

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)


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
    # A passage's text is in the run's store once (batch/report/html.py text_store): empty until the passage
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
