"""jobs/sjoboden/purchases.csv: W0's lines kept as they were, then exactly one new line in
their `sku,qty,for,status` format for PWR-SVK-SP6-3112 x2 with status `cart`; the
look-alike PWR-SVK-SP6-3107 is not listed."""

import csv

import awsdk

FILE = "jobs/sjoboden/purchases.csv"
TARGET = "PWR-SVK-SP6-3112"
LOOKALIKE = "PWR-SVK-SP6-3107"

ws = awsdk.worlds()
before = (awsdk.file_text(ws.w0, FILE) or "").splitlines()
text = awsdk.file_text(ws.w, FILE)
after = (text or "").splitlines()
added = [row for row in csv.reader(line for line in after[len(before):] if line.strip())]
awsdk.result(
    existing_lines_kept=bool(before) and after[: len(before)] == before,
    target_line_x2=any(len(row) >= 2 and row[0].strip().upper() == TARGET
                       and row[1].strip() == "2" for row in added),
    one_new_line_in_the_file_format=len(added) == 1 and len(added[0]) == 4
    and added[0][3].strip().lower() == "cart",
    lookalike_not_listed=LOOKALIKE not in (text or "").upper(),
)
