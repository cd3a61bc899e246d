"""A small Chrome DevTools Protocol client for tests: headless Chromium started with
``--remote-debugging-pipe`` reads NUL-terminated JSON messages on its fd 3 and writes
answers and events on its fd 4. Enough to load a page, list what went wrong while it
loaded (console errors, uncaught exceptions, failed resource loads and responses of 400
or more, CSP refusals), take a screenshot and read the DOM. Every wait has a deadline.

The pipe ends go to fds 3 and 4 through bash's redirections after ``pass_fds`` (which
keeps descriptors at their numbers): a ``preexec_fn`` could deadlock, since the tests
run servers in threads.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-dev-shm-usage", "--disable-extensions", "--mute-audio",
         "--remote-debugging-pipe")
# After the load event, how long a page may stay quiet before it counts as loaded: late
# errors (an image that fails after onload) still arrive within it.
SETTLE_S = 0.5


@dataclass(frozen=True)
class PageLoad:
    problems: list[str]  # empty when the page loaded cleanly
    dom: str
    screenshot: bytes  # PNG


class Browser:
    """One headless Chromium; ``load`` opens each URL in a fresh tab."""

    def __init__(self, executable: str, profile: Path, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        # Above 9 and never 3 or 4, so the redirections below cannot clobber each other.
        child_in = fcntl.fcntl(to_child, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_child, fcntl.F_DUPFD_CLOEXEC, 10)
        for fd in (to_child, from_child):
            os.close(fd)
        script = (f'exec 3<&{child_in} 4>&{child_out} {child_in}<&- {child_out}>&-; '
                  'exec "$0" "$@"')
        self._process = subprocess.Popen(
            ["bash", "-c", script, executable, *FLAGS, f"--user-data-dir={profile}",
             "about:blank"],
            pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in (child_in, child_out):
            os.close(fd)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        # Asked to close; if it cannot even answer, it is killed below.
        with contextlib.suppress(OSError, TimeoutError, RuntimeError, EOFError):
            self.call("Browser.close", timeout=5)
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        for fd in (self._in, self._out):
            os.close(fd)

    # --- pages ------------------------------------------------------------------------

    def load(self, url: str, *, width: int = 1280, height: int = 900) -> PageLoad:
        """Open `url` in a new tab, wait for its load event and quiet, and report."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        try:
            for domain in ("Runtime", "Log", "Network", "Page"):
                self.call(f"{domain}.enable", session=session)
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1,
                       "mobile": False}, session=session)
            self._events = []  # earlier tabs' events: theirs, already reported
            navigated = self.call("Page.navigate", {"url": url}, session=session)
            problems = [f"navigation failed: {navigated['errorText']}"] \
                if navigated.get("errorText") else []
            self._wait_for("Page.loadEventFired", session)
            self._settle()
            problems += _problems([e for e in self._events if e.get("sessionId") == session])
            root = self.call("DOM.getDocument", {"depth": 0}, session=session)["root"]
            dom = self.call("DOM.getOuterHTML", {"nodeId": root["nodeId"]},
                            session=session)["outerHTML"]
            shot = self.call("Page.captureScreenshot", {"format": "png"}, session=session)
        finally:
            self.call("Target.closeTarget", {"targetId": target})
        return PageLoad(problems=problems, dom=dom, screenshot=base64.b64decode(shot["data"]))

    # --- the protocol -----------------------------------------------------------------

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Send one command and wait for its answer; events meanwhile are kept."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            found = self._read(deadline)
            if found is None:
                raise TimeoutError(f"no answer to {method} from Chromium")
            if found.get("id") == self._next_id:
                if "error" in found:
                    raise RuntimeError(f"{method}: {found['error']}")
                result: dict[str, Any] = found.get("result", {})
                return result
            if "method" in found:
                self._events.append(found)

    def _wait_for(self, method: str, session: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not any(e["method"] == method and e.get("sessionId") == session
                      for e in self._events):
            found = self._read(deadline)
            if found is None:
                raise TimeoutError(f"no {method} from Chromium")
            if "method" in found:
                self._events.append(found)

    def _settle(self) -> None:
        """Read events until none came for SETTLE_S (at most the timeout)."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            found = self._read(min(deadline, time.monotonic() + SETTLE_S))
            if found is None:
                return
            if "method" in found:
                self._events.append(found)

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None at the deadline."""
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                return None
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise EOFError(f"Chromium closed its pipe (exit status "
                               f"{self._process.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        found: dict[str, Any] = json.loads(message)
        return found


def _problems(events: list[dict[str, Any]]) -> list[str]:
    """What went wrong, in words, from one tab's events."""
    urls = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in events
            if e["method"] == "Network.requestWillBeSent"}
    found = []
    for event in events:
        method, params = event["method"], event["params"]
        if method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            found.append(f"log ({entry['source']}): {entry['text']} {entry.get('url', '')}")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            found.append(f"console.{params['type']}: {args}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.append(f"exception: {details.get('exception', {}).get('description', '')} "
                         f"{details['text']}")
        elif method == "Network.loadingFailed":
            found.append(f"failed to load {urls.get(params['requestId'], '?')}: "
                         f"{params['errorText']}")
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            found.append(f"HTTP {params['response']['status']} for "
                         f"{params['response']['url']}")
    return found
