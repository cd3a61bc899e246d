"""The final answer names the SKU put in the cart: PWR-SVK-SP6-3112 (however it is
written: "PWR-SVK-SP6-3112", "pwr svk sp6 3112")."""

import awsdk

TARGET = "PWRSVKSP63112"

ws = awsdk.worlds()
awsdk.result(
    answer_names_target_sku=TARGET in "".join(ch for ch in ws.answer.upper() if ch.isalnum()),
)
