"""GUI: a click + screenshot through an instance against the same step in a bare Playwright
page on the same HTML; memory per open GUI context; many GUI instances at once.

On the bundled demo world (``lars@7``) and its shop pages (``worldenv/sites/shop.py``). Ours is
``Instance.gui`` on an instance of an ``Environment`` whose browser is one sandboxed
headless Chromium driven over the DevTools pipe (``worldenv.gui.browser.Browser``, a process of
the bench's own, so it is not stopped when idle). The baseline is Playwright (PyPI
``playwright``, its own driver) launching the same Chromium (``find_chromium()``, Debian's
``chromium``) headless, without a sandbox, with the same rendering flags; each page in a
browser context of its own (viewport 1024x768, scale 1, script off, en-US, UTC) whose
requests to ``http://world.local/`` are answered by ``page.route`` with the **bytes our
pages served** (status, headers and body of ``Instance.page`` on a capture instance,
captured on first request, in the discarded warm-up round): the same HTML, style sheet
and font requests (the demo world has no product photos). The baseline never renders a
page; ours renders every request from the instance's databases.

1. **Latency**, interleaved round by round (order rotated, a warm-up round discarded),
   each contender on its own page:

   * **click + screenshot**: alternately the link "1U blank panel" on ``/shop/products``
     (to the product's page) and the nav link "Products" there (back): ours
     ``gui("click", {"name": ..., "role": "link"})`` + ``gui("screenshot")``; Playwright
     ``get_by_role("link", name=..., exact=True).click()`` inside
     ``expect_navigation(wait_until="load")`` + ``page.screenshot(type="png")``.
     **Target: ours <= 1.5x Playwright.** The same clicking at the link's centre (x, y
     from the baseline page's layout): ``gui("click", {"x", "y"})`` against
     ``page.mouse.click``;
   * ``gui("read")`` against ``locator("body").aria_snapshot()`` on the products page;
   * a form submission: "Add to cart" on the product's page (POST, the shop's
     ``add_to_cart`` tool, a redirect, the cart page) + screenshot, against the same
     click answered with the captured redirect and cart page (the cart is emptied and the
     product's page reopened after each, untimed);
   * the first GUI action of an instance: ``gui("open", {"url": "/shop/products"})`` on a
     fresh instance (a browser context, a page, the navigation, a screenshot) against
     ``new_context`` + ``route`` + ``new_page`` + ``goto`` + ``screenshot``;
   * rendering a page in Python: ``Instance.page("GET", ...)`` of the two pages the links
     go to (what ours pays per navigation and the baseline does not);
   * and, in their own interleaved rounds, a browser start: ``Browser().start()``
     (bubblewrap, Chromium, the DevTools pipe's first answer) against
     ``chromium.launch(executable_path=...)``.

   Thin wrappers around ``BrowserPage``'s methods split ours' click step (the
   accessibility tree for the name, the element's box, the mouse events, the wait for the
   page load, the PNG, the URL and title); the rest is recording and Python.

2. **Memory per open GUI context**: N instances with one page each (``gui open`` of the
   products page), N = 0, 1, 8, 32; after a second to settle,
   the PSS summed over the browser's process tree (every descendant of ``Browser.pid``,
   the bubblewrap process, found by walking ``/proc``; ``smaps_rollup``, RSS where it is
   unreadable), and the same for Playwright's browser (the descendants of its driver)
   with N contexts of one page each. Only one browser is alive while it is measured.
   MiB per context = the least-squares slope over N.

3. **Concurrent GUI instances**: first a control, one instance alone: each of the 12
   product links of ``/shop/products`` clicked by name (does the click reach the page
   without load?). Then 32 threads, each opening its own instance and
   doing: ``gui open`` (its first action), ``read``, a click on a product link (one the
   control reached), "Add to cart", "Products", ``gui open`` of a product of its own,
   "Add to cart", a screenshot, then checking that its cart holds the world's cart plus
   exactly its own two additions, and closing. Errors (error results, wrong pages,
   exceptions, a wrong cart) must be 0; after a click that shows the wrong page the thread
   polls the page's URL for up to 15 s (a navigation that came late, or none), counts the
   error by kind and reopens the page it should be on. Wall time (those waits included),
   per-step latency under load (p50 / p95) against the same step's sequential median
   from 1, and the browser's peak PSS (sampled every second).

Needs Playwright (``pip install -e '.[bench]'``; its browsers are not downloaded:
``playwright install`` is never needed, the system Chromium is launched). ``--quick`` is
a smoke path without it: our browser's start and four actions on one instance, no
baseline.

    .venv/bin/python bench/bench_gui.py [--quick] [--rounds R] [--starts S]
                                        [--threads T] [--contexts 1,8,32]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from _common import (
    REPO,
    Report,
    Row,
    bench_parser,
    clock,
    emit,
    fmt_s,
    median,
    remove,
    scratch_dir,
    setup_run,
    spread,
)

DEMO = REPO / "packs" / "demo" / "world" / "lars.jsonl"
REF = "lars@7"
B = "gui"
TARGET_RATIO = 1.5
ORIGIN = "http://world.local"
LIST = "/shop/products"
PRODUCT_ID = 69
PRODUCT = f"/shop/products/{PRODUCT_ID}"
PRODUCT_NAME = "1U blank panel"
CART = "/shop/cart"
VIEWPORT = {"width": 1024, "height": 768}
MIB = 1 << 20
CART_WRONG = "the cart is not the world's plus the instance's own additions"
LATE_S = 15.0  # how long a concurrent agent waits for a navigation its click did not show
# Our flags that only make sense for our own launch (Playwright sets its own pipe,
# profile, sandbox and headless flags; its route answers before any network).
NOT_FOR_PLAYWRIGHT = ("--headless", "--no-sandbox", "--remote-debugging-pipe",
                      "--user-data-dir", "--host-resolver-rules", "--proxy-server",
                      "--proxy-bypass-list")


# --- process memory -------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        found.setdefault(ppid, []).append(int(entry))
    return found


def descendants(root: int) -> list[int]:
    """`root` and every process under it (walking /proc: the sandbox's processes have
    their own pid namespace, but /proc here shows them with ours)."""
    children = _children()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def tree_memory(pids: list[int]) -> dict[str, Any]:
    """PSS (from smaps_rollup; RSS where it cannot be read) and RSS summed over `pids`."""
    pss = rss = 0
    estimated = 0
    counted = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            continue  # gone meanwhile
        vm = next((line for line in status.splitlines() if line.startswith("VmRSS:")), None)
        if vm is None:  # a zombie, or a kernel thread
            continue
        counted += 1
        rss_kb = int(vm.split()[1])
        rss += rss_kb * 1024
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                line = next(x for x in f if x.startswith("Pss:"))
            pss += int(line.split()[1]) * 1024
        except (OSError, StopIteration):
            pss += rss_kb * 1024
            estimated += 1
    return {"pss": pss, "rss": rss, "processes": counted, "pss_from_rss": estimated}


def slope(points: list[tuple[float, float]]) -> float:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def fmt_mib(n: float) -> str:
    return f"{n / MIB:,.1f} MiB"


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]


# --- where ours' time goes ----------------------------------------------------------------


class Probe:
    """Thin timing wrappers around BrowserPage's methods, counted only while `active`."""

    METHODS = ("accessibility", "center", "click", "settle", "screenshot", "location",
               "navigate", "_serve")

    def __init__(self) -> None:
        self.active = False
        self.seconds: dict[str, float] = {}
        self._saved: dict[str, Any] = {}

    def install(self) -> None:
        from worldenv.gui.browser import BrowserPage

        for name in self.METHODS:
            original = getattr(BrowserPage, name)
            self._saved[name] = original
            setattr(BrowserPage, name, self._wrap(name, original))

    def uninstall(self) -> None:
        from worldenv.gui.browser import BrowserPage

        for name, original in self._saved.items():
            setattr(BrowserPage, name, original)
        self._saved = {}

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        probe = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not probe.active:
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                probe.seconds[name] = probe.seconds.get(name, 0.0) + (
                    time.perf_counter() - t0)
                probe.seconds[f"{name} calls"] = probe.seconds.get(f"{name} calls", 0) + 1
        return timed

    @contextmanager
    def counting(self) -> Iterator[dict[str, float]]:
        self.seconds = {}
        self.active = True
        try:
            yield self.seconds
        finally:
            self.active = False


