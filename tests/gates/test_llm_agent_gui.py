"""The LLM agent on a task that declares the gui interface: a scripted model behind the
loopback OpenAI-compatible server works the demo shop's web pages in the real headless
browser through the GUI tools, and every request it is sent takes litellm's real path,
screenshots included (an ``image_url`` part with a PNG data URL, the latest one only)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gates.contract import AnswerStep, GuiStep, ToolStep
from gates.llm_agent import (
    GUI_SYSTEM_PROMPT,
    SYSTEM_PROMPT,
    LLMAgent,
    parse_call,
    screenshot_note,
)
from gates.rollout import run_rollout
from gates.task import Task, load_task
from replay import Worlds
from tests.support.llm_server import FIXTURES, LoopbackLLM, serving
from worldenv.core.episode import GuiCall, ToolCall
from worldenv.gui.tools import GUI_TOOLS
from worldenv.instances.instance import Environment, Instance
from worldllm.client import LLMClient
from worldstore.canonical import digest

pytestmark = pytest.mark.usefixtures("loopback_env")

DEMO = Path(__file__).resolve().parents[2] / "packs" / "demo" / "world" / "lars.jsonl"
GUI_TASK = "shop-blank-panel"
GUI_NAMES = {t.name for t in GUI_TOOLS}
ANSWER = "The 1U blank panel (RCK-BLANK-1U) costs NOK 99.00 excl. MVA; one is in your cart."
INSTRUCTION = ("Using the AVLager shop's web pages in the browser, add one 1U blank panel to "
               "my cart, then tell me its unit price excl. MVA.")
VERIFIER = '''"""One RCK-BLANK-1U in the cart (none before); no order placed; the answer gives
its price, NOK 99.00."""

import awsdk

ws = awsdk.worlds()
SQL = ("SELECT c.quantity FROM cart_items c JOIN products p ON p.id = c.product_id "
       "WHERE c.user_id = 1 AND p.sku = 'RCK-BLANK-1U'")
before = [r["quantity"] for r in awsdk.rows(ws.w0, "shop", SQL)]
after = [r["quantity"] for r in awsdk.rows(ws.w, "shop", SQL)]
awsdk.result(
    panel_added_once=before == [] and after == [1],
    no_order_placed=awsdk.row_diff(ws.w0, ws.w, "shop", "orders").unchanged,
    answer_gives_price=awsdk.has_amount(ws.answer, "99.00"),
)
'''


def write_gui_task(folder: Path, world_hash: str) -> Path:
    """A task folder on lars@7 that declares ["mcp", "gui"]: add the 1U blank panel to
    the cart through the shop's pages, check the cart with the shop's tools, answer its
    price. `world_hash` is lars@7's in the store the test opened."""
    spec = {
        "task_id": GUI_TASK, "instruction": INSTRUCTION, "world": "lars@7",
        "world_hash": world_hash, "interfaces": ["mcp", "gui"], "difficulty": "unlabeled",
        "subtasks": [
            {"description": "Open the product in the shop's pages and press Add to cart.",
             "interface": "gui"},
            {"description": "Check the cart with the shop's tools.", "interface": "mcp"}]}
    solution = {"steps": [
        {"kind": "gui", "action": "open", "arguments": {"url": "/shop/products"}},
        {"kind": "gui", "action": "click", "arguments": {"name": "1U blank panel",
                                                         "role": "link"}},
        {"kind": "gui", "action": "click", "arguments": {"name": "Add to cart",
                                                         "role": "button"}},
        {"kind": "tool", "tool": "shop_get_cart", "arguments": {}},
        {"kind": "answer", "text": ANSWER}]}
    task = folder / GUI_TASK
    (task / "verifier").mkdir(parents=True)
    (task / "task.json").write_text(json.dumps(spec, indent=2), encoding="utf-8")
    (task / "solution.json").write_text(json.dumps(solution, indent=2), encoding="utf-8")
    (task / "verifier" / "cart.py").write_text(VERIFIER, encoding="utf-8")
    (task / "rubric.md").write_text("Completed when one 1U blank panel was added to the cart "
                                    "and the answer gives NOK 99.00.\n", encoding="utf-8")
    (task / "hint.md").write_text("Open /shop/products and click the product.\n",
                                  encoding="utf-8")
    return task


def call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    return {"content": f"<thinking>Next: {tool}.</thinking>",
            "tool_calls": [{"name": tool, "arguments": arguments}]}


# The model: open the products, read them, click the panel by name, add it to the cart,
# check the cart with the shop's tool, answer. Each rule answers the screenshot (or tool
# result) that ends the request.
SHOPPER: list[dict[str, Any]] = [
    {"when": {"last_role": "tool", "last_contains": "RCK-BLANK-1U"},
     "reply": call("answer", text=ANSWER)},
    {"when": {"last_contains": "after gui_click — page: Cart"},
     "reply": call("shop_get_cart")},
    {"when": {"last_contains": "after gui_click — page: 1U blank panel"},
     "reply": call("gui_click", name="Add to cart", role="button")},
    {"when": {"last_contains": "after gui_read — page: Products",
              "any_contains": 'link "1U blank panel"'},
     "reply": call("gui_click", name="1U blank panel", role="link")},
    {"when": {"last_contains": "after gui_open — page: Products"},
     "reply": call("gui_read")},
    {"when": {"last_role": "user", "last_contains": INSTRUCTION},
     "reply": call("gui_open", url="/shop/products")},
]


