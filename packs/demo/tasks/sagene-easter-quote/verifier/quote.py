"""jobs/sagene/easter-concert-quote.md at the 2026 rates (docs/rates.md): day rate
7,200.00 + 50 % evening/weekend surcharge = 10,800.00, one Oslo trip 450.00, 11,250.00
excl. MVA, 2,812.50 MVA, 14,062.50 incl. MVA."""

import awsdk

QUOTE = "jobs/sagene/easter-concert-quote.md"

ws = awsdk.worlds()
text = awsdk.file_text(ws.w, QUOTE)
awsdk.result(
    quote_created=text is not None and awsdk.file_text(ws.w0, QUOTE) is None,
    day_with_surcharge=awsdk.has_amount(text, "10800.00"),
    one_trip=awsdk.has_amount(text, "450.00"),
    total_excl_mva=awsdk.has_amount(text, "11250.00"),
    mva=awsdk.has_amount(text, "2812.50"),
    total_incl_mva=awsdk.has_amount(text, "14062.50"),
)
