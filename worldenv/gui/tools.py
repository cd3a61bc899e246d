"""GUI tools: how an agent acts on an instance's web pages in a real browser.

The tools (``GUI_TOOLS``) are the agent's, like ``shell``: a task that declares the
``gui`` interface puts them in its agent's tool list. Each is one ``Instance.gui`` call,
recorded in the episode as a ``GuiCall`` with the digest of the screenshot taken after it:

* ``gui_open(url)``: a page of the instance (``/shop/``, ``http://world.local/chat/``);
* ``gui_screenshot()``: the page as a PNG;
* ``gui_click(x, y)`` or ``gui_click(element=N)`` or ``gui_click(name=..., role=...)``;
* ``gui_type(text)`` into the focused field (or into the element named first);
* ``gui_key(key)``: Enter, Tab, Backspace, Escape, arrows, PageUp/PageDown, Home, End;
* ``gui_scroll(dy, dx)``;
* ``gui_read()``: the page as accessibility text, interactive elements numbered
  (``[3] link "Surge protector SP-8"``) for ``element=N``.

``GuiSession`` holds one instance's ``BrowserPage`` and turns each action into browser
commands. It knows nothing of databases: the page's requests go to the instance (its
``handler``), whose forms call its tools.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worldenv.core.contract import ToolInfo
from worldenv.errors import BrowserError
from worldenv.gui.browser import Browser, BrowserPage, Handler
from worldenv.gui.site import ORIGIN
from worldstore.canonical import digest

__all__ = ["GUI_ACTIONS", "GUI_TOOLS", "GuiOutcome", "GuiSession", "gui_argument_problem",
           "gui_tool_action"]

GUI_PREFIX = "gui_"
MAX_TEXT = 2_000
MAX_READ_CHARS = 12_000
SCROLL_STEP = 400

# key name -> (DevTools code, Windows key code, text it types)
KEYS: dict[str, tuple[str, int, str]] = {
    "Enter": ("Enter", 13, "\r"), "Tab": ("Tab", 9, ""), "Backspace": ("Backspace", 8, ""),
    "Escape": ("Escape", 27, ""), "Delete": ("Delete", 46, ""), "Space": ("Space", 32, " "),
    "ArrowUp": ("ArrowUp", 38, ""), "ArrowDown": ("ArrowDown", 40, ""),
    "ArrowLeft": ("ArrowLeft", 37, ""), "ArrowRight": ("ArrowRight", 39, ""),
    "PageUp": ("PageUp", 33, ""), "PageDown": ("PageDown", 34, ""),
    "Home": ("Home", 36, ""), "End": ("End", 35, ""),
}
# Roles whose click (or Enter on them) may navigate: every button of a site submits a form.
NAVIGATING = frozenset({"link", "button", "menuitem"})
# Fields in which Enter submits their form.
SUBMITTING = frozenset({"textbox", "searchbox", "spinbutton", "combobox", "link", "button"})
# Roles an agent can act on: numbered in gui_read, found by gui_click(name=...).
ACTIONABLE = frozenset({"link", "button", "textbox", "searchbox", "combobox", "checkbox",
                        "radio", "menuitem", "option", "image", "spinbutton", "listbox"})
_SKIPPED = frozenset({"generic", "none", "InlineTextBox", "LineBreak", "RootWebArea",
                      "paragraph", "list", "listitem", "main", "banner", "navigation",
                      "Section", "table", "rowgroup", "row", "LayoutTable",
                      "LayoutTableRow", "LayoutTableCell", "form", "group", "ListMarker"})

_TARGET_PROPS: dict[str, Any] = {
    "element": {"type": "integer", "minimum": 1,
                "description": "The element's number from gui_read."},
    "name": {"type": "string", "maxLength": 300,
             "description": "The element's accessible name (its text, label or alt text); "
                            "the first element of that name, case-insensitive."},
    "role": {"type": "string", "maxLength": 40,
             "description": "With name: only elements of this role (link, button, "
                            "textbox, ...)."},
}


def _info(name: str, description: str, properties: dict[str, Any],
          required: tuple[str, ...] = ()) -> ToolInfo:
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return ToolInfo(name=GUI_PREFIX + name, description=description, input_schema=schema,
                    output_schema=None, writes=True)


GUI_TOOLS: tuple[ToolInfo, ...] = (
    _info("open", "Open a page of this computer's web apps in the browser: a path such as "
          "/shop/ or /chat/ (or a URL on http://world.local). / lists the apps. Returns "
          "the page's title and a screenshot.",
          {"url": {"type": "string", "maxLength": 2000,
                   "description": "A path of the web apps, e.g. /shop/products"}}, ("url",)),
    _info("screenshot", "Take a screenshot of the browser's page (1024x768).", {}),
    _info("click", "Click on the page: at x, y (pixels of the screenshot), or on an "
          "element by its number from gui_read, or by its name (and role).",
          {"x": {"type": "integer", "minimum": 0, "maximum": 4096},
           "y": {"type": "integer", "minimum": 0, "maximum": 4096}, **_TARGET_PROPS}),
    _info("type", "Type text into the focused field, or first click the element given by "
          "number or name; with clear, what the field holds is replaced.",
          {"text": {"type": "string", "maxLength": MAX_TEXT},
           "clear": {"type": "boolean", "description": "Replace the field's text."},
           **_TARGET_PROPS}, ("text",)),
    _info("key", f"Press a key: {', '.join(KEYS)}.",
          {"key": {"type": "string", "enum": list(KEYS)}}, ("key",)),
    _info("scroll", f"Scroll the page by dy pixels down (negative: up; default "
          f"{SCROLL_STEP}) and dx right.",
          {"dy": {"type": "integer", "minimum": -10000, "maximum": 10000},
           "dx": {"type": "integer", "minimum": -10000, "maximum": 10000}}),
    _info("read", "Read the page as text: headings, text, and every link, button and "
          "field numbered ([3] link \"Orders\") for gui_click(element=3).", {}),
)
GUI_ACTIONS = tuple(t.name.removeprefix(GUI_PREFIX) for t in GUI_TOOLS)


def gui_tool_action(name: str) -> str | None:
    """The action a GUI tool name stands for (``gui_click`` -> ``click``), else None."""
    action = name.removeprefix(GUI_PREFIX)
    return action if name.startswith(GUI_PREFIX) and action in GUI_ACTIONS else None


@dataclass(frozen=True, slots=True)
class GuiOutcome:
    """What one action did: error or not, what the agent is told, where the page is, and
    the screenshot after it (PNG) with its digest."""

    is_error: bool
    text: str
    url: str | None
    png: bytes | None
    screenshot: str | None


class _Refused(Exception):
    """A bad action (an unknown element, a URL of another site): an error result."""


class GuiSession:
    """One instance's browser page and what the agent last read of it."""

    def __init__(self, browser: Callable[[], Browser], handler: Handler) -> None:
        self._browser = browser
        self._handler = handler
        self._page: BrowserPage | None = None
        self._url = ""
        self._version = 0  # bumped by every action that may change what the page shows
        self._shot: tuple[int, bytes, str] | None = None
        self._elements: dict[int, tuple[int, str]] = {}  # number -> (backend node, role)
        self._elements_at = -1  # the page activity they were read at

    @property
    def open(self) -> bool:
        return self._page is not None and not self._page.closed

    def close(self) -> None:
        page, self._page = self._page, None
        self._shot = None
        self._elements = {}
        if page is not None:
            page.close()

    def act(self, action: str, arguments: dict[str, Any]) -> GuiOutcome:
        """Do one action; a bad one (or a browser that failed) is an error outcome."""
        try:
            note = self._do(action, arguments)
        except _Refused as exc:
            return self._outcome(True, str(exc))
        except BrowserError as exc:
            self.close()  # the next action starts a fresh page (and browser, if needed)
            return GuiOutcome(True, f"the browser failed: {exc}", self._url or None, None, None)
        return self._outcome(False, note)

    def _outcome(self, is_error: bool, note: str) -> GuiOutcome:
        if self._page is None:
            return GuiOutcome(is_error, note, None, None, None)
        try:
            png, shot = self._screenshot()
            url, title = self._page.location()
        except BrowserError as exc:
            self.close()
            return GuiOutcome(True, f"the browser failed: {exc}", self._url or None, None, None)
        if not _is_instance_url(url) and url != "about:blank":
            return self._left(url)
        self._url = url
        head = f"page: {title or '(untitled)'} — {_path(url)}"
        return GuiOutcome(is_error, f"{head}\n{note}" if note else head, _path(url), png, shot)

    def _left(self, url: str) -> GuiOutcome:
        """The page tried to go outside the instance (its request was failed): back to
        where it was, and an error result that says so."""
        note = f"blocked: {url!r} is not a page of this computer's web apps"
        back = self._url or ORIGIN + "/"
        try:
            self._version += 1
            self._page_or_fail().navigate(back)
        except BrowserError as exc:
            self.close()
            return GuiOutcome(True, f"{note}; the browser failed: {exc}", None, None, None)
        outcome = self._outcome(True, note)
        return outcome

    # --- actions ------------------------------------------------------------------------

    def _do(self, action: str, arguments: dict[str, Any]) -> str:
        handlers: dict[str, Callable[[dict[str, Any]], str]] = {
            "open": self._open, "screenshot": lambda a: "", "click": self._click,
            "type": self._type, "key": self._key, "scroll": self._scroll, "read": self._read}
        handler = handlers.get(action)
        if handler is None:
            raise _Refused(f"unknown GUI action {action!r}; actions: {', '.join(GUI_ACTIONS)}")
        problem = gui_argument_problem(action, arguments)
        if problem is not None:
            raise _Refused(problem)
        if action != "open" and self._page is None:
            self._ensure_page()
            self._page_or_fail().navigate(ORIGIN + "/")
        return handler(arguments)

    def _ensure_page(self) -> BrowserPage:
        if self._page is None or self._page.closed:
            self._page = self._browser().new_page(self._handler)
            self._version += 1
        return self._page

    def _page_or_fail(self) -> BrowserPage:
        if self._page is None:
            raise BrowserError("no page")
        return self._page

    def _open(self, arguments: dict[str, Any]) -> str:
        url = _instance_url(str(arguments["url"]))
        page = self._ensure_page()
        self._version += 1
        page.navigate(url)
        return ""

    def _click(self, arguments: dict[str, Any]) -> str:
        page = self._page_or_fail()
        x, y, what, roles = self._point(page, arguments)
        self._version += 1
        page.click(x, y, navigates=not NAVIGATING.isdisjoint(roles))
        return f"clicked {what}"

    def _type(self, arguments: dict[str, Any]) -> str:
        page = self._page_or_fail()
        if _has_target(arguments):
            x, y, _what, _roles = self._point(page, arguments)
            self._version += 1
            page.click(x, y)
        self._version += 1
        if arguments.get("clear"):
            page.select_all()
        page.insert_text(str(arguments["text"]))
        return f"typed {len(str(arguments['text']))} characters"

    def _key(self, arguments: dict[str, Any]) -> str:
        page = self._page_or_fail()
        name = str(arguments["key"])
        code, key_code, text = KEYS[name]
        navigates = name in ("Enter", "Space") and page.focused_role() in (
            SUBMITTING if name == "Enter" else NAVIGATING)
        self._version += 1
        page.key(" " if name == "Space" else name, code, key_code, text, navigates=navigates)
        return f"pressed {name}"

    def _scroll(self, arguments: dict[str, Any]) -> str:
        page = self._page_or_fail()
        dy, dx = int(arguments.get("dy", SCROLL_STEP)), int(arguments.get("dx", 0))
        self._version += 1
        page.scroll(512, 384, dx, dy)
        return f"scrolled by dx={dx}, dy={dy}"

    def _read(self, arguments: dict[str, Any]) -> str:
        page = self._page_or_fail()
        lines, elements = _accessible_text(page.accessibility())
        self._elements, self._elements_at = elements, page.activity
        text = "\n".join(lines)
        if len(text) > MAX_READ_CHARS:
            text = text[:MAX_READ_CHARS] + "\n[... the page goes on; scroll or open a page of it]"
        return text

    def _point(self, page: BrowserPage, arguments: dict[str, Any]
               ) -> tuple[float, float, str, list[str]]:
        """Where to click, what it is called, and the roles there (the element's own and
        its ancestors', for a point)."""
        if "x" in arguments or "y" in arguments:
            if "x" not in arguments or "y" not in arguments:
                raise _Refused("a click at a point needs both x and y")
            x, y = float(arguments["x"]), float(arguments["y"])
            return x, y, f"at ({arguments['x']}, {arguments['y']})", page.roles_at(x, y)
        if "element" in arguments:
            number = int(arguments["element"])
            if self._elements_at != page.activity:
                raise _Refused("the page changed since gui_read: read it again for the "
                               "elements' numbers")
            found = self._elements.get(number)
            if found is None:
                raise _Refused(f"no element [{number}] on this page (gui_read numbers "
                               f"{len(self._elements)} elements)")
            (node, role), what = found, f"element [{number}]"
        elif "name" in arguments:
            node, role, what = _by_name(page.accessibility(), str(arguments["name"]),
                                        arguments.get("role"))
        else:
            raise _Refused("say where to click: x and y, element, or name")
        center = page.center(node)
        if center is None:
            raise _Refused(f"{what} is not visible on the page")
        return center[0], center[1], what, [role]

    def _screenshot(self) -> tuple[bytes, str]:
        if self._shot is not None and self._shot[0] == self._version:
            return self._shot[1], self._shot[2]
        png = self._page_or_fail().screenshot()
        shot = digest(png)
        self._shot = (self._version, png, shot)
        return png, shot


