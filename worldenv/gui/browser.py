"""The instances' browser: one headless Chromium, driven over the DevTools protocol.

``Browser`` starts Debian's ``chromium`` inside a bubblewrap sandbox (the shell's: an
unprivileged user, no capability, a private network namespace with nothing but its own
loopback, a read-only root, a tmpfs profile; a uid of its own, so its hundreds of threads
never count against the shell's process limit) and speaks the DevTools protocol over a pipe
(``--remote-debugging-pipe``: JSON messages ended by a NUL byte on fds 3 and 4), so no
debugging port is ever opened. Each instance gets a ``BrowserPage``: an isolated browser
context (its own cookies, cache and storage) with one page in it.

Every request of a page is intercepted (``Fetch.requestPaused``) and answered by the
instance's own page server (``worldenv.gui.site.serve``), in the thread that drives the page, so
a page reaches exactly its instance's pages: any other origin or scheme is failed before
it leaves the browser, and the sandbox has no network besides. Page script is disabled.
Nothing moves: animation time stands still in every page (``Animation.setPlaybackRate``
0), images show their first frame (``imageAnimationPolicy``), so a screenshot is a
function of the page, whatever animation its style sheet asks for.

One process serves every instance (``shared_browser``): it starts on the first page and
stops when it has had no page for ``idle_s`` seconds. If it dies, every page of it fails
its next command with ``BrowserError`` and the next page starts a fresh process.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worldenv.errors import BrowserError, SandboxError
from worldenv.gui.site import ORIGIN
from worldenv.sandbox.bubblewrap import (
    bwrap_argv,
    find_sandbox_tools,
    kill_sandbox,
    popen_long_lived,
)
from worldenv.sandbox.policy import Rlimits, SandboxPolicy, Tmpfs, browser_ids

__all__ = ["Browser", "BrowserPage", "Intercepted", "Served", "shared_browser"]

log = logging.getLogger(__name__)

VIEWPORT = (1024, 768)
# Chromium's processes and threads, counted for its sandbox alone (worldenv.sandbox): ~140
# once started and ~27 more per open page (a renderer's threads), for the pages of every
# instance this browser serves. 512 held 15 pages: the 16th instance's page never answered.
# This bounds a runaway (pages run no script), not the pages a node serves: ~600 fit.
BROWSER_MAX_PROCS = 16384
COMMAND_TIMEOUT_S = 20.0
START_TIMEOUT_S = 30.0
SETTLE_S = 0.03  # how long an action waits for a navigation it may have started
# How long a click on a link or button (or Enter in a field) waits for the navigation it
# is expected to start: a form submission is a task the renderer runs after the click,
# which under load can come long after 30 ms. It ends as soon as the navigation is seen.
NAVIGATION_WAIT_S = 3.0
IDLE_S = 30.0
CHROMIUM_NAMES = ("chromium", "chromium-browser")
# Flags for a quiet, reproducible renderer: no background traffic, no GPU, no scroll bars,
# one colour profile, no font hinting, a fixed scale.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
    "--user-data-dir=/tmp/profile", "--no-first-run", "--no-default-browser-check",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--disable-breakpad",
    "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication",
    "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
    "--mute-audio", "--hide-scrollbars", "--force-color-profile=srgb",
    "--font-render-hinting=none", "--force-device-scale-factor=1",
    "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>", "--no-pings", "--password-store=basic",
    "--use-mock-keychain",
    # A still world renders still: images show their first frame only, and pages that ask
    # the system are told to reduce motion (CSS animations are stopped per page: setup).
    "--blink-settings=imageAnimationPolicy=2", "--force-prefers-reduced-motion",
)


@dataclass(frozen=True, slots=True)
class Intercepted:
    """A request a page made, as the page server sees it."""

    method: str
    url: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Served:
    """The page server's answer (``status`` 0: fail the request, it leaves nothing)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


Handler = Callable[[Intercepted], Served]


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
        if found:
            return os.path.realpath(found)
    raise BrowserError("chromium not found: install Debian's chromium (apt-get install "
                       "chromium) for GUI tools")


