"""Kari (conversation 4) gets a reply with the total incl. MVA, and her conversation is
read: her day-7 question about the concert (message 66) was unread in W0."""

import awsdk

KARI_CONVERSATION = 4
LARS = 1

ws = awsdk.worlds()
replies = [row["body"] for row in awsdk.row_diff(ws.w0, ws.w, "chat", "messages").added
           if row["conversation_id"] == KARI_CONVERSATION and row["sender_id"] == LARS]
unread = "SELECT COUNT(*) FROM messages WHERE conversation_id = ? AND sender_id <> ? " \
         "AND is_read = 0"
awsdk.result(
    kari_told_total=any(awsdk.has_amount(body, "14062.50") for body in replies),
    kari_conversation_read=awsdk.value(ws.w, "chat", unread, (KARI_CONVERSATION, LARS)) == 0,
)
