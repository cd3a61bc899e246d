"""A deterministic synthetic world for the benchmarks: one persona, five services, ~10 days.

The only randomness is ``random.Random(1234)`` and no clock is read, so the same arguments
always give byte-identical interchange files (and therefore the same world hashes).

Shape (defaults: 50,000 events, ~640-byte text payloads -> about 32 MB of databases;
7,500 events make the ~5 MB world of the mount benchmark):

* services ``mail``, ``chat``, ``shop``, ``crm``, ``docs``, two tables each, every table with
  an ``INTEGER PRIMARY KEY``, plus secondary (and one unique) indexes;
* day 0 opens with the schema; then ~80 % inserts (a few hundred bytes of text each),
  ~12 % updates, ~5 % deletes, and a sprinkling of workspace file writes/deletes;
* timestamps spread over 12 hours of each of ``days`` consecutive days.

A second shape, ``realistic`` (``generate_realistic``), is a WildAWM-like world where a day
touches little of it: 12 services of 5 tables (60 tables), all filled on day 0; on each
later day 15 tables (drawn anew each day) and about 5 workspace files change. With
``day0_share`` most events fill the world on day 0 and later days are small, as WildAWM's.

Usage: ``python bench/genworld.py OUT.jsonl [--events N] [--payload BYTES] [--days D]
[--realistic [--day0-share F]]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from worldstore.folders import writing_file

SEED = 1234
PERSONA = "bench"
START = datetime(2026, 1, 5, 7, 0, 0, tzinfo=UTC)
DAY_SPAN_S = 12 * 3600
N_FILES = 24  # distinct workspace paths

# service -> DDL statements (tables first, then indexes), all created on day 0
SCHEMA: dict[str, list[str]] = {
    "mail": [
        "CREATE TABLE messages(id INTEGER PRIMARY KEY, mailbox TEXT NOT NULL, "
        "sender TEXT NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL, "
        "received_at TEXT NOT NULL, is_read INTEGER NOT NULL DEFAULT 0)",
        "CREATE TABLE contacts(id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
        "email TEXT NOT NULL, notes TEXT)",
        "CREATE INDEX messages_mailbox ON messages(mailbox, received_at)",
        "CREATE UNIQUE INDEX contacts_email ON contacts(email)",
    ],
    "chat": [
        "CREATE TABLE channels(id INTEGER PRIMARY KEY, name TEXT NOT NULL, topic TEXT)",
        "CREATE TABLE messages(id INTEGER PRIMARY KEY, channel_id INTEGER NOT NULL, "
        "author TEXT NOT NULL, body TEXT NOT NULL, sent_at TEXT NOT NULL, edited_at TEXT)",
        "CREATE INDEX messages_channel ON messages(channel_id, sent_at)",
    ],
    "shop": [
        "CREATE TABLE products(id INTEGER PRIMARY KEY, sku TEXT NOT NULL, name TEXT NOT NULL, "
        "description TEXT NOT NULL, price_cents INTEGER NOT NULL, stock INTEGER NOT NULL, "
        "updated_at TEXT NOT NULL)",
        "CREATE TABLE orders(id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL, "
        "quantity INTEGER NOT NULL, status TEXT NOT NULL, note TEXT NOT NULL, "
        "placed_at TEXT NOT NULL)",
        "CREATE UNIQUE INDEX products_sku ON products(sku)",
        "CREATE INDEX orders_product ON orders(product_id)",
        "CREATE INDEX orders_status ON orders(status)",
    ],
    "crm": [
        "CREATE TABLE accounts(id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
        "industry TEXT NOT NULL, notes TEXT NOT NULL)",
        "CREATE TABLE activities(id INTEGER PRIMARY KEY, account_id INTEGER NOT NULL, "
        "kind TEXT NOT NULL, body TEXT NOT NULL, happened_at TEXT NOT NULL)",
        "CREATE INDEX activities_account ON activities(account_id, happened_at)",
    ],
    "docs": [
        "CREATE TABLE pages(id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL, "
        "updated_at TEXT NOT NULL)",
        "CREATE TABLE comments(id INTEGER PRIMARY KEY, page_id INTEGER NOT NULL, "
        "author TEXT NOT NULL, body TEXT NOT NULL, created_at TEXT NOT NULL)",
        "CREATE INDEX comments_page ON comments(page_id)",
    ],
}
SERVICES = tuple(SCHEMA)

_VOCABULARY = (
    "invoice meeting quarterly rack switch cable budget delivery schedule review draft "
    "approved pending shipped customer vendor studio display camera audio install "
    "network firmware update ticket follow-up agenda minutes deadline estimate quote "
    "order stock warehouse pallet courier signature reception office floor room desk "
    "laptop projector speaker amplifier microphone license renewal contract clause "
    "payment reminder overdue receipt refund discount margin report summary forecast "
    "the a of to and in for on with at by from about after before during this that"
)
_WORDS = _VOCABULARY.split()
_NAMES = ("ingrid", "erik", "lars", "maja", "nora", "jonas", "sofie", "henrik", "ola", "kari")
_STATUSES = ("placed", "paid", "packed", "shipped", "delivered", "returned")
_KINDS = ("call", "email", "visit", "note", "demo")
_DELETABLE = {"mail": "messages", "chat": "messages", "shop": "orders", "crm": "activities",
              "docs": "comments"}


DEFAULT_EVENTS = 50_000
DEFAULT_PAYLOAD = 640  # mean bytes of text per long text column
DEFAULT_DAYS = 10


@dataclass(frozen=True, slots=True)
class Params:
    events: int = DEFAULT_EVENTS
    payload: int = DEFAULT_PAYLOAD
    days: int = DEFAULT_DAYS
    realistic: bool = False  # the few-tables-a-day shape (generate_realistic)
    # Share of the events on day 0 in the realistic shape (0: the same number every day).
    # WildAWM's worlds are large with small days (59.3 MiB a world state, ~31 KiB growth a
    # day): a day-0 share of 0.8 still grows these worlds ten times faster than that.
    day0_share: float = 0.0


# The realistic shape: 60 tables in all, 15 of them and about 5 files changed a day.
REALISTIC_SERVICES = tuple(f"svc{i:02d}" for i in range(12))
REALISTIC_TABLES = 5
REALISTIC_TOUCHED = 15
REALISTIC_FILES = 5


class _Gen:
    """Event generator state: live row ids per table, id counters, workspace files."""

    def __init__(self, p: Params) -> None:
        self.p = p
        self.rng = random.Random(SEED)
        self.corpus = self._corpus(max(64_000, p.payload * 400))
        self.live: dict[tuple[str, str], list[int]] = {}
        self.next_id: dict[tuple[str, str], int] = {}
        self.files: dict[str, int] = {}  # path -> times written

    def _corpus(self, size: int) -> str:
        words: list[str] = []
        total = 0
        while total < size:
            w = self.rng.choice(_WORDS)
            words.append(w)
            total += len(w) + 1
        return " ".join(words)

    def text(self, mean: int) -> str:
        n = max(8, self.rng.randint(mean * 3 // 4, mean * 5 // 4))
        start = self.rng.randrange(0, len(self.corpus) - n)
        return self.corpus[start:start + n]

    def short(self) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(self.rng.randint(2, 6)))

    def new_id(self, service: str, table: str) -> int:
        key = (service, table)
        ident = self.next_id.get(key, 1)
        self.next_id[key] = ident + 1
        self.live.setdefault(key, []).append(ident)
        return ident

    def pick(self, service: str, table: str) -> int | None:
        ids = self.live.get((service, table))
        return self.rng.choice(ids) if ids else None

    def take(self, service: str, table: str) -> int | None:
        """Remove and return a random live id (swap-remove keeps it O(1))."""
        ids = self.live.get((service, table))
        if not ids:
            return None
        i = self.rng.randrange(len(ids))
        ids[i], ids[-1] = ids[-1], ids[i]
        return ids.pop()

    # --- statements: (sql, params) ------------------------------------------------------

    def insert(self, service: str, ts: str, small: bool) -> tuple[str, list[Any]]:
        r, big = self.rng, self.p.payload
        if service == "mail":
            if small:
                i = self.new_id("mail", "contacts")
                return ("INSERT INTO contacts(id, name, email, notes) VALUES (?, ?, ?, ?)",
                        [i, r.choice(_NAMES).title(), f"c{i}@example.test", self.text(big // 4)])
            i = self.new_id("mail", "messages")
            return ("INSERT INTO messages(id, mailbox, sender, subject, body, received_at, "
                    "is_read) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [i, r.choice(("inbox", "archive", "sent")), f"{r.choice(_NAMES)}@ex.test",
                     self.short(), self.text(big), ts, 0])
        if service == "chat":
            if small:
                i = self.new_id("chat", "channels")
                return ("INSERT INTO channels(id, name, topic) VALUES (?, ?, ?)",
                        [i, f"channel-{i}", self.short()])
            channel = self.pick("chat", "channels") or 0
            i = self.new_id("chat", "messages")
            return ("INSERT INTO messages(id, channel_id, author, body, sent_at) "
                    "VALUES (?, ?, ?, ?, ?)", [i, channel, r.choice(_NAMES), self.text(big), ts])
        if service == "shop":
            if small:
                i = self.new_id("shop", "products")
                return ("INSERT INTO products(id, sku, name, description, price_cents, stock, "
                        "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [i, f"SKU-{i:06d}", self.short(), self.text(big),
                         r.randint(100, 500_000), r.randint(0, 200), ts])
            product = self.pick("shop", "products") or 0
            i = self.new_id("shop", "orders")
            return ("INSERT INTO orders(id, product_id, quantity, status, note, placed_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [i, product, r.randint(1, 9), "placed", self.text(big), ts])
        if service == "crm":
            if small:
                i = self.new_id("crm", "accounts")
                return ("INSERT INTO accounts(id, name, industry, notes) VALUES (?, ?, ?, ?)",
                        [i, f"{r.choice(_NAMES).title()} AS", r.choice(_WORDS), self.text(big)])
            account = self.pick("crm", "accounts") or 0
            i = self.new_id("crm", "activities")
            return ("INSERT INTO activities(id, account_id, kind, body, happened_at) "
                    "VALUES (?, ?, ?, ?, ?)", [i, account, r.choice(_KINDS), self.text(big), ts])
        if small:
            i = self.new_id("docs", "pages")
            return ("INSERT INTO pages(id, title, body, updated_at) VALUES (?, ?, ?, ?)",
                    [i, self.short(), self.text(big), ts])
        page = self.pick("docs", "pages") or 0
        i = self.new_id("docs", "comments")
        return ("INSERT INTO comments(id, page_id, author, body, created_at) "
                "VALUES (?, ?, ?, ?, ?)", [i, page, r.choice(_NAMES), self.text(big), ts])

    def update(self, service: str, ts: str) -> tuple[str, list[Any]] | None:
        r, big = self.rng, self.p.payload
        if service == "mail":
            i = self.pick("mail", "messages")
            if i is None:
                return None
            if r.random() < 0.7:
                return "UPDATE messages SET is_read = 1 WHERE id = ?", [i]
            return "UPDATE messages SET mailbox = ?, body = ? WHERE id = ?", [
                "archive", self.text(big), i]
        if service == "chat":
            i = self.pick("chat", "messages")
            if i is None:
                return None
            return "UPDATE messages SET body = ?, edited_at = ? WHERE id = ?", [
                self.text(big), ts, i]
        if service == "shop":
            if r.random() < 0.5:
                i = self.pick("shop", "products")
                if i is None:
                    return None
                return ("UPDATE products SET stock = max(stock - ?, 0), updated_at = ? "
                        "WHERE id = ?", [r.randint(1, 3), ts, i])
            i = self.pick("shop", "orders")
            if i is None:
                return None
            return "UPDATE orders SET status = ? WHERE id = ?", [r.choice(_STATUSES), i]
        if service == "crm":
            i = self.pick("crm", "accounts")
            if i is None:
                return None
            return "UPDATE accounts SET notes = ? WHERE id = ?", [self.text(big), i]
        i = self.pick("docs", "pages")
        if i is None:
            return None
        return "UPDATE pages SET body = ?, updated_at = ? WHERE id = ?", [self.text(big), ts, i]

    def delete(self, service: str) -> tuple[str, list[Any]] | None:
        table = _DELETABLE[service]
        i = self.take(service, table)
        if i is None:
            return None
        return f"DELETE FROM {table} WHERE id = ?", [i]

    def file_event(self, base: dict[str, Any]) -> dict[str, Any]:
        r = self.rng
        if self.files and r.random() < 0.1:
            path = sorted(self.files)[r.randrange(len(self.files))]
            del self.files[path]
            return {**base, "type": "file_delete", "path": path}
        n = r.randrange(N_FILES)
        path = f"projects/p{n % 6}/{'notes' if n % 2 else 'report'}-{n}.md"
        self.files[path] = self.files.get(path, 0) + 1
        body = "\n".join(self.text(120) for _ in range(r.randint(8, 120)))
        return {**base, "type": "file_write", "path": path, "text": f"# {path}\n{body}\n"}


def generate(p: Params = Params()) -> Iterator[dict[str, Any]]:
    """Interchange lines (dicts), in file order."""
    g = _Gen(p)
    r = g.rng
    per_day = max(1, p.events // p.days)
    n = 0

    def line(day: int, k: int) -> dict[str, Any]:
        ts = START + timedelta(days=day, seconds=k * DAY_SPAN_S // per_day)
        return {"persona": PERSONA, "day": day, "ts": ts.strftime("%Y-%m-%dT%H:%M:%SZ")}

    for service in SERVICES:
        for sql in SCHEMA[service]:
            yield {**line(0, 0), "type": "sql", "service": service, "sql": sql}
            n += 1
    while n < p.events:
        day = min(n * p.days // p.events, p.days - 1)
        base = line(day, n - day * per_day)
        roll = r.random()
        if roll < 0.004:
            yield g.file_event(base)
            n += 1
            continue
        service = SERVICES[r.randrange(len(SERVICES))]
        stmt: tuple[str, list[Any]] | None
        if roll < 0.05:
            stmt = g.delete(service)
        elif roll < 0.17:
            stmt = g.update(service, base["ts"])
        else:
            stmt = g.insert(service, base["ts"], small=roll < 0.27)
        if stmt is None:  # nothing to update/delete yet
            stmt = g.insert(service, base["ts"], small=True)
        sql, params = stmt
        yield {**base, "type": "sql", "service": service, "sql": sql, "params": params}
        n += 1


def generate_realistic(p: Params) -> Iterator[dict[str, Any]]:
    """Interchange lines of the realistic shape: every table filled on day 0, then each
    day's events spread over 15 tables drawn for that day, plus about 5 file events."""
    g = _Gen(p)
    r = g.rng
    tables = [(s, f"t{k}") for s in REALISTIC_SERVICES for k in range(REALISTIC_TABLES)]
    per_day = max(1, p.events // p.days)
    first = int(p.events * p.day0_share) if p.day0_share else per_day
    later = max(1, (p.events - first) // max(1, p.days - 1)) if p.day0_share else per_day
    for day in range(p.days):
        picked = tables if day == 0 else r.sample(tables, REALISTIC_TOUCHED)
        per_day = first if day == 0 else later
        for k in range(per_day):
            ts = START + timedelta(days=day, seconds=k * DAY_SPAN_S // per_day)
            base = {"persona": PERSONA, "day": day, "ts": ts.strftime("%Y-%m-%dT%H:%M:%SZ")}
            if day == 0 and k < len(tables):
                yield {**base, "type": "sql", "service": tables[k][0],
                       "sql": _REALISTIC_DDL.format(table=tables[k][1])}
            elif k % (per_day // REALISTIC_FILES + 1) == 0:
                yield g.file_event(base)
            else:
                yield {**base, "type": "sql", "service": (where := r.choice(picked))[0],
                       **_realistic_statement(g, where, base["ts"])}


_REALISTIC_DDL = ("CREATE TABLE {table}(id INTEGER PRIMARY KEY, title TEXT NOT NULL, "
                  "body TEXT NOT NULL, n INTEGER NOT NULL, updated_at TEXT NOT NULL)")


def _realistic_statement(g: _Gen, where: tuple[str, str], ts: str) -> dict[str, Any]:
    service, table = where
    r = g.rng
    roll = r.random()
    if roll < 0.05 and (i := g.take(service, table)) is not None:
        return {"sql": f"DELETE FROM {table} WHERE id = ?", "params": [i]}
    if roll < 0.2 and (i := g.pick(service, table)) is not None:
        return {"sql": f"UPDATE {table} SET body = ?, n = n + 1, updated_at = ? WHERE id = ?",
                "params": [g.text(g.p.payload), ts, i]}
    i = g.new_id(service, table)
    return {"sql": f"INSERT INTO {table}(id, title, body, n, updated_at) VALUES (?, ?, ?, ?, ?)",
            "params": [i, g.short(), g.text(g.p.payload), r.randint(0, 99), ts]}


def write_world(path: Path, p: Params = Params()) -> int:
    """Write the interchange file; return the number of events."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with writing_file(path) as fh:
        for obj in (generate_realistic(p) if p.realistic else generate(p)):
            fh.write(json.dumps(obj, separators=(",", ":")).encode("utf-8"))
            fh.write(b"\n")
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--events", type=int, default=DEFAULT_EVENTS)
    ap.add_argument("--payload", type=int, default=DEFAULT_PAYLOAD)
    ap.add_argument("--days", type=int, default=DEFAULT_DAYS)
    ap.add_argument("--realistic", action="store_true", help="few tables touched a day")
    ap.add_argument("--day0-share", type=float, default=0.0,
                    help="share of the events on day 0 (realistic shape; 0: even days)")
    a = ap.parse_args(argv)
    count = write_world(a.out, Params(a.events, a.payload, a.days, a.realistic, a.day0_share))
    print(f"{a.out}: {count} events", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