def gui_argument_problem(action: str, arguments: dict[str, Any]) -> str | None:
    """Why `arguments` do not fit the schema of the ``gui_`` tool of `action` (unknown or
    missing arguments, a wrong type, a number out of range, text too long, a value not
    among the allowed ones); None when they fit. The one check of GUI arguments: the
    session's and the gateway's."""
    schema = next(t.input_schema for t in GUI_TOOLS if t.name == GUI_PREFIX + action)
    allowed: dict[str, Any] = schema["properties"]
    unknown = sorted(set(arguments) - set(allowed))
    if unknown:
        return (f"gui_{action} has no argument {', '.join(map(_clip, unknown[:5]))}: it "
                f"takes {', '.join(sorted(allowed)) or 'none'}")
    for name in schema.get("required", ()):
        if name not in arguments:
            return f"gui_{action} needs the argument {name!r}"
    for name, value in arguments.items():
        spec = allowed[name]
        kind = spec["type"]
        if kind == "integer":
            low, high = spec.get("minimum", -(1 << 63)), spec.get("maximum", 1 << 63)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                return (f"gui_{action}: {name} must be an integer from {low} to {high}, not "
                        f"{_clip(value)}")
        elif kind == "boolean":
            if not isinstance(value, bool):
                return f"gui_{action}: {name} must be true or false, not {_clip(value)}"
        elif not isinstance(value, str) or len(value) > spec.get("maxLength", MAX_TEXT):
            return (f"gui_{action}: {name} must be a string of at most "
                    f"{spec.get('maxLength', MAX_TEXT)} characters, not {_clip(value)}")
        elif "enum" in spec and value not in spec["enum"]:
            return (f"gui_{action}: {name} must be one of {', '.join(spec['enum'])}, not "
                    f"{_clip(value)}")
    return None