class Browser:
    """One sandboxed Chromium process and its pages."""

    def __init__(self, *, executable: str | None = None, idle_s: float = IDLE_S,
                 memory_mib: int = 1 << 20) -> None:
        self.executable = executable or find_chromium()
        self.idle_s = idle_s
        self.memory_mib = memory_mib
        self._ids = itertools.count(1)
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._waiting: dict[int, queue.Queue[dict[str, Any] | None]] = {}
        self._sessions: dict[str, queue.Queue[dict[str, Any] | None]] = {}
        self._pages = 0
        self._idle_timer: threading.Timer | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._out = -1
        self._reader: threading.Thread | None = None
        self.alive = False

    # --- the process --------------------------------------------------------------------

    def start(self) -> None:
        to_browser, browser_in = os.pipe()
        browser_out, from_browser = os.pipe()
        argv = self._argv()
        try:
            # fds 3 and 4 of the browser are its DevTools pipe; bubblewrap and setpriv keep
            # inherited descriptors, so they reach Chromium as they are.
            self._proc = popen_long_lived(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(3, 4), start_new_session=True,
                preexec_fn=_pipe_fds(to_browser, from_browser))
        except (OSError, SandboxError) as exc:
            for fd in (to_browser, browser_in, browser_out, from_browser):
                os.close(fd)
            raise BrowserError(f"the browser did not start: {exc}") from None
        os.close(to_browser)
        os.close(from_browser)
        self._in, self._out = browser_in, browser_out
        self.alive = True
        self._reader = threading.Thread(target=self._read, name="browser-reader", daemon=True)
        self._reader.start()
        try:
            self.call("Browser.getVersion", timeout=START_TIMEOUT_S)
        except BrowserError:
            self.close()
            raise

    def _argv(self) -> list[str]:
        command = [self.executable, *CHROMIUM_FLAGS, "about:blank"]
        policy = SandboxPolicy(
            cwd="/tmp", rlimits=Rlimits(cpu_s=1 << 30, memory_mib=self.memory_mib,
                                        max_file_mib=1024, open_files=8192,
                                        max_procs=BROWSER_MAX_PROCS),
            tmpfs=(Tmpfs("/tmp", 1024), Tmpfs("/dev/shm", 1024)),
            env=(("HOME", "/tmp"), ("PATH", "/usr/bin:/bin"), ("LANG", "C.UTF-8"),
                 ("TZ", "UTC"), ("FONTCONFIG_FILE", "/dev/null")),
            user=browser_ids())
        try:
            return bwrap_argv(policy, command, find_sandbox_tools())
        except SandboxError as exc:
            raise BrowserError(f"the browser needs the sandbox: {exc}") from None

    def close(self) -> None:
        """Stop the process; every page of it fails from now on."""
        with self._lock:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            proc, self._proc = self._proc, None
        self.alive = False
        if proc is not None:
            kill_sandbox(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            with contextlib.suppress(OSError):
                os.close(self._in)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    # --- messages -----------------------------------------------------------------------

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, *, reply_to: queue.Queue[Any] | None = None) -> int:
        if not self.alive:
            raise BrowserError("the browser is not running")
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method,
                                   "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        if reply_to is not None:
            with self._lock:
                self._waiting[message_id] = reply_to
        data = json.dumps(message).encode("utf-8") + b"\0"
        with self._write_lock:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._in, view):]
            except OSError:
                self.alive = False
                raise BrowserError("the browser stopped (its pipe is closed)") from None
        return message_id

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
        """A browser-level command (no page): its result, or BrowserError."""
        box: queue.Queue[dict[str, Any] | None] = queue.Queue()
        message_id = self.send(method, params, reply_to=box)
        try:
            reply = box.get(timeout=timeout)
        except queue.Empty:
            raise BrowserError(f"the browser did not answer {method} in {timeout:g} s"
                               ) from None
        finally:
            with self._lock:
                self._waiting.pop(message_id, None)
        return _result(method, reply)

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._out, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                self._route(json.loads(raw))
        self.alive = False
        with contextlib.suppress(OSError):
            os.close(self._out)
        with self._lock:
            waiting = [*self._waiting.values(), *self._sessions.values()]
        for box in waiting:
            box.put(None)

    def _route(self, message: dict[str, Any]) -> None:
        with self._lock:
            session = message.get("sessionId")
            if session is not None:
                box = self._sessions.get(session)
            elif "id" in message:
                box = self._waiting.pop(message["id"], None)
            else:
                box = None
                if message.get("method") == "Target.detachedFromTarget":
                    box = self._sessions.get(message["params"].get("sessionId", ""))
                    message = {"detached": True}
        if box is not None:
            box.put(message)

    # --- pages --------------------------------------------------------------------------

    def new_page(self, handler: Handler, *, viewport: tuple[int, int] = VIEWPORT
                 ) -> BrowserPage:
        """A page in a fresh, isolated browser context; its requests go to `handler`."""
        with self._lock:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            self._pages += 1
        try:
            context = self.call("Target.createBrowserContext",
                                {"disposeOnDetach": True})["browserContextId"]
            target = self.call("Target.createTarget", {"url": "about:blank",
                                                        "browserContextId": context})["targetId"]
            box: queue.Queue[dict[str, Any] | None] = queue.Queue()
            session = self.call("Target.attachToTarget",
                                {"targetId": target, "flatten": True})["sessionId"]
            with self._lock:
                self._sessions[session] = box
            page = BrowserPage(self, context, target, session, box, handler)
            page.setup(viewport)
            return page
        except BrowserError:
            self.page_closed()
            raise

    def forget(self, session: str) -> None:
        with self._lock:
            self._sessions.pop(session, None)

    def page_closed(self) -> None:
        with self._lock:
            self._pages -= 1
            if self._pages > 0 or self.idle_s <= 0:
                return
            self._idle_timer = threading.Timer(self.idle_s, self._close_if_idle)
            self._idle_timer.daemon = True
            self._idle_timer.start()

    def _close_if_idle(self) -> None:
        with self._lock:
            if self._pages != 0:
                return
            # Handed out no more from here (shared_browser starts another), so no page
            # can be opened on a process that is being stopped.
            self.alive = False
        self.close()

    @property
    def pages(self) -> int:
        return self._pages


