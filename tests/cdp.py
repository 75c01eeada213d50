"""Headless chromium (Debian's `chromium`) driven over the Chrome DevTools Protocol on a pipe
(`--remote-debugging-pipe`: JSON messages ending in NUL on fds 3/4, stdlib only): the driver of the report's
browser tests (tests/test_report_browser.py, tests/test_compare_browser.py) and of bench/bench_report.py."""

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

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


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

    def first_screen_ms(self, url: str, height: int = 1100) -> dict:
        """Open `url` and time it by the page's own clock (ms from navigation start): the load event's end
        and the first frame drawn after it (requestAnimationFrame, then a task: the frame is painted)."""
        self.open_page(url, height)
        return self.js("""new Promise(done => requestAnimationFrame(() => setTimeout(() => done({
            load_ms: performance.getEntriesByType('navigation')[0].loadEventEnd,
            first_frame_ms: performance.now()}), 0)))""")
