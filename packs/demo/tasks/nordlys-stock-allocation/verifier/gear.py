"""inventory/gear.csv: exactly the BOM quantity of each `stock` line of W0's bom.md is at
location `nordlys`; a row with more than that is split, the rest staying where it was;
totals, item names and conditions are kept, and every other row is untouched."""

import csv
import io
import re
from pathlib import Path

import awsdk

GEAR = "inventory/gear.csv"
BOM = "jobs/nordlys/bom.md"
JOB_LOCATION = "nordlys"
ITEM, SKU, QTY, LOCATION, CONDITION = range(5)
# A BOM table row: | # | SKU | Item | Qty | Unit NOK | Line NOK | Source |
BOM_ROW = re.compile(r"^\|\s*\d+\s*\|\s*(?P<sku>[A-Za-z0-9-]+)\s*\|.*\|\s*(?P<qty>\d+)\s*\|"
                     r"[^|]*\|[^|]*\|\s*(?P<source>order|stock)\s*\|\s*$")

ws = awsdk.worlds()


def table(world: Path) -> list[list[str]]:
    text = awsdk.file_text(world, GEAR)
    return list(csv.reader(io.StringIO(text))) if text else [[]]


def qty(row: list[str]) -> int:
    return int(row[QTY]) if len(row) == 5 and row[QTY].strip().isdigit() else -1


def stock_lines() -> dict[str, int]:
    found: dict[str, int] = {}
    for line in (awsdk.file_text(ws.w0, BOM) or "").splitlines():
        match = BOM_ROW.match(line)
        if match and match["source"] == "stock":
            found[match["sku"]] = int(match["qty"])
    return found


(header0, *rows0), (header, *rows) = table(ws.w0), table(ws.w)
stock = stock_lines()


def of(table_rows: list[list[str]], sku: str) -> list[list[str]]:
    return [r for r in table_rows if len(r) == 5 and r[SKU] == sku]


def allocated(sku: str) -> int:
    return sum(qty(r) for r in of(rows, sku) if r[LOCATION] == JOB_LOCATION)


def rest_stays_put(sku: str) -> bool:
    places = {r[LOCATION] for r in of(rows0, sku)}
    return all(r[LOCATION] in places for r in of(rows, sku) if r[LOCATION] != JOB_LOCATION)


awsdk.result(
    header_kept=bool(header0) and header == header0,
    rows_well_formed=all(qty(r) >= 0 for r in rows),
    stock_lines_allocated_to_nordlys=len(stock) == 3
    and all(allocated(sku) == n for sku, n in stock.items()),
    stock_totals_kept=all(sum(map(qty, of(rows, sku))) == sum(map(qty, of(rows0, sku)))
                          for sku in stock),
    rest_stays_where_it_was=all(rest_stays_put(sku) for sku in stock),
    items_and_conditions_kept=all(
        {(r[ITEM], r[CONDITION]) for r in of(rows, sku)}
        <= {(r[ITEM], r[CONDITION]) for r in of(rows0, sku)} for sku in stock),
    other_rows_untouched=sorted(r for r in rows if len(r) != 5 or r[SKU] not in stock)
    == sorted(r for r in rows0 if r[SKU] not in stock),
)
