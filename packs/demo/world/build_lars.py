#!/usr/bin/env python3
"""Generate the bundled demo world ``lars.jsonl`` (persona ``lars``).

Lars Eriksen is a freelance audio-video technician in Oslo.  Over eight
world days (2026-03-02 .. 2026-03-09) he wins, orders and prepares the
meeting-room install at Nordlys Studio, and starts a second small job.
See README.md next to this file for the story day by day.

Standard library only, fully deterministic (no randomness, no clock):
running ``python packs/demo/world/build_lars.py`` rewrites
``lars.jsonl`` next to this script byte for byte.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import struct
import zlib
from datetime import date, timedelta

PERSONA = "lars"
START = date(2026, 3, 2)  # world day 0 (a Monday)
OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lars.jsonl")

NOW = "\x00NOW\x00"  # placeholder in params, replaced by the event's ts


# --------------------------------------------------------------------------
# Event emitter
# --------------------------------------------------------------------------


class World:
    def __init__(self, persona: str = PERSONA, start: date = START) -> None:
        self.persona = persona
        self.start = start
        self.events: list[dict] = []
        self.day_no: int | None = None
        self.secs = 0
        self.last_ts = ""

    # clock ---------------------------------------------------------------
    def day(self, d: int, hhmm: str) -> None:
        assert self.day_no is None or d == self.day_no + 1, d
        self.day_no = d
        self.secs = 0
        self.at(hhmm)

    def at(self, hhmm: str) -> None:
        h, m = (int(x) for x in hhmm.split(":"))
        t = h * 3600 + m * 60
        assert t >= self.secs, f"clock going backwards on day {self.day_no}: {hhmm}"
        self.secs = t

    @property
    def date(self) -> date:
        return self.start + timedelta(days=self.day_no)

    @property
    def now(self) -> str:
        s = self.secs
        return f"{self.date.isoformat()}T{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}Z"

    # emit ----------------------------------------------------------------
    def _emit(self, typ: str, fields: dict) -> str:
        ts = self.now
        assert ts >= self.last_ts
        ev = {"persona": self.persona, "day": self.day_no, "ts": ts, "type": typ}
        ev.update(fields)
        self.events.append(ev)
        self.last_ts = ts
        self.secs += 1
        assert self.secs < 86400
        return ts

    def sql(self, service: str, stmt: str, params=None) -> str:
        stmt = " ".join(stmt.split()).replace("( ", "(")
        ts = self.now
        fields: dict = {"service": service, "sql": stmt}
        if params is not None:
            if isinstance(params, dict):
                params = {k: (ts if v == NOW else v) for k, v in params.items()}
            else:
                params = [ts if v == NOW else v for v in params]
            fields["params"] = params
        return self._emit("sql", fields)

    def insert(self, service: str, table: str, **cols) -> str:
        names = ", ".join(cols)
        marks = ", ".join("?" for _ in cols)
        return self.sql(service, f"INSERT INTO {table}({names}) VALUES ({marks})", list(cols.values()))

    def write(self, path: str, text: str) -> str:
        return self._emit("file_write", {"path": path, "text": text})

    def write_bytes(self, path: str, data: bytes) -> str:
        return self._emit("file_write", {"path": path, "base64": base64.b64encode(data).decode("ascii")})

    def delete(self, path: str) -> str:
        return self._emit("file_delete", {"path": path})

    def pin_app(self, service: str, app: str, version: str, digest: str) -> str:
        return self._emit("app", {"service": service, "app": app, "version": version,
                                  "digest": digest})

    def dump(self) -> str:
        return "".join(
            json.dumps(ev, ensure_ascii=False, separators=(",", ":")) + "\n" for ev in self.events
        )


W = World()


def nok(ore: int) -> str:
    """Format an amount in øre as 'NOK 1,234.50'-style number (no prefix)."""
    return f"{ore // 100:,}.{ore % 100:02d}"


def oslo(day_iso: str, hhmm: str) -> str:
    """Local Oslo wall-clock time (CET, UTC+1 in early March 2026)."""
    return f"{day_iso}T{hhmm}:00+01:00"


# --------------------------------------------------------------------------
# Static data: people, catalogue, job
# --------------------------------------------------------------------------

# id, name, handle, email, phone, company, title  (same ids in chat + calendar)
PEOPLE = [
    (1, "Lars Eriksen", "lars", "lars@eriksen-av.no", "+47 912 34 567", "Eriksen Lyd & Bilde", "Freelance AV technician"),
    (2, "Ingrid Solberg", "ingrid.solberg", "ingrid@nordlysstudio.no", "+47 934 55 120", "Nordlys Studio AS", "Studio manager"),
    (3, "Mats Berg", "mats.berg", "mats@bergrigging.no", "+47 976 10 442", "Berg Rigging", "AV technician (subcontractor)"),
    (4, "Kari Haugen", "kari.haugen", "kari@sagenescene.no", "+47 401 22 981", "Sagene Scene", "Venue manager"),
    (5, "Anders Lie", "anders.lie", "anders.lie@avlager.no", "+47 223 40 017", "AVLager AS", "Key account manager"),
    (6, "Erik Dahl", "erik.dahl", "erik@nordlysstudio.no", "+47 934 55 133", "Nordlys Studio AS", "IT manager"),
    (7, "Henrik Strand", "henrik.strand", "henrik@strandelektro.no", "+47 482 90 315", "Strand Elektro", "Electrician"),
]
SOFIE = (8, "Sofie Nilsen", "sofie.nilsen", "sofie@bakerietfjord.no", "+47 915 67 208", "Bakeriet Fjord", "Owner")

CATEGORIES = [
    # id, slug, name
    (1, "cables", "Cables"),
    (2, "mixers", "Mixers"),
    (3, "projectors", "Projectors & screens"),
    (4, "displays", "Professional displays"),
    (5, "mounts", "Mounts & stands"),
    (6, "microphones", "Microphones"),
    (7, "dsp", "Audio DSPs & processors"),
    (8, "speakers", "Speakers"),
    (9, "amplifiers", "Amplifiers"),
    (10, "av-switching", "AV switching & extenders"),
    (11, "network", "Network switches"),
    (12, "conferencing", "Cameras & conferencing"),
    (13, "power-racks", "Power & racks"),
    (14, "consumables", "Consumables"),
]

# sku, category slug, name, brand, unit, price NOK (excl. MVA), stock at day 0
PRODUCTS = [
    ("CBL-HDMI-2M", "cables", "HDMI 2.1 cable 2 m", "Kramer", "pcs", 349, 140),
    ("CBL-HDMI-5M", "cables", "HDMI 2.1 cable 5 m", "Kramer", "pcs", 549, 62),
    ("CBL-HDMI-AOC10", "cables", "HDMI 2.0 active optical cable 10 m", "Kramer", "pcs", 1490, 18),
    ("CBL-USBC-3M", "cables", "USB-C 3.2 Gen 2 cable 3 m", "Belkin", "pcs", 399, 45),
    ("CBL-CAT6-305", "cables", "Cat6 U/UTP installation cable 305 m box", "Draka", "box", 2290, 24),
    ("CBL-CAT6-P1", "cables", "Cat6 patch cable 1 m (5-pack)", "Deltaco", "pack", 249, 80),
    ("CBL-CAT6-P3", "cables", "Cat6 patch cable 3 m", "Deltaco", "pcs", 89, 200),
    ("CBL-XLR-5M", "cables", "XLR microphone cable 5 m", "Cordial", "pcs", 229, 90),
    ("CBL-XLR-10M", "cables", "XLR microphone cable 10 m", "Cordial", "pcs", 319, 75),
    ("CBL-SPK-2x25-100", "cables", "Speaker cable 2x2.5 mm² 100 m drum", "Procab", "drum", 1890, 12),
    ("CBL-SPK-2x15-100", "cables", "Speaker cable 2x1.5 mm² 100 m drum", "Procab", "drum", 1190, 16),
    ("CBL-DP-HDMI-2M", "cables", "DisplayPort to HDMI cable 2 m", "Deltaco", "pcs", 279, 38),
    ("MIX-YAM-MG10XU", "mixers", "Yamaha MG10XU 10-channel mixer", "Yamaha", "pcs", 3490, 9),
    ("MIX-BEH-X32C", "mixers", "Behringer X32 Compact digital mixer", "Behringer", "pcs", 21990, 3),
    ("MIX-ALH-CQ18T", "mixers", "Allen & Heath CQ-18T digital mixer", "Allen & Heath", "pcs", 14990, 4),
    ("MIX-SOU-SIG12", "mixers", "Soundcraft Signature 12 MTK", "Soundcraft", "pcs", 5990, 6),
    ("MIX-YAM-DM3", "mixers", "Yamaha DM3 Standard digital mixer", "Yamaha", "pcs", 27990, 2),
    ("PRJ-EPS-EBL630U", "projectors", "Epson EB-L630U laser projector 6200 lm", "Epson", "pcs", 29990, 4),
    ("PRJ-BEN-LU935", "projectors", "BenQ LU935 laser projector 6000 lm", "BenQ", "pcs", 24990, 3),
    ("PRJ-PAN-VMZ61", "projectors", "Panasonic PT-VMZ61 LCD laser projector", "Panasonic", "pcs", 21490, 5),
    ("PRJ-SCR-120", "projectors", "Motorised projection screen 120\" 16:10", "Celexon", "pcs", 6490, 7),
    ("DIS-SAM-QM75C", "displays", "Samsung QM75C 75\" 4K professional display", "Samsung", "pcs", 21990, 6),
    ("DIS-SAM-QM65C", "displays", "Samsung QM65C 65\" 4K professional display", "Samsung", "pcs", 13990, 9),
    ("DIS-LG-86UH5", "displays", "LG 86UH5N 86\" 4K signage display", "LG", "pcs", 39990, 2),
    ("DIS-SON-FW55", "displays", "Sony FW-55BZ30L 55\" 4K professional display", "Sony", "pcs", 11490, 5),
    ("MNT-VOG-PFW6852", "mounts", "Vogel's PFW 6852 fixed wall mount 55-100\"", "Vogel's", "pcs", 2490, 14),
    ("MNT-VOG-PFW6400", "mounts", "Vogel's PFW 6400 fixed wall mount 40-65\"", "Vogel's", "pcs", 1890, 21),
    ("MNT-CHF-RPMAU", "mounts", "Chief RPMAU universal projector mount", "Chief", "pcs", 2190, 8),
    ("MNT-CHF-CMS012", "mounts", "Chief CMS012 fixed extension column 30 cm", "Chief", "pcs", 890, 11),
    ("MNT-KM-24180", "mounts", "K&M 24180 speaker wall bracket (pair)", "K&M", "pair", 790, 15),
    ("MNT-KM-21020", "mounts", "K&M 21020 tripod microphone stand with boom", "K&M", "pcs", 549, 40),
    ("MIC-SEN-TCCM", "microphones", "Sennheiser TeamConnect Ceiling Medium", "Sennheiser", "pcs", 24990, 3),
    ("MIC-SHU-MXA310", "microphones", "Shure MXA310 table array microphone", "Shure", "pcs", 16490, 5),
    ("MIC-SHU-SM58", "microphones", "Shure SM58 dynamic vocal microphone", "Shure", "pcs", 1190, 60),
    ("MIC-SHU-BLX24", "microphones", "Shure BLX24E/SM58 wireless handheld system", "Shure", "pcs", 3990, 12),
    ("MIC-SEN-EWD-ME2", "microphones", "Sennheiser EW-D ME2 lavalier set", "Sennheiser", "pcs", 6990, 7),
    ("MIC-AT-ES945", "microphones", "Audio-Technica ES945 boundary microphone", "Audio-Technica", "pcs", 2890, 10),
    ("DSP-SHU-P300", "dsp", "Shure IntelliMix P300 audio conferencing processor", "Shure", "pcs", 11990, 7),
    ("DSP-BIA-TFX400", "dsp", "Biamp TesiraFORTÉ X 400", "Biamp", "pcs", 29990, 2),
    ("DSP-QSC-CORE8", "dsp", "QSC Core 8 Flex processor", "QSC", "pcs", 34990, 2),
    ("DSP-DBX-DRPA2", "dsp", "dbx DriveRack PA2 loudspeaker management", "dbx", "pcs", 5990, 6),
    ("SPK-JBL-C26CT", "speakers", "JBL Control 26CT ceiling speaker (pair)", "JBL", "pair", 2990, 20),
    ("SPK-JBL-C25-1", "speakers", "JBL Control 25-1 wall speaker (pair)", "JBL", "pair", 3890, 10),
    ("SPK-GEN-8020D", "speakers", "Genelec 8020D active studio monitor", "Genelec", "pcs", 4990, 8),
    ("SPK-QSC-K122", "speakers", "QSC K12.2 active loudspeaker", "QSC", "pcs", 12990, 6),
    ("SPK-BOS-DM3SE", "speakers", "Bose DesignMax DM3SE surface speaker (pair)", "Bose", "pair", 3290, 9),
    ("SPK-YAM-DXR10", "speakers", "Yamaha DXR10mkII active loudspeaker", "Yamaha", "pcs", 8490, 5),
    ("AMP-JBL-CSA2120Z", "amplifiers", "JBL CSA 2120Z 2x120 W installation amplifier", "JBL", "pcs", 5490, 8),
    ("AMP-CRW-DCI2300", "amplifiers", "Crown DCi 2|300 installation amplifier", "Crown", "pcs", 9990, 4),
    ("AMP-QSC-SPA2-60", "amplifiers", "QSC SPA2-60 2x60 W amplifier", "QSC", "pcs", 4290, 7),
    ("SWI-KRA-VS411X", "av-switching", "Kramer VS-411X 4x1 4K HDMI auto switcher", "Kramer", "pcs", 3490, 11),
    ("SWI-EXT-DTP230", "av-switching", "Extron DTP HDMI 4K 230 Tx/Rx extender set", "Extron", "set", 8990, 4),
    ("SWI-KRA-VP440", "av-switching", "Kramer VP-440H2 presentation switcher/scaler", "Kramer", "pcs", 10990, 3),
    ("SWI-ATL-HDBT100", "av-switching", "Atlona HDBaseT extender kit 100 m", "Atlona", "set", 5490, 6),
    ("WPS-BAR-CX30", "conferencing", "Barco ClickShare CX-30 wireless conferencing", "Barco", "pcs", 17490, 0),
    ("WPS-BAR-CX20", "conferencing", "Barco ClickShare CX-20 wireless conferencing", "Barco", "pcs", 11990, 4),
    ("NET-NGR-M4250-10", "network", "Netgear M4250-10G2F-PoE+ AV line switch", "Netgear", "pcs", 6490, 9),
    ("NET-NGR-M4250-26", "network", "Netgear M4250-26G4F-PoE+ AV line switch", "Netgear", "pcs", 13990, 3),
    ("NET-UBI-USWL8", "network", "Ubiquiti Switch Lite 8 PoE", "Ubiquiti", "pcs", 1290, 25),
    ("NET-CIS-CBS250-8", "network", "Cisco CBS250-8PP-E-2G smart switch", "Cisco", "pcs", 2190, 12),
    ("CAM-YEA-UVC86", "conferencing", "Yealink UVC86 4K dual-eye PTZ camera", "Yealink", "pcs", 13990, 2),
    ("CAM-LOG-RBMINI", "conferencing", "Logitech Rally Bar Mini video bar", "Logitech", "pcs", 19990, 4),
    ("CAM-LOG-MEETUP", "conferencing", "Logitech MeetUp conference camera", "Logitech", "pcs", 9990, 6),
    ("CAM-PTZ-MOVE4K", "conferencing", "PTZOptics Move 4K 20x PTZ camera", "PTZOptics", "pcs", 15990, 3),
    ("RCK-WALL-12U", "power-racks", "12U wall cabinet 600 mm deep, glass door", "Lande", "pcs", 2790, 10),
    ("RCK-SHELF-1U", "power-racks", "1U cantilever rack shelf", "Penn Elcom", "pcs", 349, 35),
    ("PWR-FUR-PL8C", "power-racks", "Furman PL-8C power conditioner", "Furman", "pcs", 2990, 9),
    ("PWR-PDU-8", "power-racks", "19\" 8-way rack PDU with surge protection", "Adam Hall", "pcs", 1290, 18),
    ("RCK-BLANK-1U", "power-racks", "1U blank panel", "Penn Elcom", "pcs", 99, 150),
    ("CON-GAF-50", "consumables", "Gaffer tape 50 mm x 50 m black", "Le Mark", "roll", 189, 300),
    ("CON-VEL-25", "consumables", "Velcro cable tie roll 25 m", "Velcro", "roll", 249, 120),
    ("CON-LBL-TZE12", "consumables", "Brother TZe label tape 12 mm", "Brother", "pcs", 229, 90),
    ("CON-RJ45-100", "consumables", "RJ45 Cat6 connectors (100 pcs)", "Deltaco", "pack", 399, 60),
    ("CON-BAT-AA24", "consumables", "AA batteries (24-pack)", "Duracell", "pack", 219, 110),
]
PID = {p[0]: i + 1 for i, p in enumerate(PRODUCTS)}
CAT_ID = {c[1]: c[0] for c in CATEGORIES}
PRICE = {p[0]: p[5] * 100 for p in PRODUCTS}  # øre
PNAME = {p[0]: p[2] for p in PRODUCTS}
STOCK = {p[0]: p[6] for p in PRODUCTS}  # tracked while generating

# Nordlys Studio / Fjellrommet: (sku, qty, source). "stock" = from Lars's own gear.
BOM_DRAFT = [
    ("DIS-SAM-QM65C", 1, "order"),
    ("MNT-VOG-PFW6400", 1, "order"),
    ("CAM-YEA-UVC86", 1, "order"),
    ("MIC-SHU-MXA310", 1, "order"),
    ("DSP-SHU-P300", 1, "order"),
    ("SPK-JBL-C26CT", 2, "order"),
    ("AMP-JBL-CSA2120Z", 1, "order"),
    ("WPS-BAR-CX30", 1, "order"),
    ("NET-NGR-M4250-10", 1, "order"),
    ("RCK-WALL-12U", 1, "order"),
    ("PWR-FUR-PL8C", 1, "order"),
    ("CBL-HDMI-2M", 2, "order"),
    ("CBL-USBC-3M", 1, "order"),
    ("CBL-CAT6-P1", 2, "order"),
    ("CBL-CAT6-305", 1, "stock"),
    ("CBL-SPK-2x15-100", 1, "stock"),
    ("CON-RJ45-100", 1, "stock"),
]
BOM_FINAL = [
    ("DIS-SAM-QM75C", 1, "order"),
    ("MNT-VOG-PFW6852", 1, "order"),
    ("CAM-YEA-UVC86", 1, "order"),
    ("MIC-SEN-TCCM", 1, "order"),
    ("DSP-SHU-P300", 1, "order"),
    ("SPK-JBL-C26CT", 2, "order"),
    ("AMP-JBL-CSA2120Z", 1, "order"),
    ("WPS-BAR-CX30", 1, "order"),
    ("NET-NGR-M4250-10", 1, "order"),
    ("RCK-WALL-12U", 1, "order"),
    ("PWR-FUR-PL8C", 1, "order"),
    ("CBL-HDMI-2M", 2, "order"),
    ("CBL-HDMI-AOC10", 1, "order"),
    ("CBL-USBC-3M", 1, "order"),
    ("CBL-CAT6-P1", 2, "order"),
    ("CBL-CAT6-305", 1, "stock"),
    ("CBL-SPK-2x15-100", 1, "stock"),
    ("CON-RJ45-100", 1, "stock"),
]

# Labour (rates from docs/rates.md, øre excl. MVA): text, qty, unit, unit price
LABOUR = [
    ("Site visit and survey (flat)", 1, "visit", 150000),
    ("Installation, lead technician (Lars Eriksen)", 2, "day", 720000),
    ("Installation, assistant technician (Mats Berg)", 2, "day", 580000),
    ("DSP and Teams/Zoom room configuration", 6, "h", 110000),
    ("Travel and van, Oslo zone", 4, "trip", 45000),
]

QUOTE_NO = "Q-2026-014"
JOB_NO = "NS-2026-03"
CLIENT_PO = "NS-PO-2026-031"
ORDER1_NO = "AVL-2026-10417"
ORDER2_NO = "AVL-2026-10533"
TRACKING = "70730259304981756"
SHIPPING_SMALL = 14900  # øre, orders below NOK 5,000
FREE_SHIPPING_FROM = 500000


def bom_totals(bom):
    materials = sum(PRICE[s] * q for s, q, _ in bom)
    to_order = sum(PRICE[s] * q for s, q, src in bom if src == "order")
    labour = sum(q * p for _, q, _, p in LABOUR)
    excl = materials + labour
    vat = excl // 4
    return materials, to_order, labour, excl, vat, excl + vat


MAT, ORDER_SUBTOTAL, LAB, QUOTE_EXCL, QUOTE_VAT, QUOTE_INCL = bom_totals(BOM_FINAL)
assert QUOTE_EXCL % 4 == 0  # VAT comes out in whole øre


# --------------------------------------------------------------------------
# Workspace files
# --------------------------------------------------------------------------


def bom_md(bom, status: str, log: list[str], ordered_note: str | None = None) -> str:
    materials, to_order, labour, excl, vat, incl = bom_totals(bom)
    out = [
        "# Bill of materials - Nordlys Studio, meeting room \"Fjellrommet\"",
        "",
        f"- Job: {JOB_NO}",
        "- Client: Nordlys Studio AS, Maridalsveien 87, 0461 Oslo (contact: Ingrid Solberg)",
        "- Room: Fjellrommet, 12 seats, 6.2 x 4.8 m, ceiling height 2.7 m",
        f"- Status: {status}",
        "- Prices: AVLager list prices, NOK excl. MVA (25 %)",
        "",
        "## Equipment",
        "",
        "| # | SKU | Item | Qty | Unit NOK | Line NOK | Source |",
        "|---|-----|------|----:|---------:|---------:|--------|",
    ]
    for i, (sku, qty, src) in enumerate(bom, 1):
        out.append(
            f"| {i} | {sku} | {PNAME[sku]} | {qty} | {nok(PRICE[sku])} | {nok(PRICE[sku] * qty)} | {src} |"
        )
    out += [
        f"| | | **Equipment total** | | | **{nok(materials)}** | |",
        "",
        "Source `order` = bought new from AVLager for this job; "
        "`stock` = taken from my own stock (see inventory/gear.csv), billed at list price.",
        f"Equipment to order from AVLager: NOK {nok(to_order)} excl. MVA.",
        "",
        "## Labour",
        "",
        "| Item | Qty | Unit | Unit NOK | Line NOK |",
        "|------|----:|------|---------:|---------:|",
    ]
    for text, qty, unit, price in LABOUR:
        out.append(f"| {text} | {qty} | {unit} | {nok(price)} | {nok(price * qty)} |")
    out += [
        f"| **Labour total** | | | | **{nok(labour)}** |",
        "",
        "## Summary",
        "",
        f"- Equipment: NOK {nok(materials)}",
        f"- Labour: NOK {nok(labour)}",
        f"- Total excl. MVA: NOK {nok(excl)}",
        f"- MVA 25 %: NOK {nok(vat)}",
        f"- Total incl. MVA: NOK {nok(incl)}",
        "",
    ]
    if ordered_note:
        out += ["## Order", "", ordered_note, ""]
    out += ["## Log", ""] + [f"- {line}" for line in log] + [""]
    return "\n".join(out)


def quote_md() -> str:
    out = [
        f"# Quote {QUOTE_NO}",
        "",
        "Eriksen Lyd & Bilde - Lars Eriksen, org. no. 923 456 781",
        "Sandakerveien 56B, 0477 Oslo - lars@eriksen-av.no - +47 912 34 567",
        "",
        "To: Nordlys Studio AS, att. Ingrid Solberg, Maridalsveien 87, 0461 Oslo",
        "Date: 2026-03-03 - valid until 2026-03-17",
        f"Job: {JOB_NO} - AV upgrade of meeting room Fjellrommet (12 seats)",
        "",
        "## Scope",
        "",
        "- 75\" 4K display on fixed wall mount, PTZ camera above the display",
        "- Ceiling microphone array, Shure P300 DSP, 4 ceiling speakers with amplifier",
        "- ClickShare CX-30 wireless presentation / BYOD conferencing",
        "- 12U wall cabinet with PoE switch and power conditioner, all cabling",
        "- Configuration, testing and a short user handover",
        "",
        "Detailed equipment list: jobs/nordlys/bom.md",
        "",
        "## Price",
        "",
        "| Item | NOK |",
        "|------|----:|",
        f"| Equipment (per BOM) | {nok(MAT)} |",
    ]
    for text, qty, unit, price in LABOUR:
        out.append(f"| {text}: {qty} {unit} x {nok(price)} | {nok(qty * price)} |")
    out += [
        f"| **Total excl. MVA** | **{nok(QUOTE_EXCL)}** |",
        f"| MVA 25 % | {nok(QUOTE_VAT)} |",
        f"| **Total incl. MVA** | **{nok(QUOTE_INCL)}** |",
        "",
        "Payment: 30 % on order, 70 % on handover, 14 days net.",
        "Electrical work (new 230 V outlets) is done by Strand Elektro and invoiced separately.",
        "",
    ]
    return "\n".join(out)


RATES_MD = """# Rates 2026 - Eriksen Lyd & Bilde

