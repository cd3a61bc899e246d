import awsdk

ws = awsdk.worlds()
added = [r for r in awsdk.row_diff(ws.w0, ws.w, "awm", "loans").added if r["user_id"] == 1]
dune = awsdk.rows(ws.w, "awm", "SELECT available FROM books WHERE title = 'Dune'")
awsdk.result(
    dune_borrowed=len(added) == 1 and added[0]["book_id"] == 1,
    due_date_set=len(added) == 1 and added[0]["due_date"] == "2026-02-20",
    dune_unavailable=bool(dune) and dune[0]["available"] == 0,
)