def _clip(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _has_target(arguments: dict[str, Any]) -> bool:
    return any(k in arguments for k in ("element", "name"))


def _instance_url(url: str) -> str:
    """The absolute URL of a path of the instance's pages; another origin or scheme is
    refused (the browser reaches nothing else)."""
    url = url.strip()
    if url.startswith("/") and not url.startswith("//"):
        return ORIGIN + url
    if _is_instance_url(url):
        return url
    raise _Refused(f"{url!r}: only this computer's web apps can be opened: a path such as "
                   f"/shop/ (or a URL on {ORIGIN})")


def _is_instance_url(url: str) -> bool:
    return url == ORIGIN or url.startswith(ORIGIN + "/")


def _path(url: str) -> str:
    return url[len(ORIGIN):] or "/" if url.startswith(ORIGIN) else url


def _name(node: dict[str, Any]) -> str:
    return str(node.get("name", {}).get("value", "")).strip()


def _role(node: dict[str, Any]) -> str:
    return str(node.get("role", {}).get("value", ""))


def _walk(nodes: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any], dict[str, Any] | None]]:
    """The nodes in document order with their depth and their parent."""
    by_id = {n["nodeId"]: n for n in nodes}
    roots = [n for n in nodes if not n.get("parentId")]
    out: list[tuple[int, dict[str, Any], dict[str, Any] | None]] = []
    stack = [(0, r, None) for r in reversed(roots)]
    while stack:
        depth, node, parent = stack.pop()
        out.append((depth, node, parent))
        for child in reversed(node.get("childIds", [])):
            found = by_id.get(child)
            if found is not None:
                stack.append((depth + 1, found, node))
    return out