# --- the baseline's pages -------------------------------------------------------------------


class Canned:
    """Answers a Playwright page's requests with the bytes our pages served: each (method,
    URL, body) is asked of the capture instance once, then replayed.

    ``page.route`` does not see the request a redirect leads to (Playwright documents it:
    the handler is called for the first URL only), so the browser is launched with
    world.local resolving to a loopback server that answers those from the same cache."""

    def __init__(self, capture: Any) -> None:
        import http.server

        self.capture = capture
        self.cache: dict[tuple[str, str, bytes], tuple[int, dict[str, str], bytes]] = {}
        self.misses = 0
        self.other = 0
        self.loopback = 0
        self._lock = threading.Lock()
        canned = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                canned.loopback += 1
                status, headers, body = canned.answer("GET", ORIGIN + self.path, b"")
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="canned-loopback").start()

    def answer(self, method: str, url: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        key = (method, url, body)
        with self._lock:
            hit = self.cache.get(key)
            if hit is None:
                self.misses += 1
                r = self.capture.page(method, url, body)
                hit = (r.status, dict(r.headers()), r.body)
                self.cache[key] = hit
        return hit

    def handle(self, route: Any) -> None:
        request = route.request
        if not (request.url == ORIGIN or request.url.startswith(ORIGIN + "/")):
            self.other += 1
            route.abort("blockedbyclient")
            return
        status, headers, body = self.answer(request.method, request.url,
                                            request.post_data_buffer or b"")
        route.fulfill(status=status, headers=headers, body=body)

    def launch_args(self) -> list[str]:
        """Our rendering flags, and world.local on the loopback server."""
        from worldenv.gui.browser import CHROMIUM_FLAGS

        return [*(f for f in CHROMIUM_FLAGS if not f.startswith(NOT_FOR_PLAYWRIGHT)),
                f"--host-resolver-rules=MAP world.local 127.0.0.1:{self.port}"]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def context_options() -> dict[str, Any]:
    return {"viewport": VIEWPORT, "device_scale_factor": 1, "java_script_enabled": False,
            "locale": "en-US", "timezone_id": "UTC"}


def pw_page(browser: Any, canned: Canned) -> Any:
    context = browser.new_context(**context_options())
    context.route("**/*", canned.handle)
    return context.new_page()


# --- contenders --------------------------------------------------------------------------


class Failures:
    def __init__(self) -> None:
        self.items: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.items.append(what[:400])
        return ok


def next_link(at: str) -> tuple[str, str]:
    """The link the navigation step clicks on page `at`, and where it goes."""
    return (PRODUCT_NAME, PRODUCT) if at == LIST else ("Products", LIST)


class OursNav:
    """Click + screenshot through Instance.gui, alternating between the two pages."""

    def __init__(self, inst: Any, fails: Failures, points: dict[str, tuple[int, int]] | None,
                 probe: Probe | None = None) -> None:
        self.inst, self.fails, self.points, self.probe = inst, fails, points, probe
        self.split: list[tuple[float, float]] = []  # (click, screenshot) seconds
        self.parts: list[dict[str, float]] = []
        r = inst.gui("open", {"url": LIST})
        fails.check(not r.is_error and r.url == LIST, f"ours: open {LIST}: {r.text[:200]}")
        self.at = LIST

    def step(self) -> float:
        name, goes = next_link(self.at)
        if self.points is None:
            args: dict[str, Any] = {"name": name, "role": "link"}
        else:
            x, y = self.points[self.at]
            args = {"x": x, "y": y}
        parts: dict[str, float] = {}
        if self.probe is not None:
            with self.probe.counting() as parts:
                t0 = time.perf_counter()
                clicked = self.inst.gui("click", args)
                t1 = time.perf_counter()
                shot = self.inst.gui("screenshot")
                t2 = time.perf_counter()
        else:
            t0 = time.perf_counter()
            clicked = self.inst.gui("click", args)
            t1 = time.perf_counter()
            shot = self.inst.gui("screenshot")
            t2 = time.perf_counter()
        ok = self.fails.check(not clicked.is_error and clicked.url == goes,
                              f"ours: click {args} on {self.at}: {clicked.url} "
                              f"{clicked.text[:200]}")
        ok = self.fails.check(not shot.is_error and bool(shot.image),
                              "ours: screenshot failed") and ok
        self.at = goes
        if not ok:  # start again from the list (untimed; the step is not counted)
            self.inst.gui("open", {"url": LIST})
            self.at = LIST
            return t2 - t0
        self.split.append((t1 - t0, t2 - t1))
        if self.probe is not None:
            parts = {k: parts.get(k, 0.0) for k in (*Probe.METHODS, "_serve calls")}
            parts["step"] = t2 - t0
            # click() includes the wait for the load (settle); center() the scroll and box
            parts["mouse"] = parts["click"] - parts["settle"]
            parts["rest"] = parts["step"] - (parts["accessibility"] + parts["center"]
                                             + parts["click"] + parts["screenshot"]
                                             + parts["location"])
            self.parts.append(parts)
        return t2 - t0


class PwNav:
    """The same step in a Playwright page."""

    def __init__(self, page: Any, fails: Failures,
                 points: dict[str, tuple[int, int]] | None) -> None:
        self.page, self.fails, self.points = page, fails, points
        self.split: list[tuple[float, float]] = []
        page.goto(ORIGIN + LIST)
        self.at = LIST

    def step(self) -> float:
        name, goes = next_link(self.at)
        page = self.page
        try:
            t0 = time.perf_counter()
            with page.expect_navigation(wait_until="load"):
                if self.points is None:
                    page.get_by_role("link", name=name, exact=True).first.click()
                else:
                    page.mouse.click(*self.points[self.at])
            t1 = time.perf_counter()
            png = page.screenshot(type="png")
            t2 = time.perf_counter()
            ok = self.fails.check(page.url == ORIGIN + goes and png.startswith(b"\x89PNG"),
                                  f"playwright: click {name} on {self.at}: {page.url}")
        except Exception as exc:  # a Playwright error: counted, and start again
            self.fails.check(False, f"playwright: click {name} on {self.at}: {exc}")
            ok = False
            t0 = t1 = t2 = 0.0
        self.at = goes
        if not ok:
            page.goto(ORIGIN + LIST)
            self.at = LIST
            return t2 - t0
        self.split.append((t1 - t0, t2 - t1))
        return t2 - t0


def link_points(browser: Any, canned: Canned) -> dict[str, tuple[int, int]]:
    """The centre of the link each page's step clicks, from the baseline's layout (the
    same HTML, font and viewport give ours the same layout; the clicks check where they
    land)."""
    page = pw_page(browser, canned)
    points = {}
    for at in (LIST, PRODUCT):
        page.goto(ORIGIN + at)
        box = page.get_by_role("link", name=next_link(at)[0], exact=True).first.bounding_box()
        points[at] = (round(box["x"] + box["width"] / 2), round(box["y"] + box["height"] / 2))
    page.context.close()
    return points


# --- 1. latency ----------------------------------------------------------------------------


def latency(a: argparse.Namespace, env: Any, pw: Any, browser: Any, capture: Any,
            canned: Canned, report: Report) -> dict[str, float]:
    fails = Failures()
    probe = Probe()
    probe.install()
    points = link_points(browser, canned)
    ours_name = OursNav(env.open(REF), fails, None, probe)
    ours_xy = OursNav(env.open(REF), fails, points)
    pw_name = PwNav(pw_page(browser, canned), fails, None)
    pw_xy = PwNav(pw_page(browser, canned), fails, points)

    reader = env.open(REF)
    r = reader.gui("open", {"url": LIST})
    fails.check(not r.is_error, f"ours: open for read: {r.text[:200]}")
    pw_reader = pw_page(browser, canned)
    pw_reader.goto(ORIGIN + LIST)
    read_sizes: dict[str, int] = {}

    def ours_read() -> float:
        t0 = time.perf_counter()
        got = reader.gui("read")
        elapsed = time.perf_counter() - t0
        fails.check(not got.is_error and PRODUCT_NAME in got.text, "ours: read failed")
        read_sizes["ours"] = len(got.text)
        return elapsed

    def pw_read() -> float:
        t0 = time.perf_counter()
        text = pw_reader.locator("body").aria_snapshot()
        elapsed = time.perf_counter() - t0
        fails.check(PRODUCT_NAME in text, "playwright: aria_snapshot failed")
        read_sizes["playwright"] = len(text)
        return elapsed

    former = env.open(REF)
    r = former.gui("open", {"url": PRODUCT})
    fails.check(not r.is_error, f"ours: open {PRODUCT}: {r.text[:200]}")
    pw_former = pw_page(browser, canned)
    pw_former.goto(ORIGIN + PRODUCT)

    def ours_form() -> float:
        t0 = time.perf_counter()
        clicked = former.gui("click", {"name": "Add to cart", "role": "button"})
        shot = former.gui("screenshot")
        elapsed = time.perf_counter() - t0
        fails.check(not clicked.is_error and clicked.url == CART and bool(shot.image),
                    f"ours: add to cart: {clicked.url} {clicked.text[:200]}")
        removed = former.call_tool("shop_remove_from_cart", {"product_id": PRODUCT_ID})
        fails.check(not removed.is_error, f"ours: remove from cart: {removed.text[:200]}")
        back = former.gui("open", {"url": PRODUCT})
        fails.check(not back.is_error, "ours: reopen the product")
        return elapsed

    def pw_form() -> float:
        try:
            t0 = time.perf_counter()
            with pw_former.expect_navigation(wait_until="load"):
                pw_former.get_by_role("button", name="Add to cart", exact=True).click()
            png = pw_former.screenshot(type="png")
            elapsed = time.perf_counter() - t0
            fails.check(pw_former.url == ORIGIN + CART and bool(png),
                        f"playwright: add to cart: {pw_former.url}")
        finally:
            pw_former.goto(ORIGIN + PRODUCT)
        return elapsed

    def ours_first() -> float:
        inst = env.open(REF)
        try:
            t0 = time.perf_counter()
            got = inst.gui("open", {"url": LIST})
            elapsed = time.perf_counter() - t0
            fails.check(not got.is_error and got.url == LIST and bool(got.image),
                        f"ours: first open: {got.text[:200]}")
        finally:
            inst.close()
        return elapsed

    def pw_first() -> float:
        t0 = time.perf_counter()
        page = pw_page(browser, canned)
        try:
            page.goto(ORIGIN + LIST)
            png = page.screenshot(type="png")
            elapsed = time.perf_counter() - t0
            fails.check(page.url == ORIGIN + LIST and bool(png), "playwright: first open")
        finally:
            page.context.close()
        return elapsed

    def render() -> float:
        t0 = time.perf_counter()
        one = capture.page("GET", LIST)
        two = capture.page("GET", PRODUCT)
        elapsed = time.perf_counter() - t0
        fails.check(one.status == two.status == 200, "ours: render failed")
        return elapsed / 2

    contenders: dict[str, Callable[[], float]] = {
        "ours_click": ours_name.step, "pw_click": pw_name.step,
        "ours_click_xy": ours_xy.step, "pw_click_xy": pw_xy.step,
        "ours_read": ours_read, "pw_read": pw_read,
        "ours_form": ours_form, "pw_form": pw_form,
        "ours_first": ours_first, "pw_first": pw_first,
        "render": render,
    }
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    failed: Counter[str] = Counter()
    misses_after_warmup = 0
    for r_ in range(a.rounds + 1):
        if r_ == 1:
            misses_after_warmup = canned.misses
            for nav in (ours_name, ours_xy, pw_name, pw_xy):
                nav.split.clear()
            ours_name.parts.clear()
        shift = r_ % len(names)
        for name in names[shift:] + names[:shift]:
            before = len(fails.items)
            try:
                took = contenders[name]()
            except Exception as exc:  # counted; the contender starts again next round
                fails.check(False, f"{name}: {type(exc).__name__}: {exc}")
            if len(fails.items) > before:  # a failed step's time is not counted
                fails.items[before:] = [f"round {r_}: {x}" for x in fails.items[before:]]
                failed[name] += 1
            elif r_:
                times[name].append(took)
    probe.uninstall()
    late_misses = canned.misses - misses_after_warmup
    for inst in (ours_name.inst, ours_xy.inst, reader, former):
        inst.close()
    for page in (pw_name.page, pw_xy.page, pw_reader, pw_former):
        page.context.close()

    med = {k: median(v) if v else float("nan") for k, v in times.items()}
    ours, base = med["ours_click"], med["pw_click"]
    parts = {k: median([p[k] for p in ours_name.parts]) if ours_name.parts
             else float("nan") for k in (*Probe.METHODS, "_serve calls", "step", "mouse",
                                         "rest")}

    def res(name: str) -> str:
        """The median, and how many steps failed (warm-up round included)."""
        lost = failed[name]
        return fmt_s(med[name]) + (f" ({lost} of {a.rounds + 1} failed)" if lost else "")

    served_per_step = parts["_serve calls"]
    nav_bytes = sum(len(body) for (m, u, _b), (_st, _h, body) in canned.cache.items()
                    if m == "GET" and (u.endswith(PRODUCT) or "/_static/" in u))
    o_click = median([s[0] for s in ours_name.split])
    o_shot = median([s[1] for s in ours_name.split])
    p_click = median([s[0] for s in pw_name.split])
    p_shot = median([s[1] for s in pw_name.split])
    report.rows += [
        Row(B, "click + screenshot of a link (by accessible name: the link to a product, "
               "then back), Instance.gui", res("ours_click"),
            res("pw_click") + " Playwright, same HTML", f"{ours / base:.2f}x Playwright",
            f"<= {TARGET_RATIO}x", ours / base <= TARGET_RATIO),
        Row(B, "  of ours: accessibility tree (find by name) / scroll + box / mouse events / "
               "wait for the load / PNG / URL + title / rest (recording, Python)",
            " / ".join(fmt_s(parts[k]) for k in ("accessibility", "center", "mouse", "settle",
                                                 "screenshot", "location", "rest"))),
        Row(B, "  of the wait for the load: answering the page's requests (render, base64, "
               "the pipe)", f"{fmt_s(parts['_serve'])} for {served_per_step:.1f} requests",
            "", "", ""),
        Row(B, "  click / screenshot action, each (ours' click action takes its screenshot; "
               "the screenshot action is then a cached copy)",
            f"{fmt_s(o_click)} / {fmt_s(o_shot)}",
            f"{fmt_s(p_click)} / {fmt_s(p_shot)} Playwright"),
        Row(B, "  the same clicking at the link's x, y", res("ours_click_xy"),
            res("pw_click_xy") + " Playwright mouse.click",
            f"{med['ours_click_xy'] / med['pw_click_xy']:.2f}x Playwright"),
        Row(B, "  rendering the page a click lands on (Instance.page; ours renders every "
               "navigation, the baseline replays captured bytes)", res("render")),
        Row(B, "gui read of the products page (accessibility text, elements numbered)",
            res("ours_read"), res("pw_read") + " Playwright aria_snapshot",
            f"{med['ours_read'] / med['pw_read']:.2f}x Playwright"),
        Row(B, "form submission click (Add to cart: POST, the shop's tool, redirect, cart "
               "page) + screenshot", res("ours_form"),
            res("pw_form") + " Playwright, captured answers",
            f"{med['ours_form'] / med['pw_form']:.2f}x Playwright"),
        Row(B, "first GUI action of an instance (browser context + page + open "
               "/shop/products + screenshot)", res("ours_first"),
            res("pw_first") + " Playwright new_context + goto + screenshot",
            f"{med['ours_first'] / med['pw_first']:.2f}x Playwright"),
    ]
    report.data["latency"] = {
        "seconds": times, "medians_s": med, "spread": {k: spread(v) for k, v in times.items()},
        "ours_click_parts_s": parts,
        "bytes_of_a_product_page_load": nav_bytes, "ours_split_s": ours_name.split,
        "playwright_split_s": pw_name.split, "link_points": points,
        "read_chars": read_sizes, "failures": fails.items[:30], "failed": dict(failed),
        "canned_urls": sorted(f"{m} {u}" for m, u, _b in canned.cache),
        "canned_misses_after_warmup": late_misses, "other_origin_requests": canned.other,
        "loopback_requests": canned.loopback}
    if fails.items:
        report.notes.append(f"WARNING: {len(fails.items)} latency steps went wrong: "
                            f"{fails.items[:3]}")
    if late_misses:
        report.notes.append(f"WARNING: the baseline asked the capture instance {late_misses} "
                            "times after the warm-up round (its timings include a render)")
    report.notes.append(
        f"GUI latency: medians of {a.rounds} interleaved rounds (warm-up discarded); spread "
        "(min..max s): " + "; ".join(f"{k} {v}" for k, v in
                                     report.data["latency"]["spread"].items()) + ".")
    return med


def starts(a: argparse.Namespace, pw: Any, args: list[str], report: Report) -> None:
    from worldenv.gui.browser import Browser, find_chromium

    executable = find_chromium()
    fails = Failures()

    def ours() -> float:
        browser = Browser(idle_s=0)
        t0 = time.perf_counter()
        browser.start()
        elapsed = time.perf_counter() - t0
        fails.check(browser.alive, "ours: the browser did not start")
        browser.close()
        return elapsed

    def theirs() -> float:
        t0 = time.perf_counter()
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=args)
        elapsed = time.perf_counter() - t0
        browser.close()
        return elapsed

    names = ["ours", "playwright"]
    fns = {"ours": ours, "playwright": theirs}
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.starts + 1):
        for name in names[r % 2:] + names[:r % 2]:
            took = fns[name]()
            if r:
                times[name].append(took)
    o, p = median(times["ours"]), median(times["playwright"])
    report.rows.append(Row(
        B, "browser start (ours: bubblewrap + Chromium + the DevTools pipe's first answer)",
        fmt_s(o), fmt_s(p) + " Playwright chromium.launch, no sandbox", f"{o / p:.2f}x"))
    report.data["starts"] = {"seconds": times, "failures": fails.items}
    if fails.items:
        report.notes.append(f"WARNING: browser starts failed: {fails.items[:3]}")


