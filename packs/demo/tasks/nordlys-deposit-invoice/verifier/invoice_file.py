"""The deposit invoice in the workspace: the next number, the client's PO, the quote and
a 30 % deposit on NOK 159,544.00 excl. MVA (quote Q-2026-014, approved in chat on day 2)."""

import awsdk

# Next after 2026-018 and 2026-019 in the "Invoicing - February" note (note 2).
INVOICE = "invoices/2026-020.md"
QUOTE = "jobs/nordlys/quote-Q-2026-014.md"

ws = awsdk.worlds()
text = awsdk.file_text(ws.w, INVOICE)
awsdk.result(
    invoice_file_created=text is not None and awsdk.file_text(ws.w0, INVOICE) is None,
    names_client=awsdk.contains(text, "Nordlys Studio"),
    names_client_po=awsdk.contains(text, "NS-PO-2026-031"),
    names_quote=awsdk.contains(text, "Q-2026-014"),
    deposit_excl_mva=awsdk.has_amount(text, "47863.20"),
    mva_of_deposit=awsdk.has_amount(text, "11965.80"),
    total_incl_mva=awsdk.has_amount(text, "59829.00"),
    quote_untouched=awsdk.file_text(ws.w, QUOTE) == awsdk.file_text(ws.w0, QUOTE),
)
