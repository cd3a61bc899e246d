"""Scripted model answers for environment synthesis (tests/support/llm_server.py rules): one small
scenario, ``library_loans``, whose answers include a failure at every stage that can fail,
so that each self-correction branch runs:

* schema: attempt 1 has a typo (``CREAT TABLE``), attempt 2 is right;
* data: attempt 1 inserts a loan naming a missing book (a foreign key), attempt 2 is right;
* code: attempt 1 raises when it is loaded, attempt 2 is right;
* verifier of task 1: attempt 1 passes at W0; attempt 2 checks only the answer, which
  stage 6 accepts but the gates reject as too easy (agents that leave out the borrowing
  pass it too), so the gates' reviser asks again (``REVISION``) and gets the right one;
* verifier of task 2: attempt 1's reference solution returns the wrong loan, attempt 2 is
  right.

A rule for attempt 2 matches the regeneration message (``RETRY``), so it comes first.
"""

from __future__ import annotations

import json
from typing import Any

SCENARIO = {"name": "library_loans", "description": (
    "A lending library's member portal: members search the catalogue of books, borrow "
    "available copies with a due date, return them, and see their loans.")}
RETRY = "Earlier attempts at this failed"
TASK_1 = "Borrow the book titled 'Dune' for me with the due date 2026-02-20."
TASK_2 = "Return my loan of the book 'Neuromancer'."
TASKS = [TASK_1, TASK_2]

TABLES_OK: list[dict[str, Any]] = [
    {"name": "users", "ddl": "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                             "created_at TEXT, updated_at TEXT)"},
    {"name": "books", "ddl": "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL, "
                             "author TEXT, available INTEGER NOT NULL DEFAULT 1, "
                             "created_at TEXT, updated_at TEXT)",
     "indexes": ["CREATE INDEX idx_books_title ON books(title)"]},
    {"name": "loans", "ddl": "CREATE TABLE loans (id INTEGER PRIMARY KEY, user_id INTEGER NOT "
                             "NULL REFERENCES users(id), book_id INTEGER NOT NULL REFERENCES "
                             "books(id), due_date TEXT NOT NULL, returned INTEGER NOT NULL "
                             "DEFAULT 0, created_at TEXT, updated_at TEXT)"},
]
TABLES_TYPO = [*TABLES_OK[:2], {**TABLES_OK[2], "ddl": TABLES_OK[2]["ddl"].replace(
    "CREATE TABLE", "CREAT TABLE")}]

T0 = "'2026-01-10T09:00:00Z'"
USERS = [f"INSERT INTO users (id, name, created_at, updated_at) VALUES ({i}, '{n}', {T0}, {T0})"
         for i, n in ((1, "Ada Berg"), (2, "Bo Lind"))]
BOOKS = [f"INSERT INTO books (id, title, author, available, created_at, updated_at) VALUES "
         f"({i}, '{t}', '{a}', {av}, {T0}, {T0})"
         for i, t, a, av in ((1, "Dune", "Frank Herbert", 1),
                             (2, "Neuromancer", "William Gibson", 0),
                             (3, "Emma", "Jane Austen", 1),
                             (4, "Dune Messiah", "Frank Herbert", 1))]
LOANS = [f"INSERT INTO loans (id, user_id, book_id, due_date, returned, created_at, updated_at) "
         f"VALUES ({i}, {u}, {b}, '{d}', {r}, {T0}, {T0})"
         for i, u, b, d, r in ((1, 2, 3, "2026-01-20", 1), (2, 1, 2, "2026-01-25", 0))]
BAD_LOAN = ("INSERT INTO loans (id, user_id, book_id, due_date, returned, created_at, updated_at) "
            f"VALUES (3, 1, 99, '2026-01-30', 0, {T0}, {T0})")
DATA_OK = [{"table": "users", "statements": USERS}, {"table": "books", "statements": BOOKS},
           {"table": "loans", "statements": LOANS}]
DATA_FK = [*DATA_OK[:2], {"table": "loans", "statements": [*LOANS, BAD_LOAN]}]


def _param(name: str, kind: str, example: Any, description: str) -> dict[str, Any]:
    return {"name": name, "type": kind, "description": description, "required": True,
            "example": example}