# --- 2. memory ----------------------------------------------------------------------------


def playwright_driver() -> int | None:
    """The Playwright driver (node) this process started: its browsers are under it."""
    for pid in _children().get(os.getpid(), []):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"playwright" in f.read():
                    return pid
        except OSError:
            continue
    return None


def memory(a: argparse.Namespace, worlds: Any, pw: Any, report: Report) -> None:
    from worldenv.gui.browser import Browser, find_chromium
    from worldenv.instances.instance import Environment

    settle_s = 1.0
    fails = Failures()
    ours_points: list[tuple[int, dict[str, Any]]] = []
    browser = Browser(idle_s=0)
    browser.start()
    env = Environment(worlds, browser=lambda: browser)
    root = browser.pid
    assert root is not None
    time.sleep(settle_s)
    ours_points.append((0, tree_memory(descendants(root))))
    for n in a.contexts:
        insts = [env.open(REF) for _ in range(n)]
        for inst in insts:
            r = inst.gui("open", {"url": LIST})
            fails.check(not r.is_error, f"ours: open: {r.text[:200]}")
        time.sleep(settle_s)
        ours_points.append((n, tree_memory(descendants(root))))
        for inst in insts:
            inst.close()
        time.sleep(settle_s)
    browser.close()

    theirs_points: list[tuple[int, dict[str, Any]]] = []
    canned_capture = env.open(REF)  # pages only: it needs no browser
    canned = Canned(canned_capture)
    pw_browser = pw.chromium.launch(executable_path=find_chromium(), headless=True,
                                    args=canned.launch_args())
    driver = playwright_driver()

    def theirs_tree() -> dict[str, Any]:
        if driver is None:
            return {"pss": 0, "rss": 0, "processes": 0, "pss_from_rss": 0}
        return tree_memory([p for p in descendants(driver) if p != driver])

    warm = pw_page(pw_browser, canned)  # fill the canned answers before measuring
    warm.goto(ORIGIN + LIST)
    warm.context.close()
    time.sleep(settle_s)
    theirs_points.append((0, theirs_tree()))
    for n in a.contexts:
        pages = [pw_page(pw_browser, canned) for _ in range(n)]
        for page in pages:
            page.goto(ORIGIN + LIST)
        time.sleep(settle_s)
        theirs_points.append((n, theirs_tree()))
        for page in pages:
            page.context.close()
        time.sleep(settle_s)
    pw_browser.close()
    canned.close()
    canned_capture.close()

    ours_slope = slope([(n, m["pss"]) for n, m in ours_points])
    theirs_slope = slope([(n, m["pss"]) for n, m in theirs_points])
    ours_rss = slope([(n, m["rss"]) for n, m in ours_points])
    theirs_rss = slope([(n, m["rss"]) for n, m in theirs_points])
    top_o, top_t = ours_points[-1], theirs_points[-1]
    ns = ", ".join(str(n) for n, _m in ours_points)
    report.rows += [
        Row(B, f"memory per open GUI context (slope of the browser's PSS over N = {ns} "
               "pages)", fmt_mib(ours_slope), fmt_mib(theirs_slope) + " Playwright",
            f"{ours_slope / theirs_slope:.2f}x" if theirs_slope else ""),
        Row(B, "  the same from summed RSS (counts shared pages in every process)",
            fmt_mib(ours_rss), fmt_mib(theirs_rss) + " Playwright",
            f"{ours_rss / theirs_rss:.2f}x" if theirs_rss else ""),
        Row(B, f"  the browser with no page / with {top_o[0]} pages: PSS (processes)",
            f"{fmt_mib(ours_points[0][1]['pss'])} ({ours_points[0][1]['processes']}) / "
            f"{fmt_mib(top_o[1]['pss'])} ({top_o[1]['processes']})",
            f"{fmt_mib(theirs_points[0][1]['pss'])} ({theirs_points[0][1]['processes']}) / "
            f"{fmt_mib(top_t[1]['pss'])} ({top_t[1]['processes']}) Playwright"),
    ]
    report.data["memory"] = {"ours": ours_points, "playwright": theirs_points,
                             "slope_pss_bytes": {"ours": ours_slope, "playwright": theirs_slope},
                             "slope_rss_bytes": {"ours": ours_rss, "playwright": theirs_rss},
                             "failures": fails.items}
    if driver is None:
        report.notes.append("WARNING: Playwright's driver process was not found: its "
                            "memory is not measured")
    if any(m["pss_from_rss"] for _n, m in ours_points + theirs_points):
        report.notes.append("GUI memory: some processes' smaps_rollup could not be read; "
                            "their RSS stands in for their PSS")
    if fails.items:
        report.notes.append(f"WARNING: memory: {fails.items[:3]}")