class BrowserPage:
    """One instance's page: an isolated context, its page, and the thread-confined
    dispatch of that page's messages (commands wait here, and the requests the page makes
    meanwhile are served here, by the instance's handler)."""

    def __init__(self, browser: Browser, context: str, target: str, session: str,
                 box: queue.Queue[dict[str, Any] | None], handler: Handler) -> None:
        self.browser = browser
        self.context = context
        self.target = target
        self.session = session
        self._box = box
        self._handler = handler
        self._loading = False
        self._activity = 0  # navigations and requests seen: what an action may have caused
        self.closed = False

    def setup(self, viewport: tuple[int, int]) -> None:
        width, height = viewport
        self.command("Fetch.enable", {"patterns": [{"urlPattern": "*"}]})
        self.command("Page.enable")
        self.command("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": height, "deviceScaleFactor": 1,
                      "mobile": False})
        self.command("Emulation.setScriptExecutionDisabled", {"value": True})
        # Animation time stands still: a CSS animation or transition (whatever a page's
        # style sheet says, with !important, on ::before, inline) stays at its first frame,
        # so a screenshot is a function of the page, never of when it was taken. The rate
        # holds for every document this page loads from now on.
        self.command("Animation.enable")
        self.command("Animation.setPlaybackRate", {"playbackRate": 0})
        self.command("Emulation.setTimezoneOverride", {"timezoneId": "UTC"})
        self.command("Emulation.setLocaleOverride", {"locale": "en-US"})

    # --- commands -----------------------------------------------------------------------

    def command(self, method: str, params: dict[str, Any] | None = None, *,
                timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
        """Send a command of this page and wait for its answer, serving the page's
        requests meanwhile."""
        if self.closed:
            raise BrowserError("the page is closed")
        message_id = self.browser.send(method, params, self.session)
        deadline = time.monotonic() + timeout
        while True:
            message = self._next(deadline, method)
            if message is None:
                raise BrowserError(f"the browser did not answer {method} in {timeout:g} s")
            if message.get("id") == message_id:
                return _result(method, message)
            self._on_message(message)

    def settle(self, *, window: float = SETTLE_S, timeout: float = COMMAND_TIMEOUT_S) -> None:
        """Wait until what the last action started has finished: up to `window` for a
        navigation to begin, then until the page has stopped loading and been quiet for
        ``SETTLE_S``."""
        deadline = time.monotonic() + timeout
        quiet_until = time.monotonic() + window
        seen = self._activity
        while True:
            now = time.monotonic()
            if self._activity != seen:  # it began: now only until it has quietened
                seen = self._activity
                quiet_until = now + SETTLE_S
            if not self._loading and now >= quiet_until:
                return
            if now >= deadline:
                raise BrowserError(f"the page was still loading after {timeout:g} s")
            message = self._next(deadline if self._loading else quiet_until, "a page load")
            if message is not None:
                self._on_message(message)

    def _next(self, deadline: float, waiting_for: str) -> dict[str, Any] | None:
        try:
            message = self._box.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if message is None or message.get("detached"):
            self.closed = True
            raise BrowserError(f"the browser stopped while waiting for {waiting_for}")
        return message

    def _on_message(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params", {})
        if method == "Fetch.requestPaused":
            self._activity += 1
            self._serve(params)
        elif method == "Page.frameStartedLoading" and params.get("frameId") == self.target:
            self._activity += 1
            self._loading = True
        elif method == "Page.frameStoppedLoading" and params.get("frameId") == self.target:
            self._loading = False
        elif "error" in message:
            log.debug("browser: %s", message["error"])

    def _serve(self, params: dict[str, Any]) -> None:
        request = params["request"]
        url = str(request.get("url", ""))
        if not (url == ORIGIN or url.startswith(ORIGIN + "/")):
            self.browser.send("Fetch.failRequest", {"requestId": params["requestId"],
                                                    "errorReason": "BlockedByClient"},
                              self.session)
            return
        body = request.get("postData", "")
        served = self._handler(Intercepted(str(request.get("method", "GET")), url,
                                           body.encode("utf-8") if body else b""))
        if served.status == 0:
            self.browser.send("Fetch.failRequest", {"requestId": params["requestId"],
                                                    "errorReason": "Failed"}, self.session)
            return
        self.browser.send("Fetch.fulfillRequest", {
            "requestId": params["requestId"], "responseCode": served.status,
            "responseHeaders": [{"name": k, "value": v} for k, v in served.headers],
            "body": base64.b64encode(served.body).decode("ascii")}, self.session)

    @property
    def activity(self) -> int:
        return self._activity

    # --- actions ------------------------------------------------------------------------

    def navigate(self, url: str) -> None:
        result = self.command("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"{url}: {result['errorText']}")
        self.settle()

    def click(self, x: float, y: float, *, navigates: bool = False) -> None:
        """Click at (x, y); `navigates`: the target is a link or button, so wait for the
        navigation it starts (up to ``NAVIGATION_WAIT_S``)."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.command("Input.dispatchMouseEvent",
                         {"type": kind, "x": x, "y": y, "button": "left" if kind != "mouseMoved"
                          else "none", "clickCount": 0 if kind == "mouseMoved" else 1})
        self.settle(window=NAVIGATION_WAIT_S if navigates else SETTLE_S)

    def select_all(self) -> None:
        """Select what the focused field holds (the editing command, no script)."""
        for kind in ("rawKeyDown", "keyUp"):
            self.command("Input.dispatchKeyEvent", {
                "type": kind, "key": "a", "code": "KeyA", "windowsVirtualKeyCode": 65,
                "modifiers": 2, "commands": ["selectAll"] if kind == "rawKeyDown" else []})

    def insert_text(self, text: str) -> None:
        self.command("Input.insertText", {"text": text})
        self.settle(window=0)

    def key(self, key: str, code: str, key_code: int, text: str = "", *,
            navigates: bool = False) -> None:
        down: dict[str, Any] = {"type": "keyDown" if text else "rawKeyDown", "key": key,
                                "code": code, "windowsVirtualKeyCode": key_code}
        if text:
            down["text"] = text
        self.command("Input.dispatchKeyEvent", down)
        self.command("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "code": code,
                                                "windowsVirtualKeyCode": key_code})
        self.settle(window=NAVIGATION_WAIT_S if navigates else SETTLE_S)

    def scroll(self, x: float, y: float, dx: float, dy: float) -> None:
        self.command("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": x, "y": y,
                                                  "deltaX": dx, "deltaY": dy})
        self.settle(window=0.01)

    def screenshot(self) -> bytes:
        data = self.command("Page.captureScreenshot",
                            {"format": "png", "optimizeForSpeed": True})["data"]
        return base64.b64decode(data)

    def accessibility(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = self.command("Accessibility.getFullAXTree")["nodes"]
        return nodes

    def roles_at(self, x: float, y: float) -> list[str]:
        """The accessibility roles of the element at (x, y) and of its ancestors."""
        try:
            node = self.command("DOM.getNodeForLocation", {"x": int(x), "y": int(y)})
            tree = self.command("Accessibility.getPartialAXTree",
                                {"backendNodeId": node["backendNodeId"], "fetchRelatives": True})
        except BrowserError:
            return []
        return [str(n.get("role", {}).get("value", "")) for n in tree["nodes"]]

    def focused_role(self) -> str | None:
        """The accessibility role of the focused element, if one is."""
        for node in self.accessibility():
            for prop in node.get("properties", []):
                if prop.get("name") == "focused" and prop.get("value", {}).get("value"):
                    return str(node.get("role", {}).get("value", ""))
        return None

    def center(self, backend_node: int) -> tuple[float, float] | None:
        """The centre of an element's first box on screen (scrolled into view first): a
        link that wraps onto two lines has two boxes, and the middle of their bounding box
        may be blank. None when it has no box (hidden)."""
        with contextlib.suppress(BrowserError):
            self.command("DOM.scrollIntoViewIfNeeded", {"backendNodeId": backend_node})
        try:
            quads = self.command("DOM.getContentQuads", {"backendNodeId": backend_node})["quads"]
        except BrowserError:
            return None
        boxes = [q for q in quads if _area(q) >= 1.0]
        if not boxes:
            return None
        return (sum(boxes[0][0::2]) / 4, sum(boxes[0][1::2]) / 4)

    def location(self) -> tuple[str, str]:
        """The page's URL and title."""
        history = self.command("Page.getNavigationHistory")
        entry = history["entries"][history["currentIndex"]]
        return str(entry.get("url", "")), str(entry.get("title", ""))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.browser.forget(self.session)
        with contextlib.suppress(BrowserError):
            self.browser.call("Target.disposeBrowserContext", {"browserContextId": self.context},
                              timeout=5)
        self.browser.page_closed()


def _area(quad: list[float]) -> float:
    """The area of a quad (x1, y1, ..., x4, y4), by the shoelace formula."""
    xs, ys = quad[0::2], quad[1::2]
    return abs(sum(xs[i] * ys[(i + 1) % 4] - xs[(i + 1) % 4] * ys[i] for i in range(4))) / 2


def _result(method: str, reply: dict[str, Any] | None) -> dict[str, Any]:
    if reply is None:
        raise BrowserError(f"the browser stopped before it answered {method}")
    if "error" in reply:
        raise BrowserError(f"{method}: {reply['error'].get('message', reply['error'])}")
    result: dict[str, Any] = reply.get("result", {})
    return result


def _pipe_fds(read_end: int, write_end: int) -> Callable[[], None]:
    """In the child, before exec: the DevTools pipe on fds 3 (to read) and 4 (to write)."""
    def place() -> None:
        # Move both out of the way first: either may already sit on 3 or 4.
        high_read, high_write = os.dup(read_end), os.dup(write_end)
        os.dup2(high_read, 3)
        os.dup2(high_write, 4)
    return place


_SHARED: Browser | None = None
_SHARED_LOCK = threading.Lock()


def shared_browser() -> Browser:
    """The process's browser, started on first use (again after it stopped)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or not _SHARED.alive:
            browser = Browser()
            browser.start()
            _SHARED = browser
        return _SHARED