SPEC = [
    {"operation_id": "search_books", "summary": "Search the catalogue by title",
     "description": "Books whose title contains the query, with their availability.",
     "parameters": [_param("query", "string", "Dune", "Part of the title")],
     "response": {"type": "array"}, "tables": ["books"], "fields": ["books.title"],
     "writes": False},
    {"operation_id": "borrow_book", "summary": "Borrow an available book",
     "description": "Creates a loan for the logged-in member and marks the book unavailable.",
     "parameters": [_param("book_id", "integer", 1, "The book's id"),
                    _param("due_date", "string", "2026-02-20", "Due date, YYYY-MM-DD")],
     "response": {"type": "object"}, "tables": ["books", "loans"],
     "fields": ["loans.book_id", "loans.due_date", "books.available"], "writes": True},
    {"operation_id": "list_loans", "summary": "List my loans",
     "description": "The logged-in member's loans, open ones first.",
     "parameters": [], "response": {"type": "array"}, "tables": ["loans"],
     "fields": ["loans.user_id"], "writes": False},
    {"operation_id": "return_book", "summary": "Return a loan",
     "description": "Marks one of the member's loans returned and the book available again.",
     "parameters": [_param("loan_id", "integer", 2, "The loan's id")],
     "response": {"type": "object"}, "tables": ["books", "loans"],
     "fields": ["loans.returned", "books.available"], "writes": True},
]

CODE_OK = '''\
from typing import Annotated, Any

from pydantic import Field

from worldenv.core.app import App, ToolContext, ToolError

app = App(service="awm", name="synth-library-loans", version="1.0.0")


@app.tool(writes=False)
def search_books(ctx: ToolContext,
                 query: Annotated[str, Field(description="Part of the title")]
                 ) -> list[dict[str, Any]]:
    """Books whose title contains the query."""
    return ctx.rows("SELECT id, title, author, available FROM books WHERE title LIKE ? "
                    "ORDER BY id", (f"%{query}%",))


@app.tool(writes=True)
def borrow_book(ctx: ToolContext, book_id: Annotated[int, Field(description="The book's id")],
                due_date: Annotated[str, Field(description="Due date")]) -> dict[str, Any]:
    """Borrow an available book."""
    book = ctx.require(ctx.row("SELECT id, available FROM books WHERE id = ?", (book_id,)),
                       "book", book_id)
    if not book["available"]:
        raise ToolError(f"Book {book_id} is on loan")
    loan_id = ctx.next_id("loans")
    ctx.insert("loans", {"id": loan_id, "user_id": ctx.user_id, "book_id": book_id,
                         "due_date": due_date, "returned": 0, "created_at": ctx.now,
                         "updated_at": ctx.now})
    ctx.execute("UPDATE books SET available = 0, updated_at = ? WHERE id = ?", (ctx.now, book_id))
    return {"loan_id": loan_id, "book_id": book_id, "due_date": due_date}


@app.tool(writes=False)
def list_loans(ctx: ToolContext) -> list[dict[str, Any]]:
    """My loans, open ones first."""
    return ctx.rows("SELECT l.id, l.book_id, b.title, l.due_date, l.returned FROM loans l "
                    "JOIN books b ON b.id = l.book_id WHERE l.user_id = ? "
                    "ORDER BY l.returned, l.id", (ctx.user_id,))


@app.tool(writes=True)
def return_book(ctx: ToolContext, loan_id: Annotated[int, Field(description="The loan's id")]
                ) -> dict[str, Any]:
    """Return one of my loans."""
    loan = ctx.require(ctx.row("SELECT id, book_id, returned FROM loans WHERE id = ? AND "
                               "user_id = ?", (loan_id, ctx.user_id)), "loan", loan_id)
    if loan["returned"]:
        raise ToolError(f"Loan {loan_id} is returned already")
    ctx.execute("UPDATE loans SET returned = 1, updated_at = ? WHERE id = ?", (ctx.now, loan_id))
    ctx.execute("UPDATE books SET available = 1, updated_at = ? WHERE id = ?",
                (ctx.now, loan["book_id"]))
    return {"loan_id": loan_id, "returned": True}
'''
CODE_RAISES = "raise RuntimeError('the generated module fails on import')\n" + CODE_OK

