import awsdk

ws = awsdk.worlds()
loan = awsdk.rows(ws.w, "awm", "SELECT returned FROM loans WHERE id = 2")
book = awsdk.rows(ws.w, "awm", "SELECT available FROM books WHERE title = 'Neuromancer'")
awsdk.result(loan_returned=bool(loan) and loan[0]["returned"] == 1,
             book_available=bool(book) and book[0]["available"] == 1)