def _accessible_text(nodes: list[dict[str, Any]]
                     ) -> tuple[list[str], dict[int, tuple[int, str]]]:
    lines: list[str] = []
    elements: dict[int, tuple[int, str]] = {}
    for _depth, node, parent in _walk(nodes):
        if node.get("ignored"):
            continue
        role, name = _role(node), _name(node)
        if role == "StaticText":
            if name and (parent is None or _role(parent) not in ACTIONABLE | {"heading"}
                         or _name(parent) != name):
                lines.append(name)
            continue
        if role in ACTIONABLE and "backendDOMNodeId" in node:
            number = len(elements) + 1
            elements[number] = (int(node["backendDOMNodeId"]), role)
            value = node.get("value", {}).get("value")
            shown = f' value="{value}"' if value not in (None, "") and role != "link" else ""
            lines.append(f'[{number}] {role} "{name}"{shown}')
        elif role == "heading":
            lines.append(f"# {name}")
        elif role not in _SKIPPED and name:
            lines.append(f"{role}: {name}")
    return lines, elements


def _by_name(nodes: list[dict[str, Any]], name: str, role: object) -> tuple[int, str, str]:
    wanted = name.strip().casefold()
    seen: list[str] = []
    for _depth, node, _parent in _walk(nodes):
        node_role = _role(node)
        if node.get("ignored") or node_role not in ACTIONABLE or "backendDOMNodeId" not in node:
            continue
        if role is not None and node_role != role:
            continue
        seen.append(f'{node_role} "{_name(node)}"')
        if _name(node).casefold() == wanted:
            return int(node["backendDOMNodeId"]), node_role, f'{node_role} "{_name(node)}"'
    shown = "; ".join(seen[:15]) + (" ..." if len(seen) > 15 else "")
    kind = f" {role}" if role is not None else ""
    raise _Refused(f"no{kind} element named {name!r} on this page; there are: "
                   f"{shown or 'none'}")

