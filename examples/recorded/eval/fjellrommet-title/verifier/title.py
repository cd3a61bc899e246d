"""summary.txt holds exactly the brief's title; no note changed; the answer names it."""

import awsdk

TITLE = "Nordlys Studio - Fjellrommet brief"

ws = awsdk.worlds()
summary = awsdk.file_text(ws.w, "summary.txt")
notes = awsdk.row_diff(ws.w0, ws.w, "notes", "notes")
awsdk.result(
    summary_is_the_title=summary is not None and summary.strip() == TITLE,
    notes_unchanged=not (notes.added or notes.removed or notes.changed),
    answer_names_the_title=awsdk.contains(ws.answer, TITLE),
)