All prices in NOK excl. MVA (25 %). Valid from 2026-01-01.

| Service | Unit | NOK |
|---------|------|----:|
| Hourly rate, technician | hour | 950.00 |
| Day rate, lead technician (up to 8 h on site) | day | 7,200.00 |
| Day rate, assistant technician (subcontracted) | day | 5,800.00 |
| DSP / control / conferencing programming | hour | 1,100.00 |
| Site visit and survey, Oslo | flat | 1,500.00 |
| Travel and van, Oslo zone | trip | 450.00 |
| Evening / weekend surcharge | | +50 % |

- Equipment is billed at AVLager list price; items from my own stock likewise.
- Minimum call-out: 2 hours.
- Payment: 30 % on order for jobs above NOK 50,000, rest on handover, 14 days net.
"""

OLD_RATES_TXT = """RATES 2025 (superseded - see docs/rates.md)
hourly rate ........ NOK 890
day rate ........... NOK 6,800
assistant day rate . NOK 5,400
programming ........ NOK 990 / h
travel Oslo ........ NOK 400 / trip
"""

GEAR_HEADER = ["item", "sku", "qty", "location", "condition"]
GEAR = [
    ["Shure SM58 dynamic vocal microphone", "MIC-SHU-SM58", "4", "van", "good"],
    ["Shure BLX24E/SM58 wireless handheld system", "MIC-SHU-BLX24", "2", "storage", "good"],
    ["Sennheiser EW-D ME2 lavalier set", "MIC-SEN-EWD-ME2", "1", "storage", "good"],
    ["XLR microphone cable 10 m", "CBL-XLR-10M", "6", "van", "good"],
    ["XLR microphone cable 5 m", "CBL-XLR-5M", "8", "van", "good"],
    ["HDMI 2.1 cable 2 m", "CBL-HDMI-2M", "5", "van", "good"],
    ["HDMI 2.1 cable 5 m", "CBL-HDMI-5M", "2", "van", "fair"],
    ["Cat6 U/UTP installation cable 305 m box", "CBL-CAT6-305", "1", "storage", "new"],
    ["Speaker cable 2x1.5 mm² 100 m drum", "CBL-SPK-2x15-100", "1", "van", "new"],
    ["RJ45 Cat6 connectors (100 pcs)", "CON-RJ45-100", "2", "van", "new"],
    ["Yamaha MG10XU 10-channel mixer", "MIX-YAM-MG10XU", "1", "storage", "good"],
    ["Allen & Heath CQ-18T digital mixer", "MIX-ALH-CQ18T", "1", "storage", "good"],
    ["QSC K12.2 active loudspeaker", "SPK-QSC-K122", "2", "storage", "good"],
    ["K&M 21020 tripod microphone stand with boom", "MNT-KM-21020", "6", "storage", "good"],
    ["dbx DriveRack PA2 loudspeaker management", "DSP-DBX-DRPA2", "1", "storage", "good"],
    ["Epson EB-L630U laser projector (demo unit)", "PRJ-EPS-EBL630U", "1", "storage", "good"],
    ["Furman PL-8C power conditioner", "PWR-FUR-PL8C", "1", "storage", "fair"],
    ["Gaffer tape 50 mm x 50 m black", "CON-GAF-50", "2", "van", "new"],
    ["Fluke LinkIQ cable tester", "LE-TOOL-001", "1", "van", "good"],
    ["RJ45 crimping tool", "LE-TOOL-002", "1", "van", "good"],
    ["Makita DDF484 drill driver", "LE-TOOL-003", "1", "van", "good"],
    ["Bosch GLL 3-80 laser level", "LE-TOOL-004", "1", "van", "good"],
    ["Step ladder 6 steps", "LE-TOOL-005", "1", "van", "good"],
    ["Brother P-touch label printer", "LE-TOOL-006", "1", "van", "good"],
    ["ThinkPad T14 laptop (Shure Designer / Dante)", "LE-IT-001", "1", "office", "good"],
    ["Netgear GS308 unmanaged switch", "LE-NET-001", "1", "storage", "good"],
]


def gear_csv() -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(GEAR_HEADER)
    w.writerows(GEAR)
    return buf.getvalue()


def gear_row(sku: str, location: str | None = None) -> list:
    rows = [r for r in GEAR if r[1] == sku and (location is None or r[3] == location)]
    assert len(rows) == 1, (sku, location)
    return rows[0]


def png_bytes() -> bytes:
    """A tiny valid 48x16 RGB PNG (rack label), zlib stream built by hand (stored blocks)."""
    width, height = 48, 16
    raw = bytearray()
    for y in range(height):
        raw.append(0)  # filter type: none
        for x in range(width):
            if x in (0, width - 1) or y in (0, height - 1):
                px = (24, 24, 24)  # border
            elif y <= 4:
                px = (255, 196, 0)  # yellow header band
            elif 6 <= y <= 12 and 4 <= x <= 43 and (x // 4) % 2 == 0:
                px = (24, 24, 24)  # "barcode" stripes
            else:
                px = (250, 250, 250)
            raw += bytes(px)
    data = bytes(raw)
    stream = bytearray(b"\x78\x01")
    for i in range(0, len(data), 65535):
        chunk = data[i:i + 65535]
        final = 1 if i + 65535 >= len(data) else 0
        stream += struct.pack("<BHH", final, len(chunk), len(chunk) ^ 0xFFFF) + chunk
    stream += struct.pack(">I", zlib.adler32(data))

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", bytes(stream)) + chunk(b"IEND", b"")


# --------------------------------------------------------------------------
# Service helpers
# --------------------------------------------------------------------------


class Chat:
    next_msg = 1

    @classmethod
    def msg(cls, conv: int, sender: int, body: str, hhmm: str | None = None) -> int:
        if hhmm:
            W.at(hhmm)
        mid = cls.next_msg
        cls.next_msg += 1
        read = 1 if sender == 1 else 0  # is_read: read by Lars (user 1)
        W.insert("chat", "messages", id=mid, conversation_id=conv, sender_id=sender, body=body,
                 sent_at=NOW, is_read=read, created_at=NOW, updated_at=NOW)
        return mid

    @staticmethod
    def read(conv: int, hhmm: str | None = None) -> None:
        """Lars opens a conversation: everything from others there becomes read."""
        if hhmm:
            W.at(hhmm)
        W.sql("chat", "UPDATE messages SET is_read = 1, updated_at = :ts "
                      "WHERE conversation_id = :conv AND sender_id <> 1 AND is_read = 0",
              {"ts": NOW, "conv": conv})

    @staticmethod
    def conversation(cid: int, kind: str, title: str | None, members: list[int]) -> None:
        W.insert("chat", "conversations", id=cid, kind=kind, title=title, created_by=1,
                 created_at=NOW, updated_at=NOW)
        for uid in members:
            W.insert("chat", "conversation_members", conversation_id=cid, user_id=uid,
                     role="owner" if uid == 1 else "member", joined_at=NOW)


class Shop:
    cart: dict[str, list] = {}  # sku -> [cart_item_id, qty]
    next_cart = 1
    next_hist = 1

    @classmethod
    def add(cls, sku: str, qty: int) -> None:
        assert sku not in cls.cart
        cid = cls.next_cart
        cls.next_cart += 1
        cls.cart[sku] = [cid, qty]
        W.insert("shop", "cart_items", id=cid, user_id=1, product_id=PID[sku], quantity=qty,
                 added_at=NOW, updated_at=NOW)

    @classmethod
    def set_qty(cls, sku: str, qty: int) -> None:
        cls.cart[sku][1] = qty
        W.sql("shop", "UPDATE cart_items SET quantity = ?, updated_at = ? WHERE user_id = 1 AND product_id = ?",
              [qty, NOW, PID[sku]])

    @classmethod
    def remove(cls, sku: str) -> None:
        del cls.cart[sku]
        W.sql("shop", "DELETE FROM cart_items WHERE user_id = 1 AND product_id = ?", [PID[sku]])

    @staticmethod
    def set_stock(sku: str, stock: int) -> None:
        STOCK[sku] = stock
        W.sql("shop", "UPDATE products SET stock = ?, updated_at = ? WHERE id = ?", [stock, NOW, PID[sku]])

    @classmethod
    def history(cls, order_id: int, status: str, note: str, changed_at: str) -> None:
        W.insert("shop", "order_status_history", id=cls.next_hist, order_id=order_id, status=status,
                 note=note, changed_at=changed_at)
        cls.next_hist += 1

    @classmethod
    def place_order(cls, order_id: int, number: str, address_id: int, first_item_id: int) -> tuple[int, int, int, int]:
        lines = list(cls.cart.items())
        subtotal = sum(PRICE[sku] * qty for sku, (_, qty) in lines)
        shipping = 0 if subtotal >= FREE_SHIPPING_FROM else SHIPPING_SMALL
        vat = (subtotal + shipping) // 4
        total = subtotal + shipping + vat
        placed_ts = W.insert("shop", "orders", id=order_id, user_id=1, order_number=number, status="placed",
                 shipping_address_id=address_id, subtotal_cents=subtotal, shipping_cents=shipping,
                 vat_cents=vat, total_cents=total, carrier=None, tracking_number=None,
                 placed_at=NOW, shipped_at=None, delivered_at=None, created_at=NOW, updated_at=NOW)
        for n, (sku, (_, qty)) in enumerate(lines):
            W.insert("shop", "order_items", id=first_item_id + n, order_id=order_id, product_id=PID[sku],
                     quantity=qty, unit_price_cents=PRICE[sku], line_total_cents=PRICE[sku] * qty)
        for sku, (_, qty) in lines:
            assert STOCK[sku] >= qty, sku
            STOCK[sku] -= qty
            W.sql("shop", "UPDATE products SET stock = stock - ?, updated_at = ? WHERE id = ?",
                  [qty, NOW, PID[sku]])
        cls.history(order_id, "placed", "Order received", placed_ts)
        W.sql("shop", "DELETE FROM cart_items WHERE user_id = 1")
        cls.cart = {}
        return subtotal, shipping, vat, total

    @classmethod
    def ship(cls, order_id: int, carrier: str, tracking: str) -> None:
        ts = W.sql("shop", "UPDATE orders SET status = :status, carrier = :carrier, tracking_number = :tracking, "
                      "shipped_at = :ts, updated_at = :ts WHERE id = :id",
              {"status": "shipped", "carrier": carrier, "tracking": tracking, "ts": NOW, "id": order_id})
        cls.history(order_id, "shipped", f"Handed to {carrier}, tracking {tracking}", ts)

    @classmethod
    def deliver(cls, order_id: int, note: str) -> None:
        ts = W.sql("shop", "UPDATE orders SET status = :status, delivered_at = :ts, updated_at = :ts WHERE id = :id",
              {"status": "delivered", "ts": NOW, "id": order_id})
        cls.history(order_id, "delivered", note, ts)


class Cal:
    next_att = 1
    next_rem = 1

    @classmethod
    def event(cls, eid: int, cal: int, title: str, start: str, end: str, location: str | None,
              description: str | None, attendees: list[tuple[int, str]] = (), reminders: list[int] = (),
              status: str = "confirmed") -> None:
        W.insert("calendar", "events", id=eid, calendar_id=cal, title=title, description=description,
                 location=location, start_at=start, end_at=end, all_day=0, status=status,
                 created_at=NOW, updated_at=NOW)
        for contact, response in attendees:
            W.insert("calendar", "attendees", id=cls.next_att, event_id=eid, contact_id=contact,
                     response=response, created_at=NOW, updated_at=NOW)
            cls.next_att += 1
        for minutes in reminders:
            W.insert("calendar", "reminders", id=cls.next_rem, event_id=eid, minutes_before=minutes,
                     method="popup", created_at=NOW)
            cls.next_rem += 1

    @staticmethod
    def respond(eid: int, contact: int, response: str) -> None:
        W.sql("calendar", "UPDATE attendees SET response = ?, updated_at = ? WHERE event_id = ? AND contact_id = ?",
              [response, NOW, eid, contact])

    @staticmethod
    def move(eid: int, start: str, end: str) -> None:
        W.sql("calendar", "UPDATE events SET start_at = :start, end_at = :end, updated_at = :ts WHERE id = :id",
              {"start": start, "end": end, "ts": NOW, "id": eid})


class Notes:
    @staticmethod
    def note(nid: int, notebook: int, title: str, body: str, tags: list[int], pinned: int = 0) -> None:
        W.insert("notes", "notes", id=nid, notebook_id=notebook, title=title, body=body, is_pinned=pinned,
                 is_archived=0, created_at=NOW, updated_at=NOW)
        for tid in tags:
            W.insert("notes", "note_tags", note_id=nid, tag_id=tid, created_at=NOW)

    @staticmethod
    def update(nid: int, body: str) -> None:
        W.sql("notes", "UPDATE notes SET body = ?, updated_at = ? WHERE id = ?", [body, NOW, nid])


# tag ids
T_NORDLYS, T_SAGENE, T_FJORD, T_CHECKLIST, T_QUOTE, T_TODO, T_GEAR, T_INVOICE, T_NETWORK, T_IDEAS = range(1, 11)
TAGS = ["nordlys", "sagene", "fjord", "checklist", "quote", "todo", "gear", "invoice", "network", "ideas"]


# --------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------

CHAT_SCHEMA = [
    """CREATE TABLE users(
        id INTEGER PRIMARY KEY, name TEXT NOT NULL, handle TEXT NOT NULL UNIQUE, email TEXT, phone TEXT,
        company TEXT, title TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE conversations(
        id INTEGER PRIMARY KEY, kind TEXT NOT NULL CHECK (kind IN ('direct', 'group')), title TEXT,
        created_by INTEGER NOT NULL REFERENCES users(id), created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE conversation_members(
        conversation_id INTEGER NOT NULL REFERENCES conversations(id),
        user_id INTEGER NOT NULL REFERENCES users(id),
        role TEXT NOT NULL CHECK (role IN ('owner', 'member')), joined_at TEXT NOT NULL,
        PRIMARY KEY (conversation_id, user_id))""",
    """CREATE TABLE messages(
        id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL REFERENCES conversations(id),
        sender_id INTEGER NOT NULL REFERENCES users(id), body TEXT NOT NULL, sent_at TEXT NOT NULL,
        is_read INTEGER NOT NULL DEFAULT 0 CHECK (is_read IN (0, 1)),
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    "CREATE INDEX idx_members_user ON conversation_members(user_id)",
    "CREATE INDEX idx_messages_conversation_sent ON messages(conversation_id, sent_at)",
    "CREATE INDEX idx_messages_sender ON messages(sender_id)",
]

SHOP_SCHEMA = [
    """CREATE TABLE categories(
        id INTEGER PRIMARY KEY, slug TEXT NOT NULL UNIQUE, name TEXT NOT NULL,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE products(
        id INTEGER PRIMARY KEY, category_id INTEGER NOT NULL REFERENCES categories(id),
        sku TEXT NOT NULL UNIQUE, name TEXT NOT NULL, brand TEXT, unit TEXT NOT NULL DEFAULT 'pcs',
        price_cents INTEGER NOT NULL CHECK (price_cents >= 0), currency TEXT NOT NULL DEFAULT 'NOK',
        stock INTEGER NOT NULL CHECK (stock >= 0), is_active INTEGER NOT NULL DEFAULT 1,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE users(
        id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL UNIQUE, phone TEXT, company TEXT,
        org_number TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE addresses(
        id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id), label TEXT NOT NULL,
        recipient TEXT NOT NULL, company TEXT, street TEXT NOT NULL, postal_code TEXT NOT NULL,
        city TEXT NOT NULL, country TEXT NOT NULL DEFAULT 'NO', phone TEXT,
        is_default INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE cart_items(
        id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id),
        product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL CHECK (quantity > 0),
        added_at TEXT NOT NULL, updated_at TEXT NOT NULL, UNIQUE (user_id, product_id))""",
    """CREATE TABLE orders(
        id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id),
        order_number TEXT NOT NULL UNIQUE,
        status TEXT NOT NULL CHECK (status IN ('placed', 'shipped', 'delivered', 'cancelled')),
        shipping_address_id INTEGER NOT NULL REFERENCES addresses(id),
        subtotal_cents INTEGER NOT NULL, shipping_cents INTEGER NOT NULL, vat_cents INTEGER NOT NULL,
        total_cents INTEGER NOT NULL, carrier TEXT, tracking_number TEXT,
        placed_at TEXT NOT NULL, shipped_at TEXT, delivered_at TEXT,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE order_items(
        id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id),
        product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL CHECK (quantity > 0),
        unit_price_cents INTEGER NOT NULL, line_total_cents INTEGER NOT NULL)""",
    """CREATE TABLE order_status_history(
        id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id),
        status TEXT NOT NULL, note TEXT, changed_at TEXT NOT NULL)""",
    "CREATE INDEX idx_products_category ON products(category_id)",
    "CREATE INDEX idx_addresses_user ON addresses(user_id)",
    "CREATE INDEX idx_orders_user_status ON orders(user_id, status)",
    "CREATE INDEX idx_order_items_order ON order_items(order_id)",
    "CREATE INDEX idx_order_status_history_order ON order_status_history(order_id)",
]

CALENDAR_SCHEMA = [
    """CREATE TABLE contacts(
        id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE, phone TEXT, company TEXT,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE calendars(
        id INTEGER PRIMARY KEY, owner_id INTEGER NOT NULL REFERENCES contacts(id), name TEXT NOT NULL,
        color TEXT NOT NULL, timezone TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE events(
        id INTEGER PRIMARY KEY, calendar_id INTEGER NOT NULL REFERENCES calendars(id), title TEXT NOT NULL,
        description TEXT, location TEXT, start_at TEXT NOT NULL, end_at TEXT NOT NULL,
        all_day INTEGER NOT NULL DEFAULT 0,
        status TEXT NOT NULL CHECK (status IN ('confirmed', 'tentative', 'cancelled')),
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL, CHECK (end_at >= start_at))""",
    """CREATE TABLE attendees(
        id INTEGER PRIMARY KEY, event_id INTEGER NOT NULL REFERENCES events(id),
        contact_id INTEGER NOT NULL REFERENCES contacts(id),
        response TEXT NOT NULL CHECK (response IN ('needs_action', 'accepted', 'declined', 'tentative')),
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL, UNIQUE (event_id, contact_id))""",
    """CREATE TABLE reminders(
        id INTEGER PRIMARY KEY, event_id INTEGER NOT NULL REFERENCES events(id),
        minutes_before INTEGER NOT NULL CHECK (minutes_before >= 0),
        method TEXT NOT NULL CHECK (method IN ('popup', 'email')), created_at TEXT NOT NULL)""",
    "CREATE INDEX idx_events_calendar_start ON events(calendar_id, start_at)",
    "CREATE INDEX idx_attendees_contact ON attendees(contact_id)",
    "CREATE INDEX idx_reminders_event ON reminders(event_id)",
]

NOTES_SCHEMA = [
    """CREATE TABLE notebooks(
        id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE notes(
        id INTEGER PRIMARY KEY, notebook_id INTEGER NOT NULL REFERENCES notebooks(id), title TEXT NOT NULL,
        body TEXT NOT NULL, is_pinned INTEGER NOT NULL DEFAULT 0, is_archived INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE tags(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL)""",
    """CREATE TABLE note_tags(
        note_id INTEGER NOT NULL REFERENCES notes(id), tag_id INTEGER NOT NULL REFERENCES tags(id),
        created_at TEXT NOT NULL, PRIMARY KEY (note_id, tag_id))""",
    "CREATE INDEX idx_notes_notebook ON notes(notebook_id, updated_at)",
    "CREATE INDEX idx_note_tags_tag ON note_tags(tag_id)",
]


# --------------------------------------------------------------------------
# The story
# --------------------------------------------------------------------------

NORDLYS_ADDR = "Nordlys Studio, Maridalsveien 87, 2nd floor, 0461 Oslo"
INGRID, MATS, KARI, ANDERS, ERIK, HENRIK, SOFIE_ID = 2, 3, 4, 5, 6, 7, 8
C_INGRID, C_MATS, C_ANDERS, C_KARI, C_HENRIK, C_GROUP, C_SOFIE = 1, 2, 3, 4, 5, 6, 7

# calendar event ids
E_INVOICE, E_GYM1, E_SITE, E_SAGENE, E_DENTIST, E_GYM2, E_FOLLOWUP, E_HENRIK = 1, 2, 3, 4, 5, 6, 7, 8
E_INSTALL1, E_INSTALL2, E_DELIVERY, E_FJORD = 9, 10, 11, 12

BOM_LOG = ["2026-03-02 Draft from Ingrid's brief (phone call 2026-02-27 and chat 2026-03-02)."]


def brief_note(extra: list[str]) -> str:
    lines = [
        "Client: Nordlys Studio AS - Ingrid Solberg (studio manager), Erik Dahl (IT).",
        "Room: Fjellrommet, 12 seats. Wants a proper Teams/Zoom room: big screen, camera that sees the",
        "whole table, good audio, wireless sharing from laptops (BYOD).",
        "Budget: roughly NOK 150-200k excl. MVA.",
        "Address: Maridalsveien 87, 2nd floor, 0461 Oslo.",
        "",
        "Files: jobs/nordlys/bom.md",
        "",
        "Status:",
    ]
    return "\n".join(lines + [f"- {x}" for x in extra])


def day0() -> None:
    W.day(0, "07:00")
    # --- schemas -----------------------------------------------------------
    for stmt in CHAT_SCHEMA:
        W.sql("chat", stmt)
    for stmt in SHOP_SCHEMA:
        W.sql("shop", stmt)
    for stmt in CALENDAR_SCHEMA:
        W.sql("calendar", stmt)
    for stmt in NOTES_SCHEMA:
        W.sql("notes", stmt)

    # --- chat users ---------------------------------------------------------
    W.at("07:05")
    for uid, name, handle, email, phone, company, title in PEOPLE:
        W.insert("chat", "users", id=uid, name=name, handle=handle, email=email, phone=phone,
                 company=company, title=title, created_at=NOW, updated_at=NOW)
    Chat.conversation(C_INGRID, "direct", None, [1, INGRID])
    Chat.conversation(C_MATS, "direct", None, [1, MATS])
    Chat.conversation(C_ANDERS, "direct", None, [1, ANDERS])
    Chat.conversation(C_KARI, "direct", None, [1, KARI])
    Chat.conversation(C_HENRIK, "direct", None, [1, HENRIK])

    # --- shop catalogue ---------------------------------------------------
    W.at("07:10")
    for cid, slug, name in CATEGORIES:
        W.insert("shop", "categories", id=cid, slug=slug, name=name, created_at=NOW, updated_at=NOW)
    for sku, cat, name, brand, unit, price, stock in PRODUCTS:
        W.insert("shop", "products", id=PID[sku], category_id=CAT_ID[cat], sku=sku, name=name, brand=brand,
                 unit=unit, price_cents=price * 100, currency="NOK", stock=stock, is_active=1,
                 created_at=NOW, updated_at=NOW)
    W.insert("shop", "users", id=1, name="Lars Eriksen", email="lars@eriksen-av.no", phone="+47 912 34 567",
             company="Eriksen Lyd & Bilde", org_number="923456781", created_at=NOW, updated_at=NOW)
    W.insert("shop", "addresses", id=1, user_id=1, label="Workshop", recipient="Lars Eriksen",
             company="Eriksen Lyd & Bilde", street="Sandakerveien 56B", postal_code="0477", city="Oslo",
             country="NO", phone="+47 912 34 567", is_default=1, created_at=NOW, updated_at=NOW)

    # --- calendar -----------------------------------------------------------
    W.at("07:15")
    for uid, name, handle, email, phone, company, title in PEOPLE:
        W.insert("calendar", "contacts", id=uid, name=name, email=email, phone=phone, company=company,
                 created_at=NOW, updated_at=NOW)
    W.insert("calendar", "calendars", id=1, owner_id=1, name="Jobs", color="#1f77b4", timezone="Europe/Oslo",
             created_at=NOW, updated_at=NOW)
    W.insert("calendar", "calendars", id=2, owner_id=1, name="Admin & invoicing", color="#2ca02c",
             timezone="Europe/Oslo", created_at=NOW, updated_at=NOW)
    W.insert("calendar", "calendars", id=3, owner_id=1, name="Personal", color="#9467bd",
             timezone="Europe/Oslo", created_at=NOW, updated_at=NOW)
    Cal.event(E_INVOICE, 2, "Invoice run - February jobs", oslo("2026-03-02", "15:00"), oslo("2026-03-02", "16:00"),
              "Workshop", "Send invoices for February: Sagene Scene jazz nights, Hotel Bislett ballroom.",
              reminders=[30])
    Cal.event(E_GYM1, 3, "Gym", oslo("2026-03-03", "18:00"), oslo("2026-03-03", "19:00"), "SATS Storo", None)
    Cal.event(E_DENTIST, 3, "Dentist", oslo("2026-03-06", "08:00"), oslo("2026-03-06", "08:45"),
              "Tannlegene Torshov", None, reminders=[120])
    Cal.event(E_GYM2, 3, "Gym", oslo("2026-03-05", "18:00"), oslo("2026-03-05", "19:00"), "SATS Storo", None)

    # --- notes -------------------------------------------------------------
    W.at("07:20")
    for nb_id, name in [(1, "Jobs"), (2, "Admin"), (3, "Gear & van"), (4, "Ideas")]:
        W.insert("notes", "notebooks", id=nb_id, name=name, created_at=NOW, updated_at=NOW)
    for tid, name in enumerate(TAGS, 1):
        W.insert("notes", "tags", id=tid, name=name, created_at=NOW)
    Notes.note(1, 3, "Van packing list - meeting room install",
               "\n".join([
                   "- [ ] Drill driver + bits (wood, steel stud, concrete)",
                   "- [ ] Laser level, stud finder, tape measure",
                   "- [ ] Step ladder",
                   "- [ ] Cable tester (LinkIQ), crimp tool, RJ45 connectors",
                   "- [ ] Label printer + spare tape",
                   "- [ ] Gaffer, Velcro, cable ties",
                   "- [ ] Laptop with Shure Designer, Dante Controller, ClickShare tool",
                   "- [ ] Spare HDMI 2 m x2, USB-C 3 m",
               ]), [T_CHECKLIST, T_GEAR], pinned=1)
    Notes.note(2, 2, "Invoicing - February",
               "\n".join([
                   "- [ ] Sagene Scene - jazz nights 20 + 27 Feb, FOH sound: NOK 8,400",
                   "- [ ] Hotel Bislett - ballroom PA check + repair: NOK 5,250",
                   "- [ ] Send reminder: Oslo Kulturnatt invoice 2026-011 (overdue)",
               ]), [T_INVOICE, T_TODO])
    Notes.note(3, 4, "Idea: AV service agreements",
               "Offer small offices a yearly check-up: firmware updates, mic/camera test, cable check.\n"
               "Price idea: NOK 4,900/room/year incl. one visit.", [T_IDEAS])

    # --- files -------------------------------------------------------------
    W.at("07:30")
    W.write("docs/rates.md", RATES_MD)
    W.write("docs/old-rates.txt", OLD_RATES_TXT)
    W.write("inventory/gear.csv", gear_csv())
    W.write_bytes("img/rack-label.png", png_bytes())

    # --- the Nordlys lead arrives -------------------------------------------
    Chat.msg(C_INGRID, INGRID,
             "Hi Lars! Ingrid from Nordlys Studio. Thanks for the call on Friday. As promised, a summary: we want "
             "to turn Fjellrommet (our 12-seat meeting room) into a proper Teams/Zoom room - big screen, a camera "
             "that sees the whole table, good audio and wireless sharing from laptops. Budget is roughly "
             "NOK 150-200k excl. MVA.", "08:12")
    Chat.msg(C_INGRID, INGRID, "Could you come by for a site visit? Tomorrow would suit us well.", "08:14")
    Chat.read(C_INGRID, "08:38")
    Chat.msg(C_INGRID, 1,
             "Hi Ingrid, thanks - sounds like a nice project. Tomorrow at 10:00 works for me. I'll put together a "
             "first draft BOM today so we have something concrete to look at on site.", "08:40")
    Chat.msg(C_INGRID, INGRID, "Perfect, 10:00 tomorrow. Maridalsveien 87, 2nd floor - ask for me at reception.",
             "08:43")
    Chat.read(C_INGRID, "08:44")
    Notes.note(4, 1, "Nordlys Studio - Fjellrommet brief",
               brief_note(["2026-03-02 Lead from Ingrid, site visit booked 2026-03-03 10:00."]),
               [T_NORDLYS], pinned=1)
    Cal.event(E_SITE, 1, "Site visit - Nordlys Studio (Fjellrommet)", oslo("2026-03-03", "10:00"),
              oslo("2026-03-03", "11:30"), NORDLYS_ADDR,
              "Measure room, check ceiling, network outlet and power. Meet Ingrid Solberg + Erik Dahl (IT).",
              attendees=[(1, "accepted"), (INGRID, "accepted")], reminders=[60])

    Chat.msg(C_MATS, 1,
             "Morning! Might have a meeting-room install at Nordlys Studio next week, 2 days. "
             "Are you free to help out?", "09:30")
    Chat.msg(C_MATS, MATS,
             "Hey! Week 11 is mostly open. I have a rig at Rockefeller on Thursday 12th in the evening, "
             "but the days are free. Send dates when you know.", "10:05")
    Chat.read(C_MATS, "10:20")

    # order 1: consumables restock (small order, shipped day 1, delivered day 2)
    W.at("10:30")
    Shop.add("CON-GAF-50", 3)
    Shop.add("CON-VEL-25", 2)
    Shop.add("CON-BAT-AA24", 1)
    W.at("10:34")
    Shop.place_order(1, ORDER1_NO, 1, first_item_id=1)

    Chat.msg(C_KARI, KARI,
             "Hi Lars, Kari at Sagene Scene. The stage-left monitor wedge crackled all through the jazz night on "
             "Saturday. Could be the speaker, could be cabling. Can you have a look this week?", "11:20")
    Chat.msg(C_KARI, KARI, "Wednesday afternoon would be ideal, the hall is empty until 17:00.", "11:24")
    Chat.read(C_KARI, "11:48")
    Chat.msg(C_KARI, 1, "Hi Kari, sorry to hear that. I can come Wednesday at 13:00 with spare cables and a "
                        "test wedge.", "11:50")
    Chat.msg(C_KARI, KARI, "Great, thanks!", "11:53")
    Cal.event(E_SAGENE, 1, "Sagene Scene - monitor check", oslo("2026-03-04", "13:00"), oslo("2026-03-04", "14:00"),
              "Sagene Scene, Kristiansands gate 2, 0463 Oslo",
              "Stage-left monitor wedge crackles. Bring spare XLR cables and a test wedge.",
              attendees=[(1, "accepted"), (KARI, "accepted")], reminders=[60])
    Chat.read(C_KARI, "11:56")

    # draft BOM
    W.at("12:40")
    W.write("jobs/nordlys/bom.md", bom_md(BOM_DRAFT, "DRAFT - before site visit", BOM_LOG))

    Chat.msg(C_ANDERS, 1,
             "Hi Anders, I'm pricing a meeting room for a client: 65-75\" display, Yealink UVC86, a ceiling or "
             "table mic array, Shure P300 and a ClickShare CX-30. Any stock issues I should know about?", "13:10")
    Chat.msg(C_ANDERS, ANDERS,
             "Hi Lars! Displays and the P300 are fine. ClickShare CX-30 is sold out in Oslo right now - we expect "
             "new units later this week. UVC86 we have a couple left. I'll let you know when the CX-30s land.",
             "14:02")
    Chat.read(C_ANDERS, "14:04")
    Chat.msg(C_ANDERS, 1, "Thanks, keep me posted.", "14:05")

    W.at("14:10")
    Notes.update(2, "\n".join([
        "- [x] Sagene Scene - jazz nights 20 + 27 Feb, FOH sound: NOK 8,400 (invoice 2026-018)",
        "- [x] Hotel Bislett - ballroom PA check + repair: NOK 5,250 (invoice 2026-019)",
        "- [ ] Send reminder: Oslo Kulturnatt invoice 2026-011 (overdue)",
    ]))

    Chat.msg(C_HENRIK, 1,
             "Hi Henrik, possibly an electrical job for you at Nordlys Studio (Maridalsveien 87): new 230 V "
             "outlets behind a wall-mounted display and in a small wall rack. I'll know more after the site "
             "visit tomorrow.", "15:30")
    Chat.msg(C_HENRIK, HENRIK, "Sounds fine. Send me photos and measurements after the visit.", "16:45")
    Chat.read(C_HENRIK, "16:50")


def day1() -> None:
    W.day(1, "07:30")
    Shop.ship(1, "PostNord", "00370712345678901234")
    Chat.msg(C_INGRID, INGRID, "Good morning! Reception knows you're coming. Erik from IT will join us too.", "07:52")
    Chat.read(C_INGRID, "08:05")
    Chat.msg(C_INGRID, 1, "Great, see you at 10.", "08:06")
    Cal.respond(E_SITE, INGRID, "accepted")
    W.sql("calendar", "INSERT INTO attendees(id, event_id, contact_id, response, created_at, updated_at) "
                      "VALUES (:id, :event, :contact, :response, :ts, :ts)",
          {"id": Cal.next_att, "event": E_SITE, "contact": ERIK, "response": "accepted", "ts": NOW})
    Cal.next_att += 1

    # site visit 10:00-11:30 Oslo = 09:00-10:30Z
    W.at("10:45")
    Notes.note(5, 1, "Site visit Nordlys 2026-03-03",
               "\n".join([
                   "Fjellrommet, 2nd floor, NE corner of the building.",
                   "- Room 6.2 x 4.8 m, ceiling 2.7 m, suspended ceiling tiles 600x600 (easy for ceiling mic + speakers)",
                   "- Display wall: short wall facing the door, plasterboard on steel studs -> need a 75\" screen "
                   "for the back row at 6 m (65\" too small)",
                   "- Table is modular and gets moved around -> ceiling mic instead of MXA310 on the table",
                   "- One data outlet in the NE corner, ~8 m cable path to the display -> wall rack in the corner, "
                   "10 m optical HDMI to the display",
                   "- No outlet behind the display, no outlet in the corner: Henrik to add 2 double outlets",
                   "- Erik (IT): can give us a dedicated AV VLAN; ClickShare needs internet",
                   "- Window wall west: blinds OK, camera on top of display will be fine",
               ]), [T_NORDLYS])
    Chat.conversation(C_GROUP, "group", "Nordlys - Fjellrommet AV", [1, INGRID, ERIK, MATS])
    Chat.msg(C_GROUP, 1,
             "Hi all - a group for the Fjellrommet upgrade. Mats will help me on the install days.", "10:50")
    Chat.msg(C_GROUP, ERIK,
             "Hi. For the network part: we can give you a dedicated AV VLAN. The room only has the one data "
             "outlet in the corner. Do the P300 and the ClickShare need internet access?", "11:02")
    Chat.read(C_GROUP, "11:10")
    Chat.msg(C_GROUP, 1,
             "Thanks Erik. The P300 only needs the local network (control + USB to the room PC/ClickShare). The "
             "ClickShare needs internet for updates and the Teams/Zoom integration. I'll put a small PoE switch "
             "in the wall rack so we only need one uplink.", "11:12")
    Chat.msg(C_GROUP, ERIK, "OK. I'll prepare a VLAN for AV and send you the details.", "11:20")
    Chat.msg(C_GROUP, MATS, "👍 Count me in.", "11:31")
    Chat.read(C_GROUP, "11:40")

    W.at("12:30")
    BOM_LOG.append(f"2026-03-03 Site visit: 75\" display (QM75C) + PFW 6852 mount instead of 65\", "
                   f"Sennheiser TeamConnect Ceiling M instead of MXA310, added 10 m optical HDMI. "
                   f"Quote {QUOTE_NO} sent to Ingrid.")
    W.write("jobs/nordlys/bom.md", bom_md(BOM_FINAL, f"QUOTED - {QUOTE_NO} sent 2026-03-03, awaiting approval",
                                          BOM_LOG))
    W.write(f"jobs/nordlys/quote-{QUOTE_NO}.md", quote_md())
    Chat.msg(C_INGRID, 1,
             f"Hi Ingrid, thanks for today! Quote {QUOTE_NO} is ready: NOK {nok(QUOTE_EXCL)} excl. MVA "
             f"(NOK {nok(QUOTE_INCL)} incl. MVA). It covers all equipment in the BOM (jobs/nordlys/bom.md) plus 2 "
             f"install days for me and Mats, DSP/Teams configuration and travel. Changes since the draft: 75\" "
             f"display instead of 65\", a Sennheiser ceiling mic instead of the table mic, and a 10 m optical "
             f"HDMI cable to reach the rack corner. The quote itself is in jobs/nordlys/quote-{QUOTE_NO}.md. "
             f"Proposed install: Wednesday-Thursday 11-12 March.",
             "13:00")
    Cal.event(E_FOLLOWUP, 2, "Follow up quote Q-2026-014 (Nordlys)", oslo("2026-03-05", "09:00"),
              oslo("2026-03-05", "09:15"), None, "Call Ingrid if no answer on the quote.", reminders=[0])
    Notes.update(4, brief_note([
        "2026-03-02 Lead from Ingrid, site visit booked 2026-03-03 10:00.",
        f"2026-03-03 Site visit done. Quote {QUOTE_NO} sent: NOK {nok(QUOTE_EXCL)} excl. MVA.",
    ]))
    Chat.msg(C_INGRID, INGRID,
             "Thanks Lars, looks very thorough. I'll go through it with our CFO tomorrow morning and get back to you.",
             "13:20")
    Chat.read(C_INGRID, "13:45")

    Chat.msg(C_HENRIK, 1,
             "Visit done. Needed: 1 double outlet behind the display at 1.6 m (plasterboard, steel studs) and 1 "
             "double outlet inside the wall rack in the NE corner. Could you do Tuesday 10 March in the morning?",
             "14:00")
    Shop.set_stock("DIS-SAM-QM65C", 7)  # other customers buying
    Shop.set_stock("MIC-SHU-SM58", 54)
    Chat.msg(C_HENRIK, HENRIK, "Tuesday 10th 08:00-12:00 works. I'll invoice Nordlys directly.", "15:10")
    Chat.read(C_HENRIK, "15:14")
    Cal.event(E_HENRIK, 1, "Henrik (electrician) - outlets at Nordlys", oslo("2026-03-10", "08:00"),
              oslo("2026-03-10", "12:00"), NORDLYS_ADDR,
              "Strand Elektro adds 2 double outlets: behind display (1.6 m) and in the wall rack.",
              attendees=[(1, "accepted"), (HENRIK, "accepted"), (INGRID, "needs_action")], reminders=[1440])

    Chat.msg(C_MATS, 1,
             "Nordlys looks likely. Tentatively Wed-Thu 11-12 March, 08:00-16:00 both days. Day rate as usual "
             "(NOK 5,800).", "16:00")
    Chat.msg(C_MATS, MATS, "Pencilled in. On Thursday I need to leave at 16:00 sharp.", "16:22")
    Chat.read(C_MATS, "16:30")


APPROVAL_MSG_ID = None


def day2() -> None:
    global APPROVAL_MSG_ID
    W.day(2, "07:40")
    Shop.set_stock("CBL-HDMI-2M", 132)
    APPROVAL_MSG_ID = Chat.msg(
        C_INGRID, INGRID,
        f"Good news! Our CFO has signed off: your quote {QUOTE_NO} for NOK {nok(QUOTE_EXCL)} excl. MVA "
        f"(NOK {nok(QUOTE_INCL)} incl. MVA) is APPROVED. Please go ahead and order everything in the BOM "
        f"(jobs/nordlys/bom.md). Our PO number for the invoice is {CLIENT_PO}.", "08:47")
    Chat.msg(C_INGRID, INGRID, "The install on 11-12 March is fine from our side.", "08:50")
    Chat.read(C_INGRID, "09:03")
    Chat.msg(C_INGRID, 1,
             "Fantastic, thank you! I'll place the equipment order in the next few days - the ClickShare is on "
             "backorder until the end of the week, so I'll order everything together once it's in. "
             "11-12 March it is.", "09:05")
    W.at("09:10")
    Notes.update(4, brief_note([
        "2026-03-02 Lead from Ingrid, site visit booked 2026-03-03 10:00.",
        f"2026-03-03 Site visit done. Quote {QUOTE_NO} sent: NOK {nok(QUOTE_EXCL)} excl. MVA.",
        f"2026-03-04 APPROVED by Ingrid in chat (NOK {nok(QUOTE_EXCL)} excl. MVA), PO {CLIENT_PO}.",
        "Next: order equipment (wait for ClickShare CX-30 stock), book install days.",
    ]))
    BOM_LOG.append(f"2026-03-04 APPROVED by Ingrid Solberg in chat: {QUOTE_NO}, NOK {nok(QUOTE_EXCL)} excl. MVA, "
                   f"client PO {CLIENT_PO}.")
    W.write("jobs/nordlys/bom.md", bom_md(BOM_FINAL, f"APPROVED 2026-03-04 ({QUOTE_NO}, PO {CLIENT_PO}) - to order",
                                          BOM_LOG))
    W.at("09:20")
    W.sql("calendar", "UPDATE events SET status = 'cancelled', description = ?, updated_at = ? WHERE id = ?",
          ["Not needed - quote approved 2026-03-04.", NOW, E_FOLLOWUP])
    Chat.msg(C_MATS, 1, "Nordlys is confirmed! 11-12 March.", "09:25")
    Chat.msg(C_MATS, MATS, "Great, locked in.", "09:41")
    Chat.read(C_MATS, "10:02")

    W.at("12:10")
    Shop.deliver(1, "Delivered to workshop, signed L. Eriksen")
    # Sagene Scene visit 13:00-14:00 Oslo = 12:00-13:00Z
    W.at("13:20")
    Notes.note(6, 1, "Sagene Scene - monitor crackle",
               "Stage-left wedge crackles when the cable moves. Wedge itself OK (tested with a new cable).\n"
               "Cause: one of MY 10 m XLR cables (CBL-XLR-10M), bad solder joint at the female end.\n"
               "Swapped the cable. Take the bad one to the workshop and re-solder. No charge for Kari.",
               [T_SAGENE, T_GEAR])
    Chat.msg(C_KARI, 1,
             "Found it - one of my 10 m XLR cables had a bad solder joint at the female end. Swapped it, the "
             "wedge is clean now. No charge for this one.", "13:30")
    Chat.msg(C_KARI, KARI, "You're a star, thanks!", "13:36")
    Chat.read(C_KARI, "13:50")

    W.at("14:00")
    gear_row("CON-GAF-50")[2] = "5"
    GEAR.append(["Velcro cable tie roll 25 m", "CON-VEL-25", "2", "van", "new"])
    GEAR.append(["AA batteries (24-pack)", "CON-BAT-AA24", "1", "storage", "new"])
    W.write("inventory/gear.csv", gear_csv())
    Notes.update(2, "\n".join([
        "- [x] Sagene Scene - jazz nights 20 + 27 Feb, FOH sound: NOK 8,400 (invoice 2026-018)",
        "- [x] Hotel Bislett - ballroom PA check + repair: NOK 5,250 (invoice 2026-019)",
        "- [x] Send reminder: Oslo Kulturnatt invoice 2026-011 (overdue) - reminder sent 2026-03-04",
    ]))


def day3() -> None:
    W.day(3, "07:50")
    Cal.event(E_INSTALL1, 1, "Nordlys install - day 1", oslo("2026-03-11", "08:00"), oslo("2026-03-11", "16:00"),
              NORDLYS_ADDR,
              "Rack, cabling, display mount + display, ceiling speakers and mic. Mats assisting.",
              attendees=[(1, "accepted"), (MATS, "accepted"), (INGRID, "needs_action"), (ERIK, "needs_action")],
              reminders=[1440, 60])
    Cal.event(E_INSTALL2, 1, "Nordlys install - day 2", oslo("2026-03-12", "08:00"), oslo("2026-03-12", "16:00"),
              NORDLYS_ADDR,
              "Camera, ClickShare, P300 config, Teams/Zoom tests, handover to Ingrid at 15:00. Mats leaves 16:00.",
              attendees=[(1, "accepted"), (MATS, "accepted"), (INGRID, "needs_action"), (ERIK, "needs_action")],
              reminders=[60])

    # cart, first pass (from the approved BOM, plus one mistake from the old draft)
    W.at("08:30")
    for sku, qty in [("DIS-SAM-QM75C", 1), ("MNT-VOG-PFW6400", 1), ("CAM-YEA-UVC86", 1), ("MIC-SEN-TCCM", 1),
                     ("DSP-SHU-P300", 1), ("SPK-JBL-C26CT", 1), ("AMP-JBL-CSA2120Z", 1),
                     ("NET-NGR-M4250-10", 1), ("RCK-WALL-12U", 1), ("PWR-FUR-PL8C", 1)]:
        Shop.add(sku, qty)

    Chat.msg(C_ANDERS, ANDERS,
             "Morning Lars - heads-up: only 2 Yealink UVC86 left in Oslo, and the CX-30 batch arrives from our "
             "Bergen warehouse tomorrow morning (3 units). Want me to reserve one for you?", "09:10")
    Chat.read(C_ANDERS, "09:14")
    Chat.msg(C_ANDERS, 1,
             "Yes please - reserve one CX-30, and a UVC86 if you can. I'll order everything together as soon as the "
             "CX-30 is in.", "09:15")
    Chat.msg(C_ANDERS, ANDERS, "Done, both reserved under your account until Monday.", "09:22")
    Chat.read(C_ANDERS, "09:28")
    W.at("09:30")
    Shop.set_qty("SPK-JBL-C26CT", 2)  # 26CT is sold per pair: 2 pairs = 4 speakers

    W.at("10:00")
    Notes.note(7, 1, "Nordlys - ordering checklist",
               "\n".join([
                   "- [x] Cart: display, camera, ceiling mic, P300, speakers (2 pairs!), amp, switch, rack, Furman",
                   "- [ ] Mount: check it is the PFW 6852 (75\"), not the draft one",
                   "- [ ] ClickShare CX-30 (arrives Friday, reserved by Anders)",
                   "- [ ] Cables: HDMI 2 m x2, HDMI AOC 10 m, USB-C 3 m, patch 1 m 5-pack x2",
                   "- [ ] Cat6 box, speaker cable, RJ45: from own stock (no order)",
                   "- [ ] Delivery address: Nordlys reception",
               ]), [T_NORDLYS, T_CHECKLIST, T_TODO])
    W.at("10:30")
    W.delete("docs/old-rates.txt")

    W.at("11:00")
    gear_row("CBL-XLR-10M", "van")[2] = "5"
    GEAR.append(["XLR microphone cable 10 m", "CBL-XLR-10M", "1", "workshop", "broken"])
    gear_row("CBL-CAT6-305")[3] = "van"
    W.write("inventory/gear.csv", gear_csv())

    Chat.msg(C_GROUP, ERIK,
             "VLAN 40 (AV) is ready: 10.40.0.0/24, gateway 10.40.0.1, DHCP from .100. Please use static "
             ".10-.20 for the P300, camera and ClickShare. Uplink is port 12 on the 2nd floor switch.", "13:00")
    Chat.read(C_GROUP, "13:05")
    Chat.msg(C_GROUP, 1, "Perfect, thanks Erik.", "13:06")
    Notes.note(8, 1, "Nordlys - network details (from Erik)",
               "\n".join([
                   "VLAN 40 AV: 10.40.0.0/24, gw 10.40.0.1, DHCP .100+",
                   "Static plan:",
                   "- 10.40.0.10 M4250 switch (mgmt)",
                   "- 10.40.0.11 Shure P300",
                   "- 10.40.0.12 Sennheiser TCC M",
                   "- 10.40.0.13 Yealink UVC86",
                   "- 10.40.0.14 ClickShare CX-30",
                   "Uplink: port 12, 2nd floor switch.",
               ]), [T_NORDLYS, T_NETWORK])
    Cal.respond(E_INSTALL1, ERIK, "accepted")
    Cal.respond(E_INSTALL2, ERIK, "accepted")
    Shop.set_stock("SPK-QSC-K122", 5)


def day4() -> None:
    W.day(4, "07:45")
    Shop.set_stock("WPS-BAR-CX30", 3)  # Bergen batch arrives
    Shop.set_stock("CAM-YEA-UVC86", 1)  # someone else bought one
    Chat.msg(C_ANDERS, ANDERS,
             "The CX-30s are in! One is held for you. FYI someone bought a UVC86 this morning, the last one is "
             "yours.", "08:10")
    Chat.msg(C_INGRID, INGRID,
             "Hi Lars, small problem: the board has booked Fjellrommet for a meeting on Wednesday 11th until 13:00. "
             "Could we move the install to Thursday-Friday 12-13 March?", "08:30")
    Chat.read(C_INGRID, "08:50")
    Chat.msg(C_INGRID, 1,
             "No problem - I'll move it to Thursday 12 and Friday 13 March, same hours. I'll check with Mats.",
             "08:55")
    Cal.move(E_INSTALL1, oslo("2026-03-12", "08:00"), oslo("2026-03-12", "16:00"))
    Cal.move(E_INSTALL2, oslo("2026-03-13", "08:00"), oslo("2026-03-13", "16:00"))
    W.sql("calendar", "UPDATE events SET description = ?, updated_at = ? WHERE id = ?",
          ["Camera, ClickShare, P300 config, Teams/Zoom tests, handover to Ingrid at 15:00.", NOW, E_INSTALL2])
    Chat.msg(C_MATS, 1,
             "Change of plans: Nordlys moved to Thu-Fri 12-13 March (board meeting in the room on Wednesday). "
             "Still OK?", "09:00")
    Chat.msg(C_MATS, MATS,
             "Thu-Fri works, but Thursday I have to leave at 16:00 sharp for the Rockefeller rig.", "09:20")
    Chat.read(C_MATS, "09:26")
    Chat.msg(C_MATS, 1, "Noted, we'll do the heavy lifting before lunch on Thursday.", "09:27")
    Cal.respond(E_INSTALL1, INGRID, "accepted")
    Cal.respond(E_INSTALL2, INGRID, "accepted")
    Chat.read(C_ANDERS, "09:40")

    # cart, second pass
    W.at("10:00")
    Shop.remove("MNT-VOG-PFW6400")  # draft mount (65"), wrong for the 75" display
    Shop.add("MNT-VOG-PFW6852", 1)
    Shop.add("WPS-BAR-CX30", 1)
    Shop.add("CBL-HDMI-2M", 3)
    Shop.add("CBL-HDMI-AOC10", 1)
    Shop.add("CBL-USBC-3M", 1)
    Shop.add("CBL-CAT6-P1", 2)
    W.at("10:06")
    Shop.set_qty("CBL-HDMI-2M", 2)
    Notes.update(7, "\n".join([
        "- [x] Cart: display, camera, ceiling mic, P300, speakers (2 pairs!), amp, switch, rack, Furman",
        "- [x] Mount: PFW 6852 (75\") - removed the draft PFW 6400 from the cart",
        "- [x] ClickShare CX-30 (in stock since Friday morning)",
        "- [x] Cables: HDMI 2 m x2, HDMI AOC 10 m, USB-C 3 m, patch 1 m 5-pack x2",
        "- [ ] Cat6 box, speaker cable, RJ45: from own stock (no order)",
        "- [ ] Delivery address: Nordlys reception",
        "- [ ] Compare cart with bom.md, then order (Saturday morning)",
    ]))
    Chat.msg(C_HENRIK, HENRIK,
             "Hi Lars, still on for Tuesday 10th at Nordlys? I'll bring a helper for the cable routing.", "12:15")
    Chat.read(C_HENRIK, "12:40")
    Chat.msg(C_HENRIK, 1, "Yes, Tuesday 10th still stands. Install is Thu-Fri after that.", "12:41")
    Chat.msg(C_INGRID, INGRID, "Thanks for being flexible!", "13:05")


ORDER2 = None


def day5() -> None:
    global ORDER2
    W.day(5, "08:55")
    Chat.read(C_INGRID)
    W.at("09:00")
    W.insert("shop", "addresses", id=2, user_id=1, label="Nordlys Studio", recipient="Ingrid Solberg",
             company="Nordlys Studio AS", street="Maridalsveien 87, 2nd floor (reception)", postal_code="0461",
             city="Oslo", country="NO", phone="+47 934 55 120", is_default=0, created_at=NOW, updated_at=NOW)
    # sanity: the cart is exactly the 'order' lines of the approved BOM
    assert {s: q for s, (_, q) in Shop.cart.items()} == {s: q for s, q, src in BOM_FINAL if src == "order"}
    W.at("09:05")
    ORDER2 = Shop.place_order(2, ORDER2_NO, 2, first_item_id=4)
    assert ORDER2[0] == ORDER_SUBTOTAL
    subtotal, shipping, vat, total = ORDER2
    Chat.msg(C_INGRID, 1,
             f"Equipment ordered this morning: AVLager order {ORDER2_NO}, NOK {nok(subtotal)} excl. MVA for the "
             f"parts bought new (the Cat6 box, speaker cable and RJ45s come from my own stock). Delivery to your "
             f"reception, expected Monday. Could reception sign for about 9 boxes?", "09:20")
    Chat.msg(C_ANDERS, 1, f"Order {ORDER2_NO} placed - thanks for holding the CX-30 and the UVC86!", "09:25")
    W.at("09:30")
    Notes.update(7, "\n".join([
        "- [x] Cart: display, camera, ceiling mic, P300, speakers (2 pairs!), amp, switch, rack, Furman",
        "- [x] Mount: PFW 6852 (75\") - removed the draft PFW 6400 from the cart",
        "- [x] ClickShare CX-30 (in stock since Friday morning)",
        "- [x] Cables: HDMI 2 m x2, HDMI AOC 10 m, USB-C 3 m, patch 1 m 5-pack x2",
        "- [x] Cat6 box, speaker cable, RJ45: from own stock (no order) - packed in the van",
        "- [x] Delivery address: Nordlys reception",
        f"- [x] Compare cart with bom.md, then order -> {ORDER2_NO} placed 2026-03-07",
    ]))
    Notes.update(4, brief_note([
        "2026-03-02 Lead from Ingrid, site visit booked 2026-03-03 10:00.",
        f"2026-03-03 Site visit done. Quote {QUOTE_NO} sent: NOK {nok(QUOTE_EXCL)} excl. MVA.",
        f"2026-03-04 APPROVED by Ingrid in chat (NOK {nok(QUOTE_EXCL)} excl. MVA), PO {CLIENT_PO}.",
        "2026-03-06 Install moved to Thu-Fri 12-13 March (board meeting on the 11th).",
        f"2026-03-07 Equipment ordered: AVLager {ORDER2_NO}, NOK {nok(total)} incl. MVA, delivery to reception.",
        "Next: Henrik outlets Tue 10th, install Thu-Fri 12-13 March.",
    ]))
    BOM_LOG.append(f"2026-03-07 Ordered the `order` lines from AVLager: {ORDER2_NO} (shop order #2), "
                   f"NOK {nok(subtotal)} excl. MVA.")
    ordered = (f"AVLager order {ORDER2_NO} (shop order #2) placed 2026-03-07, ship to Nordlys reception. "
               f"Subtotal NOK {nok(subtotal)}, shipping NOK {nok(shipping)}, MVA NOK {nok(vat)}, "
               f"total NOK {nok(total)}. Status: placed.")
    W.write("jobs/nordlys/bom.md", bom_md(BOM_FINAL, f"ORDERED 2026-03-07 ({ORDER2_NO})", BOM_LOG, ordered))
    Chat.msg(C_INGRID, INGRID, "Great! Yes, I'll let reception know on Monday morning.", "10:40")
    Chat.read(C_INGRID, "11:02")


def day6() -> None:
    W.day(6, "08:30")
    Shop.ship(2, "Bring", TRACKING)
    Chat.msg(C_ANDERS, ANDERS,
             f"Hi Lars - your order {ORDER2_NO} left our warehouse this morning with Bring, tracking {TRACKING}. "
             f"9 parcels, delivery Monday before 16:00.", "08:40")
    Chat.read(C_ANDERS, "09:15")
    Chat.msg(C_INGRID, 1,
             f"The equipment has shipped: Bring tracking {TRACKING}, 9 parcels, expected Monday 9 March before "
             f"16:00 at your reception.", "09:18")
    W.at("09:25")
    subtotal, shipping, vat, total = ORDER2
    BOM_LOG.append(f"2026-03-08 Shipped with Bring, tracking {TRACKING} (9 parcels), ETA 2026-03-09.")
    ordered = (f"AVLager order {ORDER2_NO} (shop order #2) placed 2026-03-07, ship to Nordlys reception. "
               f"Subtotal NOK {nok(subtotal)}, shipping NOK {nok(shipping)}, MVA NOK {nok(vat)}, "
               f"total NOK {nok(total)}. Status: shipped 2026-03-08, Bring tracking {TRACKING}.")
    W.write("jobs/nordlys/bom.md", bom_md(BOM_FINAL, f"SHIPPED 2026-03-08 ({ORDER2_NO}, Bring {TRACKING})",
                                          BOM_LOG, ordered))
    Cal.event(E_DELIVERY, 1, "Nordlys - check delivery", oslo("2026-03-09", "15:00"), oslo("2026-03-09", "16:00"),
              NORDLYS_ADDR, f"Count the 9 parcels from {ORDER2_NO} against jobs/nordlys/bom.md.",
              attendees=[(1, "accepted"), (INGRID, "needs_action")], reminders=[30])
    # housekeeping: drop the old ideas note
    W.at("10:00")
    W.sql("notes", "DELETE FROM note_tags WHERE note_id = ?", [3])
    W.sql("notes", "DELETE FROM notes WHERE id = ?", [3])
    Chat.msg(C_INGRID, INGRID, "👍 Reception is informed.", "11:12")
    Chat.msg(C_MATS, MATS, "Do you want me to bring my Zarges ladder on Thursday? The ceiling is 2.7 m, right?",
             "17:30")
    Chat.read(C_MATS, "18:02")
    Chat.msg(C_MATS, 1, "Yes please, 2.7 m. Mine is a bit short for the ceiling tiles.", "18:03")


def day7() -> None:
    W.day(7, "07:55")
    Shop.set_stock("CON-GAF-50", 280)
    Chat.msg(C_HENRIK, HENRIK, "FYI: we'll start at 08:00 tomorrow at Nordlys, should be done by 12.", "07:58")
    # second job: Bakeriet Fjord
    W.at("09:30")
    sid, name, handle, email, phone, company, title = SOFIE
    W.insert("chat", "users", id=sid, name=name, handle=handle, email=email, phone=phone, company=company,
             title=title, created_at=NOW, updated_at=NOW)
    Chat.conversation(C_SOFIE, "direct", None, [1, SOFIE_ID])
    Chat.msg(C_SOFIE, SOFIE_ID,
             "Hi Lars, Sofie Nilsen from Bakeriet Fjord on Thorvald Meyers gate. Kari at Sagene Scene gave me your "
             "name. We want background music in the café and a small projector + a microphone for evening events "
             "(quiz nights, readings). Could you come and have a look?", "09:35")
    Chat.read(C_SOFIE, "09:50")
    Chat.msg(C_SOFIE, 1, "Hi Sofie! Happy to. How about tomorrow, Tuesday 10 March at 13:00?", "09:52")
    Chat.msg(C_SOFIE, SOFIE_ID, "Tuesday 13:00 works. See you then!", "10:04")
    Chat.read(C_SOFIE, "10:10")
    W.insert("calendar", "contacts", id=sid, name=name, email=email, phone=phone, company=company,
             created_at=NOW, updated_at=NOW)
    Cal.event(E_FJORD, 1, "Site visit - Bakeriet Fjord", oslo("2026-03-10", "13:00"), oslo("2026-03-10", "14:00"),
              "Bakeriet Fjord, Thorvald Meyers gate 40, 0555 Oslo",
              "Background music + projector and mic for events. Bring the demo projector.",
              attendees=[(1, "accepted"), (SOFIE_ID, "accepted")], reminders=[60])
    Notes.note(9, 1, "Bakeriet Fjord - first call",
               "\n".join([
                   "Client: Sofie Nilsen (owner), Bakeriet Fjord, Thorvald Meyers gate 40.",
                   "Referral from Kari (Sagene Scene).",
                   "- Background music, whole café (~60 m²), streaming from an iPad",
                   "- Events: projector + screen, 1 wireless mic, small speakers",
                   "- Site visit Tue 2026-03-10 13:00",
                   "Ideas: 2 pairs Bose DM3SE + QSC SPA2-60, demo the Epson EB-L630U.",
               ]), [T_FJORD, T_TODO])
    W.write("jobs/fjord/brief.md", "\n".join([
        "# Bakeriet Fjord - café sound and event AV",
        "",
        "- Client: Sofie Nilsen, Bakeriet Fjord, Thorvald Meyers gate 40, 0555 Oslo",
        "- Contact: sofie@bakerietfjord.no, +47 915 67 208",
        "- Referral: Kari Haugen, Sagene Scene",
        "- Site visit: 2026-03-10 13:00",
        "",
        "## Wishes",
        "",
        "1. Background music in the whole café, played from an iPad",
        "2. Projector and screen for quiz nights and readings",
        "3. One wireless handheld microphone",
        "",
        "## First ideas (to confirm on site)",
        "",
        f"- 2x {PNAME['SPK-BOS-DM3SE']} - NOK {nok(PRICE['SPK-BOS-DM3SE'])} per pair",
        f"- 1x {PNAME['AMP-QSC-SPA2-60']} - NOK {nok(PRICE['AMP-QSC-SPA2-60'])}",
        f"- 1x {PNAME['MIC-SHU-BLX24']} - NOK {nok(PRICE['MIC-SHU-BLX24'])}",
        "- Projector: show the Epson demo unit first",
        "",
    ]))
    W.at("10:40")
    Shop.add("SPK-BOS-DM3SE", 2)
    Shop.add("AMP-QSC-SPA2-60", 1)
    gear_row("PRJ-EPS-EBL630U")[3] = "van"
    W.write("inventory/gear.csv", gear_csv())

    W.at("13:05")
    Shop.deliver(2, "Delivered to Nordlys Studio reception, signed I. Solberg")
    Chat.msg(C_INGRID, INGRID,
             "Delivery arrived - 9 boxes, they're in the storage room next to Fjellrommet.", "13:20")
    Chat.read(C_INGRID, "13:31")
    Chat.msg(C_INGRID, 1, "Perfect, I'll come by at 15:00 to check them.", "13:32")
    Cal.respond(E_DELIVERY, INGRID, "accepted")
    Chat.read(C_HENRIK, "13:40")

    # delivery check 15:00-16:00 Oslo = 14:00-15:00Z
    W.at("15:10")
    checklist = [
        "Delivery checked 2026-03-09: 9/9 parcels, all `order` lines of jobs/nordlys/bom.md present.",
        "",
        "Before Thursday 12 March:",
        "- [x] Equipment delivered (order " + ORDER2_NO + ")",
        "- [ ] Henrik: outlets behind display + in rack (Tue 10th 08:00-12:00)",
        "- [ ] Firmware: download latest for P300, TCC M, UVC86, CX-30",
        "- [ ] Pre-configure the M4250 with VLAN 40 (see note 'Nordlys - network details')",
        "- [ ] Print rack labels (img/rack-label.png template)",
        "- [ ] Van: Cat6 box, speaker cable drum, RJ45 connectors, Mats brings the Zarges ladder",
        "- [ ] Shure Designer project file for Fjellrommet",
        "",
        "Thursday (day 1): rack + cabling, display mount, ceiling speakers + mic.",
        "Friday (day 2): camera, ClickShare, P300 tuning, Teams/Zoom test calls, handover 15:00.",
    ]
    Notes.note(10, 1, "Install prep - Nordlys (Thu-Fri 12-13 March)", "\n".join(checklist),
               [T_NORDLYS, T_CHECKLIST], pinned=1)
    BOM_LOG.append(f"2026-03-09 Delivered to Nordlys reception, 9/9 parcels checked.")
    subtotal, shipping, vat, total = ORDER2
    ordered = (f"AVLager order {ORDER2_NO} (shop order #2) placed 2026-03-07, ship to Nordlys reception. "
               f"Subtotal NOK {nok(subtotal)}, shipping NOK {nok(shipping)}, MVA NOK {nok(vat)}, "
               f"total NOK {nok(total)}. Status: delivered 2026-03-09 (Bring {TRACKING}).")
    W.write("jobs/nordlys/bom.md", bom_md(BOM_FINAL, "DELIVERED 2026-03-09 - install Thu-Fri 12-13 March",
                                          BOM_LOG, ordered))
    W.write("jobs/nordlys/install-checklist.md",
            "# Nordlys Studio - install checklist (Fjellrommet)\n\n" + "\n".join(checklist) + "\n")
    Chat.msg(C_GROUP, 1,
             "Status: all equipment is on site. Henrik does the outlets Tuesday, we install Thursday-Friday "
             "12-13 March, handover Friday 15:00.", "15:20")
    Chat.msg(C_GROUP, ERIK, "Thanks. The uplink port is patched and live.", "15:47")

    Chat.msg(C_KARI, KARI,
             "Hi Lars! Are you available to do sound for our Easter concert on Saturday 28 March? Doors 18:00.",
             "16:30")
    Chat.msg(C_SOFIE, SOFIE_ID, "Oh, one more thing: could the system also play Spotify from the till iPad?",
             "17:05")


def pin_shipped_apps() -> None:
    """Pin the exact code of the apps that serve the demo's services (the world hash
    covers it). Editing an app changes its digest: regenerate this file afterwards."""
    from worldenv.apps import SHIPPED  # needs the project installed (its venv)

    for service in sorted(SHIPPED):
        app = SHIPPED[service]
        W.pin_app(service, app.name, app.version, app.digest)


def build() -> str:
    day0()
    pin_shipped_apps()
    for step in (day1, day2, day3, day4, day5, day6, day7):
        step()
    return W.dump()


def main() -> None:
    text = build()
    with open(OUT_PATH, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
    print(f"wrote {len(W.events)} events to {OUT_PATH}")


if __name__ == "__main__":
    main()