@pytest.fixture(scope="module")
def worlds(demo_worlds: Worlds) -> Worlds:
    return demo_worlds


@pytest.fixture(scope="module")
def env(worlds: Worlds) -> Iterator[Environment]:
    with Environment(worlds) as environment:
        yield environment


@pytest.fixture(scope="module")
def gui_task(worlds: Worlds, tmp_path_factory: pytest.TempPathFactory) -> Task:
    return load_task(write_gui_task(tmp_path_factory.mktemp("tasks"),
                                    worlds.resolve("lars@7").world_hash))


@pytest.fixture
def inst(env: Environment, gui_task: Task) -> Iterator[Instance]:
    with env.open(gui_task.spec.world_hash) as instance:
        yield instance


def agent_for(server: LoopbackLLM, **options: Any) -> LLMAgent:
    client = LLMClient("openai/scripted", api_base=server.url, api_key="sk-loopback",
                       num_retries=0, timeout=30)
    return LLMAgent(client, **options)


def images(message: dict[str, Any]) -> list[str]:
    """The data URLs of a message's image parts."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [p["image_url"]["url"] for p in content if p.get("type") == "image_url"]


def test_the_agent_works_the_shop_in_the_browser(inst: Instance, gui_task: Task) -> None:
    with serving(SHOPPER) as server:
        trajectory = agent_for(server).run(inst, gui_task, hinted=False)
    assert trajectory.stopped == "answer" and trajectory.answer == ANSWER
    steps = [t.step for t in trajectory.turns]
    assert steps == [GuiStep(action="open", arguments={"url": "/shop/products"}),
                     GuiStep(action="read"),
                     GuiStep(action="click", arguments={"name": "1U blank panel",
                                                        "role": "link"}),
                     GuiStep(action="click", arguments={"name": "Add to cart",
                                                        "role": "button"}),
                     ToolStep(tool="shop_get_cart"), AnswerStep(text=ANSWER)]
    assert not any(t.is_error for t in trajectory.turns)
    gui_turns = trajectory.turns[:4]
    for turn in gui_turns:  # each GUI turn has its screenshot, kept in the episode
        assert turn.screenshot is not None and turn.screenshot in inst.episode.screenshots
        assert turn.reasoning.startswith("<thinking>Next: gui_")
    assert trajectory.turns[4].screenshot is None
    assert 'link "1U blank panel"' in gui_turns[1].observation  # gui_read's text
    assert gui_turns[3].observation.startswith("page: Cart")
    calls = inst.episode.calls
    assert [type(c) for c in calls] == [GuiCall] * 4 + [ToolCall]
    assert [c.action for c in calls if isinstance(c, GuiCall)] == ["open", "read", "click",
                                                                    "click"]
    added = calls[3]
    assert isinstance(added, GuiCall) and [f.tool for f in added.forms] == [
        "shop_add_to_cart"]

    # Offered: the MCP tools, the seven GUI tools, shell and answer; the GUI prompt.
    first = server.requests[0]
    offered = [t["function"]["name"] for t in first["tools"]]
    assert set(offered) >= GUI_NAMES and {"shell", "answer", "shop_get_cart"} <= set(offered)
    assert len(offered) == len(inst.list_tools()) + len(GUI_TOOLS) + 2
    gui_open = next(t for t in first["tools"] if t["function"]["name"] == "gui_open")
    assert gui_open["function"]["parameters"] == GUI_TOOLS[0].input_schema
    assert first["messages"][0] == {"role": "system", "content": GUI_SYSTEM_PROMPT}
    assert "gui_open" in GUI_SYSTEM_PROMPT and "gui_open" not in SYSTEM_PROMPT
    assert not any(images(m) for m in first["messages"])

    # After each GUI step: one user message with its screenshot as the only image; the
    # older screenshots are notes in words.
    requests = server.requests
    assert len(requests) == 6
    for n, request in enumerate(requests[1:5], start=1):
        messages = request["messages"]
        shown = [(i, url) for i, m in enumerate(messages) for url in images(m)]
        assert len(shown) == 1, f"request {n} carries {len(shown)} images"
        (at, url), = shown
        assert at == len(messages) - 1 and messages[at]["role"] == "user"
        assert messages[at - 1]["role"] == "tool"
        caption = messages[at]["content"][0]
        assert caption["type"] == "text" and caption["text"].startswith(
            f"Screenshot after gui_{('open', 'read', 'click', 'click')[n - 1]} — page: ")
        assert url.startswith("data:image/png;base64,")
        png = base64.b64decode(url.removeprefix("data:image/png;base64,"))
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        assert digest(png) == gui_turns[n - 1].screenshot
        notes = [m["content"] for m in messages
                 if m["role"] == "user" and isinstance(m["content"], str)
                 and m["content"].startswith("[screenshot after gui_")]
        assert len(notes) == n - 1  # every older screenshot, in words
    second = requests[2]["messages"]
    assert screenshot_note("screenshot after gui_open — page: Products · AVLager — "
                           "/shop/products") in [m.get("content") for m in second]
    # After the shop tool's step the latest screenshot (the cart's) is still the one image.
    last = requests[5]["messages"]
    assert last[-1]["role"] == "tool" and "RCK-BLANK-1U" in last[-1]["content"]
    (url,) = [u for m in last for u in images(m)]
    assert digest(base64.b64decode(url.split(",", 1)[1])) == gui_turns[3].screenshot


def test_a_gui_rollout_passes_its_verifier_and_uses_the_gui(env: Environment,
                                                            gui_task: Task) -> None:
    with serving(SHOPPER) as server:
        rollout = run_rollout(env, gui_task, agent_for(server), hinted=False)
    assert rollout.verdict.passed, rollout.verdict
    assert rollout.interfaces_used == ["gui", "mcp"]
    assert [t.screenshot is not None for t in rollout.trajectory.turns] == [
        True, True, True, True, False, False]


def test_gui_tools_are_offered_only_for_a_gui_task_in_tools_mode(
        inst: Instance, gui_task: Task) -> None:
    answer = [{"when": {}, "reply": call("answer", text="done")}]
    plain = load_task(FIXTURES / "fjellrommet-title")  # declares mcp and shell
    assert "gui" not in plain.spec.interfaces
    with serving(answer) as server:
        agent_for(server).run(inst, plain, hinted=False)
    request = server.requests[0]
    assert not GUI_NAMES & {t["function"]["name"] for t in request["tools"]}
    assert request["messages"][0]["content"] == SYSTEM_PROMPT
    with serving(answer) as server:  # AWM's meta mode: never GUI tools
        agent_for(server, mode="meta").run(inst, gui_task, hinted=False)
    request = server.requests[0]
    assert {t["function"]["name"] for t in request["tools"]} == {
        "list_tools", "call_tool", "answer"}
    assert "gui_" not in request["messages"][0]["content"]


def test_a_gui_call_on_a_task_without_gui_is_refused(inst: Instance) -> None:
    plain = load_task(FIXTURES / "fjellrommet-title")
    rules: list[dict[str, Any]] = [
        {"when": {"last_role": "tool"}, "reply": call("answer", text="done")},
        {"when": {}, "reply": call("gui_open", url="/shop/")},
    ]
    with serving(rules) as server:
        trajectory = agent_for(server).run(inst, plain, hinted=False)
    refused = trajectory.turns[0]
    assert refused.step == ToolStep(tool="gui_open") and refused.is_error
    assert "there is no tool 'gui_open'" in refused.observation
    assert inst.episode.events == []  # nothing reached the browser


def test_bad_gui_calls_are_data_for_the_model(inst: Instance, gui_task: Task) -> None:
    rules: list[dict[str, Any]] = [
        {"when": {"last_contains": "has no argument"},
         "reply": call("answer", text="gave up")},
        {"when": {"last_contains": "must be a JSON object"},
         "reply": call("gui_click", where="the panel")},
        {"when": {}, "reply": {"content": "", "tool_calls": [
            {"name": "gui_open", "arguments": '["/shop/"]'}]}},
    ]
    with serving(rules) as server:
        trajectory = agent_for(server).run(inst, gui_task, hinted=False)
    malformed, unknown, answer = trajectory.turns
    assert malformed.step == ToolStep(tool="gui_open") and malformed.is_error
    assert unknown.step == GuiStep(action="click", arguments={"where": "the panel"})
    assert unknown.is_error and "gui_click has no argument 'where'" in unknown.observation
    assert answer.step == AnswerStep(text="gave up")
    # the instance refused the click (recorded as a GUI call); the malformed one never ran
    assert [(type(c), c.is_error) for c in inst.episode.calls] == [(GuiCall, True)]
    assert server.requests[2]["messages"][-1]["role"] == "tool"  # no page, no screenshot


def test_parse_call_makes_gui_steps_of_offered_gui_tools() -> None:
    known = GUI_NAMES | {"shell", "answer"}
    assert parse_call("gui_click", '{"element": 3}', known) == GuiStep(
        action="click", arguments={"element": 3})
    assert parse_call("gui_screenshot", "", known) == GuiStep(action="screenshot")
    problem = parse_call("gui_type", '"hello"', known)
    assert isinstance(problem, str) and "must be a JSON object" in problem
    problem = parse_call("gui_open", '{"url": "/"}', {"shell", "answer"})
    assert isinstance(problem, str) and "there is no tool 'gui_open'" in problem