# --- 3. concurrent instances ----------------------------------------------------------------


def error_kind(action: str, got: Any, goes: str) -> str:
    """What kind of failure a GUI result is, for counting (numbers and names dropped)."""
    if "the browser failed:" in got.text:
        reason = got.text.split("the browser failed:", 1)[1].strip().split("\n")[0]
        return "browser failed: " + re.sub(r"\d+(\.\d+)? s\b", "N s", reason)[:90]
    if got.is_error:
        note = got.text.split("\n", 1)[1] if "\n" in got.text else got.text
        return "error result: " + re.sub(r"'[^']*'|\"[^\"]*\"", "...", note)[:60]
    if got.url != goes:
        return f"{action} returned, but the page is not the one it leads to"
    return "no screenshot"


def concurrent(a: argparse.Namespace, worlds: Any, med: dict[str, float],
               report: Report) -> None:
    from worldenv.gui.browser import Browser
    from worldenv.instances.instance import Environment

    browser = Browser(idle_s=0)
    browser.start()
    env = Environment(worlds, browser=lambda: browser)
    probe = env.open(REF)
    page_one = probe.site_rows(
        "shop", "SELECT id, name FROM products WHERE is_active = 1 ORDER BY name, id "
                "LIMIT 12", ())
    own = probe.site_rows(
        "shop", "SELECT id FROM products WHERE is_active = 1 AND stock >= 2 ORDER BY id", ())
    initial = Counter({r["product_id"]: r["quantity"] for r in probe.site_rows(
        "shop", "SELECT product_id, quantity FROM cart_items WHERE user_id = 1", ())})
    # The control, one instance alone: each link of page 1 clicked by name.
    missed = []
    for row in page_one:
        r = probe.gui("open", {"url": LIST})
        got = probe.gui("click", {"name": row["name"], "role": "link"})
        if r.is_error or got.is_error or got.url != f"/shop/products/{row['id']}":
            missed.append(str(row["name"]))
    probe.close()
    report.rows.append(Row(
        B, f"control, one instance alone, no load: the {len(page_one)} product links of "
           "/shop/products clicked by name", f"{len(page_one) - len(missed)} of "
        f"{len(page_one)} reached their page" + (f"; missed: {', '.join(missed)}"
                                                 if missed else "")))
    # The threads click links the control reached, so an error below is the load's.
    reachable = [row for row in page_one if row["name"] not in missed] or page_one
    n = a.threads
    if len(own) < n:
        raise SystemExit(f"the demo world has only {len(own)} products for {n} threads")

    barrier = threading.Barrier(n + 1)
    lock = threading.Lock()
    steps: dict[str, list[float]] = {}
    errors: list[tuple[str, str]] = []
    actions = [0]

    def agent(k: int) -> None:
        mine: list[tuple[str, float]] = []
        wrong: list[tuple[str, str]] = []  # (kind of error, what happened)
        count = 0
        link = reachable[k % len(reachable)]
        product = int(own[k]["id"])

        def timed(kind: str, fn: Callable[[], Any]) -> Any:
            t0 = time.perf_counter()
            out = fn()
            mine.append((kind, time.perf_counter() - t0))
            return out

        def gui(kind: str, action: str, args: dict[str, Any], goes: str) -> None:
            nonlocal count
            count += 1
            got = timed(kind, lambda: inst.gui(action, args))
            started = time.perf_counter()
            try:
                check(kind, action, args, goes, got)
            finally:
                mine.append(("(waiting after errors)", time.perf_counter() - started))

        def check(kind: str, action: str, args: dict[str, Any], goes: str, got: Any) -> None:
            if not got.is_error and got.url != goes and got.image:
                # Did the page get there after the action returned? (a screenshot action
                # re-reads the page's URL; untimed)
                until = time.monotonic() + LATE_S
                while time.monotonic() < until:
                    time.sleep(0.2)
                    later = inst.gui("screenshot")
                    if later.url == goes:
                        wrong.append((f"{action} returned before its navigation began "
                                      "(the page got there later)",
                                      f"#{k} {action} {args}: {got.url}"))
                        return
                wrong.append((f"{action} did not navigate (the page was not there "
                              f"{LATE_S:g} s later either)", f"#{k} {action} {args}: "
                              f"{got.url}"))
                inst.gui("open", {"url": goes})  # go on from where it should be (untimed)
            elif got.is_error or got.url != goes or not got.image:
                wrong.append((error_kind(action, got, goes),
                              f"#{k} {action} {args}: {got.url} {got.text[:160]}"))
                inst.gui("open", {"url": goes})

        barrier.wait()
        inst = None
        try:
            inst = timed("open instance (Environment.open)", lambda: env.open(REF))
            gui("first GUI action (open /shop/products)", "open", {"url": LIST}, LIST)
            gui("read", "read", {}, LIST)
            gui("click (link) + screenshot", "click", {"name": link["name"], "role": "link"},
                f"/shop/products/{link['id']}")
            gui("form click (add to cart)", "click", {"name": "Add to cart",
                                                      "role": "button"}, CART)
            gui("click (link) + screenshot", "click", {"name": "Products", "role": "link"},
                LIST)
            gui("open a page", "open", {"url": f"/shop/products/{product}"},
                f"/shop/products/{product}")
            gui("form click (add to cart)", "click", {"name": "Add to cart",
                                                      "role": "button"}, CART)
            gui("screenshot", "screenshot", {}, CART)
            cart = Counter({r["product_id"]: r["quantity"] for r in inst.site_rows(
                "shop", "SELECT product_id, quantity FROM cart_items WHERE user_id = 1", ())})
            expected = initial + Counter([int(link["id"]), product])
            if cart != expected:
                wrong.append((CART_WRONG,
                              f"#{k} cart {dict(cart)} != {dict(expected)}"))
        except Exception as exc:  # every failure counts, none stops the others
            wrong.append((f"exception {type(exc).__name__}", f"#{k} {exc}"))
        finally:
            if inst is not None:
                try:
                    timed("close instance", inst.close)
                except Exception as exc:
                    wrong.append((f"close: {type(exc).__name__}", f"#{k} {exc}"))
        with lock:
            for kind, s in mine:
                steps.setdefault(kind, []).append(s)
            errors.extend(wrong)
            actions[0] += count

    peak: dict[str, Any] = {"pss": 0}
    stop = threading.Event()
    root = browser.pid
    assert root is not None

    def sample() -> None:
        while not stop.wait(1.0):
            m = tree_memory(descendants(root))
            if m["pss"] > peak["pss"]:
                peak.update(m)

    threads = [threading.Thread(target=agent, args=(k,), name=f"gui-agent-{k}")
               for k in range(n)]
    for t in threads:
        t.start()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    browser.close()

    sequential = {"first GUI action (open /shop/products)": med["ours_first"],
                  "read": med["ours_read"], "click (link) + screenshot": med["ours_click"],
                  "form click (add to cart)": med["ours_form"]}
    kinds = Counter(kind for kind, _what in errors)
    bad_carts = kinds[CART_WRONG]
    report.rows.append(Row(
        B, f"{n} concurrent GUI instances (a thread each: open, read, 3 clicks, 2 forms, an "
           "open, a screenshot, close): errors", f"{len(errors) - bad_carts} of {actions[0]} "
        f"actions; {n - bad_carts} of {n} carts hold exactly the world's cart plus the "
        "instance's own additions", "", "", "0 errors, own carts only", not errors))
    report.rows += [Row(B, f"  errors: {kind}", str(c)) for kind, c in kinds.most_common()]
    waited = steps.pop("(waiting after errors)", [])
    report.rows.append(Row(B, "  wall time, all threads (waits after errors included: "
                              "to see whether a page got there late, up to "
                              f"{LATE_S:g} s)", fmt_s(wall), f"{fmt_s(wall / n)} per instance",
                           f"waits: {fmt_s(sum(waited) / n)} per instance"))
    for kind, xs in steps.items():
        base = sequential.get(kind)
        report.rows.append(Row(
            B, f"  under load: {kind}, p50 / p95", f"{fmt_s(median(xs))} / "
            f"{fmt_s(percentile(xs, 0.95))}", "" if base is None else fmt_s(base) +
            " alone (sequential median)", "" if base is None else f"{median(xs) / base:.1f}x"))
    if peak.get("processes"):
        report.rows.append(Row(B, "  the browser's peak PSS during the run (processes)",
                               f"{fmt_mib(peak['pss'])} ({peak['processes']})"))
    report.data["concurrent"] = {"threads": n, "wall_s": wall, "steps_s": steps,
                                 "errors_by_kind": dict(kinds),
                                 "errors": [f"{kind}: {what}" for kind, what in errors],
                                 "control_missed": missed,
                                 "actions": actions[0], "peak": peak}
    if errors:
        report.notes.append(
            f"WARNING: {len(errors)} errors with {n} concurrent GUI instances (after each, "
            "the thread reopened the page it should be on and went on): " + "; ".join(
                f"{c}x {kind}" for kind, c in kinds.most_common()) + f". E.g. {errors[0][1]}")