VERIFY_BORROW = '''\
import awsdk

ws = awsdk.worlds()
added = [r for r in awsdk.row_diff(ws.w0, ws.w, "awm", "loans").added if r["user_id"] == 1]
dune = awsdk.rows(ws.w, "awm", "SELECT available FROM books WHERE title = 'Dune'")
awsdk.result(
    dune_borrowed=len(added) == 1 and added[0]["book_id"] == 1,
    due_date_set=len(added) == 1 and added[0]["due_date"] == "2026-02-20",
    dune_unavailable=bool(dune) and dune[0]["available"] == 0,
)
'''
VERIFY_AT_W0 = '''\
import awsdk

ws = awsdk.worlds()
dune = awsdk.rows(ws.w, "awm", "SELECT id FROM books WHERE title = 'Dune'")
awsdk.result(dune_in_catalogue=len(dune) == 1)
'''
VERIFY_RETURN = '''\
import awsdk

ws = awsdk.worlds()
loan = awsdk.rows(ws.w, "awm", "SELECT returned FROM loans WHERE id = 2")
book = awsdk.rows(ws.w, "awm", "SELECT available FROM books WHERE title = 'Neuromancer'")
awsdk.result(loan_returned=bool(loan) and loan[0]["returned"] == 1,
             book_available=bool(book) and book[0]["available"] == 1)
'''


def _verifier(code: str, solution: list[dict[str, Any]], answer: str) -> dict[str, Any]:
    return {"verifier": code, "success_criteria": "The task's change is in the database.",
            "failure_criteria": "The change is missing or another record was changed.",
            "solution": solution, "answer": answer}


BORROW_OK = _verifier(VERIFY_BORROW, [
    {"tool": "search_books", "arguments": {"query": "Dune"}},
    {"tool": "borrow_book", "arguments": {"book_id": 1, "due_date": "2026-02-20"}}],
    "You have borrowed Dune, due 2026-02-20.")
BORROW_AT_W0 = {**BORROW_OK, "verifier": VERIFY_AT_W0}
VERIFY_ANSWER_ONLY = '''\
import awsdk

ws = awsdk.worlds()
awsdk.result(answer_names_dune=awsdk.contains(ws.answer, "Dune"))
'''
BORROW_ANSWER_ONLY = {**BORROW_OK, "verifier": VERIFY_ANSWER_ONLY}
REVISION = "the quality gates rejected the task"  # synth.environments.verifiers.REVISION_HEAD
RETURN_OK = _verifier(VERIFY_RETURN, [
    {"tool": "list_loans", "arguments": {}},
    {"tool": "return_book", "arguments": {"loan_id": 2}}], "Neuromancer is returned.")
RETURN_WRONG = {**RETURN_OK, "solution": [{"tool": "list_loans", "arguments": {}}]}


def _json(value: Any) -> str:
    return json.dumps(value)


def rules() -> list[dict[str, Any]]:
    """The loopback server's rules for one run over SCENARIO (see the module docstring)."""
    summary = ("Root cause: the failing statements named above. Fix: correct them and write "
               "the whole output again.")
    return [
        {"when": {"any_contains": "synth prompt summarize@v1"}, "reply": {"content": summary}},
        {"when": {"any_contains": "synth prompt tasks@v1"},
         "reply": {"content": _json({"tasks": TASKS})}},
        {"when": {"any_contains": "synth prompt schema@v1", "last_contains": RETRY},
         "reply": {"content": _json({"tables": TABLES_OK})}},
        {"when": {"any_contains": "synth prompt schema@v1"},
         "reply": {"content": _json({"tables": TABLES_TYPO})}},
        {"when": {"any_contains": "synth prompt data@v1", "last_contains": RETRY},
         "reply": {"content": _json({"inserts": DATA_OK})}},
        {"when": {"any_contains": "synth prompt data@v1"},
         "reply": {"content": _json({"inserts": DATA_FK})}},
        {"when": {"any_contains": "synth prompt spec@v1"},
         "reply": {"content": _json({"tools": SPEC})}},
        {"when": {"any_contains": "synth prompt code@v1", "last_contains": RETRY},
         "reply": {"content": _json({"code": CODE_OK})}},
        {"when": {"any_contains": "synth prompt code@v1"},
         "reply": {"content": _json({"code": CODE_RAISES})}},
        {"when": {"any_contains": "Task: Borrow", "last_contains": REVISION},
         "reply": {"content": _json(BORROW_OK)}},
        {"when": {"any_contains": "Task: Borrow", "last_contains": RETRY},
         "reply": {"content": _json(BORROW_ANSWER_ONLY)}},
        {"when": {"any_contains": "Task: Borrow"}, "reply": {"content": _json(BORROW_AT_W0)}},
        {"when": {"any_contains": "Task: Return", "last_contains": RETRY},
         "reply": {"content": _json(RETURN_OK)}},
        {"when": {"any_contains": "Task: Return"}, "reply": {"content": _json(RETURN_WRONG)}},
    ]


def scenarios_line() -> str:
    return json.dumps({**SCENARIO, "category": "library"}) + "\n"
