"""Drive headless Chromium over the Chrome DevTools Protocol, through a pipe.

`--remote-debugging-pipe` makes Chromium read protocol messages (JSON, each ended by a NUL byte)
on file descriptor 3 and write its answers and events on descriptor 4. That needs no TCP port, no
websocket library and no browser download: Debian's `chromium` package is enough. Protocol
reference: the Chrome DevTools Protocol documentation (Target, Page, Runtime, Log, Network).

Every hostname except 127.0.0.1 is made unresolvable (`--host-resolver-rules`), so a page behaves
as it would offline, whatever network the machine has, and a CDN request fails at once.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)  # fmt: skip


def find_chromium() -> str | None:
    """Path of an installed Chromium or Chrome, or None (env CHROMIUM overrides)."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    return None


@dataclass
class PageReport:
    """What one page load showed: errors by kind, and whatever `evaluate` returned."""

    url: str
    exceptions: list[str] = field(default_factory=list)  # uncaught JS exceptions
    console_errors: list[str] = field(default_factory=list)  # console.error and Log errors
    failed_requests: list[str] = field(default_factory=list)  # "URL (reason)"


class Chromium:
    """One headless browser process; `with Chromium(path) as browser: browser.open(url)`."""

    def __init__(
        self, executable: str, width: int = 1280, height: int = 900, timeout_s: float = 60
    ):
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self._profile = tempfile.mkdtemp(prefix="memwall-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipes():  # in the child: Chromium expects commands on fd 3, answers on fd 4
            # Through spare high numbers first, in case a pipe end already sits on 3 or 4.
            reader = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            writer = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(reader, 3)
            os.dup2(writer, 4)

        self._process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
             "--remote-debugging-pipe", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=wire_pipes,
            pass_fds=(3, 4),  # kept open when the other descriptors are closed
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict] = []

    # ---- protocol ---------------------------------------------------------------------------

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and wait for its answer; events that arrive meanwhile are kept."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the debugging pipe (did it crash?)")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def pump(self, seconds: float) -> None:
        """Collect events for a while (there is no command to wait on)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self._events.append(self._read(deadline))
            except TimeoutError:
                return

    # ---- pages ------------------------------------------------------------------------------

    def open(self, url: str, settle_s: float = 1.0) -> Tab:
        """Open url in a new tab, wait for its load event plus `settle_s`, and return the tab.

        Events are kept for the newest tab only: use one tab at a time, and close it when done.
        """
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        tab = Tab(self, target, session, url)
        for domain in ("Page", "Runtime", "Log", "Network"):
            tab.send(f"{domain}.enable")
        tab._set_viewport(self.width, self.height)
        self._events.clear()
        tab.send("Page.navigate", {"url": url})
        tab.wait_for("Page.loadEventFired")
        self.pump(settle_s)
        return tab

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Tab:
    """One attached page: run JavaScript, read the errors it showed, take screenshots."""

    def __init__(self, browser: Chromium, target: str, session: str, url: str):
        self.browser, self.target, self.session, self.url = browser, target, session, url
        self._requests: dict[str, str] = {}  # requestId -> URL, to name failed requests

    def send(self, method: str, params: dict | None = None) -> dict:
        return self.browser.send(method, params, session=self.session)

    def wait_for(self, event: str) -> dict:
        deadline = time.monotonic() + self.browser.timeout_s
        while True:
            for message in self.browser._events:
                if message.get("method") == event and message.get("sessionId") == self.session:
                    return message["params"]
            self.browser._events.append(self.browser._read(deadline))

    def evaluate(self, expression: str, await_promise: bool = False):
        """Value of a JavaScript expression (must be JSON-serialisable)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": await_promise})  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def report(self) -> PageReport:
        """Errors seen so far on this page, from the protocol events."""
        report = PageReport(self.url)
        for message in self.browser._events:
            if message.get("sessionId") != self.session:
                continue
            method, params = message.get("method"), message.get("params", {})
            if method == "Network.requestWillBeSent":
                self._requests[params["requestId"]] = params["request"]["url"]
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                url = self._requests.get(params["requestId"], "?")
                report.failed_requests.append(f"{url} ({params.get('errorText')})")
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text")
                report.exceptions.append(
                    f"{text} at {details.get('url', '?')}:{details.get('lineNumber')}"
                )
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
                report.console_errors.append(" ".join(str(a) for a in args))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                report.console_errors.append(f"{entry.get('text')} [{entry.get('url', '')}]")
        return report

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})

    def screenshot(self, path: str, full_page: bool = True) -> None:
        """Save a PNG of the page (the whole scroll height, up to 16000 px, when full_page).

        For a full page the viewport itself is made as tall as the page: capturing "beyond the
        viewport" instead shifts sticky sidebars and headers out of place.
        """
        width, height = self.browser.width, self.browser.height
        if full_page:
            height = min(
                int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)")), 16000
            )
            self._set_viewport(width, height)
            self.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))",
                          await_promise=True)  # fmt: skip  # let the taller layout settle
        try:
            data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        finally:
            if full_page:
                self._set_viewport(self.browser.width, self.browser.height)
        with open(path, "wb") as file:
            file.write(base64.b64decode(data))

    def _set_viewport(self, width: int, height: int) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