# --- main ----------------------------------------------------------------------------------


def run(a: argparse.Namespace) -> Report:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("bench_gui needs Playwright for its baseline: "
                         ".venv/bin/pip install -e '.[bench]' (no `playwright install`: "
                         "the system Chromium is launched)") from None
    from replay.engine import Worlds
    from worldenv.gui.browser import Browser, find_chromium
    from worldenv.instances.instance import Environment

    executable = find_chromium()
    work = scratch_dir("gui")
    report = Report(B, {"rounds": a.rounds, "starts": a.starts, "threads": a.threads,
                        "contexts": a.contexts, "world": REF, "chromium": executable,
                        "viewport": VIEWPORT})
    worlds = Worlds.open(work / "store")
    worlds.import_file(DEMO)
    pw = sync_playwright().start()
    try:
        browser = Browser(idle_s=0)
        browser.start()
        env = Environment(worlds, browser=lambda: browser)
        capture = env.open(REF)
        canned = Canned(capture)
        args = canned.launch_args()
        pw_browser = pw.chromium.launch(executable_path=executable, headless=True, args=args)
        report.params["playwright"] = pw_browser.version
        med = latency(a, env, pw, pw_browser, capture, canned, report)
        pw_browser.close()
        canned.close()
        capture.close()
        browser.close()
        starts(a, pw, args, report)
        memory(a, worlds, pw, report)
        concurrent(a, worlds, med, report)
    finally:
        pw.stop()
        worlds.close()
    report.notes += [
        f"GUI: {os.cpu_count()} CPUs shared with other jobs; Chromium {report.params['playwright']}"
        f" ({executable}) for both, headless, 1024x768; the baseline is Playwright "
        f"{_playwright_version()} on the same pages' captured bytes (demo world: no photos, "
        "so the HTML and the bundled font). Ours runs Chromium in bubblewrap; Playwright "
        "without a sandbox.",
    ]
    remove(work)
    return report


