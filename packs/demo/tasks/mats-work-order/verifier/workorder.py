"""jobs/nordlys/workorder-mats.md: the job, the install days as moved on day 4 (not the
11-12 March of the quote and the early chats), Mats's day rate and the total."""

import awsdk

WORK_ORDER = "jobs/nordlys/workorder-mats.md"

ws = awsdk.worlds()
text = awsdk.file_text(ws.w, WORK_ORDER)
awsdk.result(
    work_order_created=text is not None and awsdk.file_text(ws.w0, WORK_ORDER) is None,
    names_job=awsdk.contains(text, "NS-2026-03"),
    install_day_1_date=awsdk.contains(text, "2026-03-12"),
    install_day_2_date=awsdk.contains(text, "2026-03-13"),
    no_stale_install_date=text is not None and "2026-03-11" not in text,
    day_rate=awsdk.has_amount(text, "5800.00"),
    total_excl_mva=awsdk.has_amount(text, "11600.00"),
)
