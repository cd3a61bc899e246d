"""The determinism checker on the demo world, with the shipped apps and the shell."""

from __future__ import annotations

from pathlib import Path

from packs.registry import load_pack
from replay import Worlds
from worldenv.instances.checker import check_determinism
from worldenv.instances.instance import Environment
from worldenv.serving.script import as_checker_calls, load_script

CALLS = [
    *as_checker_calls(load_script(load_pack("demo").episode("demo"))[1]),
    ("shop_add_to_cart", {"product_id": 1, "quantity": 1}),
    ("shop_get_cart", {}),
    ("calendar_create_event", {"calendar_id": 1, "title": "Handover Nordlys",
                               "start_at": "2026-03-13T15:00", "end_at": "2026-03-13T16:00"}),
    ("notes_create_note", {"notebook_id": 1, "title": "Handover", "body": "Bring the PO."}),
    ("chat_mark_read", {"conversation_id": 1}),
    ("shop_get_order", {"order_id": 999}),  # a refusal is part of the sequence too
]


def test_the_demo_world_is_deterministic_under_the_checker(tmp_path: Path,
                                                           demo_jsonl: Path) -> None:
    with Worlds.open(tmp_path / "store") as worlds:
        worlds.import_file(demo_jsonl)
        report = check_determinism(Environment(worlds), "lars@7", CALLS)
        assert report.ok, report.problems
        assert report.calls == len(CALLS)
        assert report.final_hash != worlds.resolve("lars@7").world_hash


def test_the_checker_names_the_first_divergent_call(tmp_path: Path, demo_jsonl: Path) -> None:
    # Two different snapshots stand in for a nondeterministic environment: the first call
    # that reads what differs between them is the one named.
    with Worlds.open(tmp_path / "store") as worlds:
        worlds.import_file(demo_jsonl)
        env = Environment(worlds)
        real_open = env.open
        opened: list[str] = []

        def open_alternating(ref: str):  # type: ignore[no-untyped-def]
            opened.append(ref)
            return real_open("lars@6" if len(opened) == 2 else ref)

        env.open = open_alternating  # type: ignore[method-assign]
        report = check_determinism(env, "lars@7", [
            ("notes_get_note", {"note_id": 1}),
            ("shop_get_order", {"order_number": "AVL-2026-10533"}),
        ])
        assert not report.ok
        assert report.problems[0].startswith("call #2 (shop_get_order)")