def _playwright_version() -> str:
    from importlib.metadata import version

    return version("playwright")


def run_quick() -> Report:
    """The smoke path: ours only, one instance (no Playwright baseline, no memory or
    concurrency parts): browser start, open the products page, click a product link, read,
    screenshot, close. Fails (exit 1) when an action answers an error or the wrong page."""
    from replay.engine import Worlds
    from worldenv.gui.browser import Browser
    from worldenv.instances.instance import Environment

    work = scratch_dir("gui")
    report = Report(B, {"world": REF, "viewport": VIEWPORT})
    worlds = Worlds.open(work / "store")
    worlds.import_file(DEMO)
    t: dict[str, float] = {}
    try:
        browser = Browser(idle_s=0)
        t["browser start"] = clock(browser.start)
        env = Environment(worlds, browser=lambda: browser)
        with env.open(REF) as inst:
            steps: list[tuple[str, str, dict[str, Any]]] = [
                ("open the products page", "open", {"url": LIST}),
                ("click a product link", "click", {"name": PRODUCT_NAME, "role": "link"}),
                ("read the page", "read", {}),
                ("screenshot", "screenshot", {})]
            for label, action, args in steps:
                t0 = time.perf_counter()
                got = inst.gui(action, args)
                t[label] = time.perf_counter() - t0
                if got.is_error:
                    raise SystemExit(f"gui {action} {args}: {got.text[:200]}")
            if inst.gui("read").url != PRODUCT:
                raise SystemExit(f"the click on {PRODUCT_NAME!r} did not reach {PRODUCT}")
        env.close()
        browser.close()
    finally:
        worlds.close()
    remove(work)
    report.rows += [Row(B, f"{label}, one run (ours)", fmt_s(took)) for label, took in t.items()]
    report.data = {"seconds": t}
    report.notes.append("quick run: our actions on one instance only; no Playwright "
                        "baseline, memory or concurrency parts")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("GUI actions against Playwright; memory; concurrent GUI instances")
    ap.add_argument("--rounds", type=int, help="interleaved latency rounds")
    ap.add_argument("--starts", type=int, help="interleaved browser starts")
    ap.add_argument("--threads", type=int, help="concurrent GUI instances")
    ap.add_argument("--contexts", help="page counts for memory, e.g. 1,8,32")
    a = ap.parse_args(argv)
    setup_run(a)
    if a.quick:
        emit(run_quick())
        return 0
    a.rounds = a.rounds or 30
    a.starts = a.starts or 7
    a.threads = a.threads or 32
    a.contexts = [int(x) for x in (a.contexts or "1,8,32").split(",")]
    emit(run(a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
