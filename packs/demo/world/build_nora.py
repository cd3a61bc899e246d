#!/usr/bin/env python3
"""Generate the demo world ``nora.jsonl`` (persona ``nora``).

Nora Lund is an event electrician in Bergen.  Over two world days
(2026-03-16 .. 2026-03-17) she takes on a power refresh of the foyer bar at
Sjøboden Kulturhus and fills her AVLager cart for it.  The shop sells two
surge protectors that are identical in every catalogue field but their SKU:
only their product photos (a black chassis, or a white one with a numeric
voltage display) tell them apart.  See README.md next to this file.

Standard library only, fully deterministic (no randomness, no clock): the
product photos are PNGs drawn here and compressed by a small fixed-Huffman
DEFLATE encoder of this script (not ``zlib.compress``, whose bytes depend on
the zlib build), so running ``python packs/demo/world/build_nora.py``
rewrites ``nora.jsonl`` next to this script byte for byte.  The shop and
chat schemas are build_lars.py's, imported from it.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import zlib
from datetime import date

sys.dont_write_bytecode = True  # leave no __pycache__ in the pack
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_lars import NOW, CHAT_SCHEMA, SHOP_SCHEMA, World  # noqa: E402  (lars's schemas and emitter)

PERSONA = "nora"
START = date(2026, 3, 16)  # world day 0 (a Monday)
OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nora.jsonl")


# --------------------------------------------------------------------------
# Event emitter (build_lars.World, for this persona)
# --------------------------------------------------------------------------

W = World(PERSONA, START)


# --------------------------------------------------------------------------
# PNG: a palette canvas and a deterministic DEFLATE encoder
# --------------------------------------------------------------------------

WIDTH, HEIGHT = 320, 240

# Fixed-Huffman DEFLATE tables (RFC 1951, 3.2.5)
_LEN_BASE = [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99,
             115, 131, 163, 195, 227, 258]
_LEN_EXTRA = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0]
_DIST_BASE = [1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025,
              1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577]
_DIST_EXTRA = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11,
               12, 12, 13, 13]


class _Bits:
    def __init__(self) -> None:
        self.out = bytearray()
        self.acc = 0
        self.n = 0

    def put(self, value: int, nbits: int) -> None:
        """`nbits` bits of `value`, least significant first (DEFLATE's extra bits)."""
        self.acc |= value << self.n
        self.n += nbits
        while self.n >= 8:
            self.out.append(self.acc & 0xFF)
            self.acc >>= 8
            self.n -= 8

    def code(self, code: int, nbits: int) -> None:
        """A Huffman code, most significant bit first."""
        rev = 0
        for _ in range(nbits):
            rev = (rev << 1) | (code & 1)
            code >>= 1
        self.put(rev, nbits)

    def flush(self) -> bytes:
        if self.n:
            self.out.append(self.acc & 0xFF)
            self.acc, self.n = 0, 0
        return bytes(self.out)


def _literal(bits: _Bits, sym: int) -> None:
    if sym < 144:
        bits.code(0x30 + sym, 8)
    elif sym < 256:
        bits.code(0x190 + sym - 144, 9)
    elif sym < 280:
        bits.code(sym - 256, 7)
    else:
        bits.code(0xC0 + sym - 280, 8)


def _match(bits: _Bits, length: int, dist: int) -> None:
    i = max(k for k, base in enumerate(_LEN_BASE) if base <= length)
    _literal(bits, 257 + i)
    bits.put(length - _LEN_BASE[i], _LEN_EXTRA[i])
    j = max(k for k, base in enumerate(_DIST_BASE) if base <= dist)
    bits.code(j, 5)
    bits.put(dist - _DIST_BASE[j], _DIST_EXTRA[j])


def deflate_zlib(data: bytes, stride: int) -> bytes:
    """A zlib stream of `data`: one fixed-Huffman block whose matches repeat the byte
    before (distance 1) or the row above (distance `stride`), chosen greedily."""
    bits = _Bits()
    bits.put(1, 1)  # BFINAL
    bits.put(1, 2)  # BTYPE = 01, fixed Huffman codes
    i, n = 0, len(data)
    while i < n:
        best, best_dist = 0, 0
        for dist in (1, stride):
            if dist > i:
                continue
            k = 0
            while k < 258 and i + k < n and data[i + k] == data[i + k - dist]:
                k += 1
            if k > best:
                best, best_dist = k, dist
        if best >= 3:
            _match(bits, best, best_dist)
            i += best
        else:
            _literal(bits, data[i])
            i += 1
    _literal(bits, 256)  # end of block
    return b"\x78\x01" + bits.flush() + struct.pack(">I", zlib.adler32(data))


class Canvas:
    """A WIDTH x HEIGHT picture of palette colours (at most 256)."""

    def __init__(self, background: tuple[int, int, int]) -> None:
        self.palette: list[tuple[int, int, int]] = []
        self.px = [[self.colour(background)] * WIDTH for _ in range(HEIGHT)]

    def colour(self, rgb: tuple[int, int, int]) -> int:
        if rgb not in self.palette:
            self.palette.append(rgb)
            assert len(self.palette) <= 256
        return self.palette.index(rgb)

    def rect(self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int]) -> None:
        """Fill x0 <= x < x1, y0 <= y < y1 (clipped to the canvas)."""
        c = self.colour(rgb)
        for y in range(max(0, y0), min(HEIGHT, y1)):
            row = self.px[y]
            for x in range(max(0, x0), min(WIDTH, x1)):
                row[x] = c

    def box(self, x0: int, y0: int, x1: int, y1: int, fill: tuple[int, int, int],
            edge: tuple[int, int, int], r: int = 0) -> None:
        """A rectangle with a 2 px edge and corners rounded by radius `r`."""
        self.rounded(x0, y0, x1, y1, r, edge)
        self.rounded(x0 + 2, y0 + 2, x1 - 2, y1 - 2, max(0, r - 2), fill)

    def rounded(self, x0: int, y0: int, x1: int, y1: int, r: int, rgb: tuple[int, int, int]) -> None:
        c = self.colour(rgb)
        for y in range(max(0, y0), min(HEIGHT, y1)):
            row = self.px[y]
            for x in range(max(0, x0), min(WIDTH, x1)):
                cx = x0 + r if x < x0 + r else x1 - 1 - r if x > x1 - 1 - r else x
                cy = y0 + r if y < y0 + r else y1 - 1 - r if y > y1 - 1 - r else y
                if (x - cx) ** 2 + (y - cy) ** 2 <= r * r:
                    row[x] = c

    def disc(self, cx: int, cy: int, r: int, rgb: tuple[int, int, int], inner: int = -1) -> None:
        """A filled circle, or a ring (inner radius `inner`)."""
        c = self.colour(rgb)
        for y in range(max(0, cy - r), min(HEIGHT, cy + r + 1)):
            row = self.px[y]
            for x in range(max(0, cx - r), min(WIDTH, cx + r + 1)):
                d2 = (x - cx) ** 2 + (y - cy) ** 2
                if inner * inner < d2 <= r * r or (inner < 0 and d2 <= r * r):
                    row[x] = c

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(row) for row in self.px)  # filter type 0 per row

        def chunk(tag: bytes, body: bytes) -> bytes:
            return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

        ihdr = struct.pack(">IIBBBBB", WIDTH, HEIGHT, 8, 3, 0, 0, 0)  # 8-bit palette
        plte = b"".join(bytes(rgb) for rgb in self.palette)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"PLTE", plte)
                + chunk(b"IDAT", deflate_zlib(raw, WIDTH + 1)) + chunk(b"IEND", b""))


BACKDROP = (236, 239, 243)
SHADOW = (204, 208, 215)

# 7-segment digits: which of a, b, c, d, e, f, g are lit
SEGMENTS = {"0": "abcdef", "1": "bc", "2": "abdeg", "3": "abcdg", "4": "bcfg", "5": "acdfg",
            "6": "acdefg", "7": "abc", "8": "abcdefg", "9": "abcdfg"}


def seven_segment(cv: Canvas, x: int, y: int, digit: str, lit: tuple[int, int, int],
                  dim: tuple[int, int, int]) -> None:
    """One digit, 14 x 27 px, segment 3 px thick; unlit segments show faintly."""
    w, h, t = 14, 27, 3
    segs = {
        "a": (x + t, y, x + w - t, y + t),
        "b": (x + w - t, y + t, x + w, y + 12),
        "c": (x + w - t, y + 15, x + w, y + h - t),
        "d": (x + t, y + h - t, x + w - t, y + h),
        "e": (x, y + 15, x + t, y + h - t),
        "f": (x, y + t, x + t, y + 12),
        "g": (x + t, y + 12, x + w - t, y + 15),
    }
    for name, (x0, y0, x1, y1) in segs.items():
        cv.rect(x0, y0, x1, y1, lit if name in SEGMENTS[digit] else dim)


def schuko(cv: Canvas, cx: int, cy: int, face: tuple[int, int, int], rim: tuple[int, int, int]) -> None:
    """A Schuko outlet: a recessed round socket, two pin holes, earthing clips."""
    cv.disc(cx, cy, 13, rim)
    cv.disc(cx, cy, 11, face)
    cv.disc(cx - 5, cy, 2, (20, 20, 22))
    cv.disc(cx + 5, cy, 2, (20, 20, 22))
    cv.rect(cx - 2, cy - 11, cx + 3, cy - 8, (176, 180, 186))
    cv.rect(cx - 2, cy + 9, cx + 3, cy + 12, (176, 180, 186))


def power_strip(chassis: tuple[int, int, int], edge: tuple[int, int, int],
                socket: tuple[int, int, int], rim: tuple[int, int, int], outlets: int,
                x0: int, x1: int, display: str | None) -> bytes:
    """A surge protector seen from above: chassis, red switch, optional 7-segment voltage
    display, `outlets` Schuko sockets, the cable leaving on the right."""
    cv = Canvas(BACKDROP)
    y0, y1 = 82, 158
    cv.rounded(x0 + 4, y0 + 6, x1 + 4, y1 + 6, 10, SHADOW)  # shadow
    cv.rect(x1 - 2, 116, WIDTH, 124, edge)  # cable
    cv.rect(x1 - 2, 118, WIDTH, 122, chassis)
    cv.box(x0, y0, x1, y1, chassis, edge, r=10)
    cv.rounded(x0 + 9, 104, x0 + 29, 136, 3, (120, 16, 16))  # rocker switch
    cv.rounded(x0 + 11, 106, x0 + 27, 124, 2, (214, 38, 32))
    start = x0 + 36
    if display is not None:
        cv.rounded(start, 98, start + 64, 142, 3, (70, 74, 80))
        cv.rect(start + 3, 101, start + 61, 139, (22, 16, 16))
        for k, ch in enumerate(display):
            seven_segment(cv, start + 8 + 18 * k, 107, ch, (255, 72, 40), (58, 26, 22))
        start += 72
    pitch = (x1 - 10 - start) // outlets
    for k in range(outlets):
        schuko(cv, start + pitch // 2 + pitch * k, 120, socket, rim)
    return cv.png()


BLACK = dict(chassis=(34, 35, 38), edge=(12, 12, 14), socket=(52, 54, 58), rim=(24, 24, 26))
WHITE = dict(chassis=(246, 246, 244), edge=(168, 170, 174), socket=(226, 227, 229),
             rim=(188, 190, 194))


def photo_sp6_black() -> bytes:
    return power_strip(**BLACK, outlets=6, x0=12, x1=308, display=None)


def photo_sp6_white_display() -> bytes:
    return power_strip(**WHITE, outlets=6, x0=12, x1=308, display="230")


def photo_sp3_white() -> bytes:
    return power_strip(**WHITE, outlets=3, x0=70, x1=250, display=None)


def photo_cable_reel() -> bytes:
    cv = Canvas(BACKDROP)
    cv.rect(60, 46, 260, 58, (30, 30, 32))  # handle
    cv.rect(60, 46, 72, 214, (30, 30, 32))
    cv.rect(248, 46, 260, 214, (30, 30, 32))
    cv.disc(164, 134, 84, SHADOW)
    cv.disc(160, 130, 84, (196, 36, 34))  # drum
    cv.disc(160, 130, 76, (40, 40, 44), inner=70)  # wound cable
    cv.disc(160, 130, 46, (70, 72, 76))  # hub
    schuko(cv, 140, 130, (52, 54, 58), (24, 24, 26))
    schuko(cv, 180, 130, (52, 54, 58), (24, 24, 26))
    return cv.png()


def photo_cee_cable() -> bytes:
    cv = Canvas(BACKDROP)
    cv.disc(164, 124, 88, SHADOW, inner=48)
    for k, r in enumerate(range(88, 48, -6)):  # a coil: rings of two blues
        cv.disc(160, 120, r, (28, 86, 190) if k % 2 == 0 else (20, 64, 150), inner=r - 6)
    cv.rounded(236, 160, 300, 212, 8, (24, 70, 160))  # CEE plug
    cv.disc(268, 186, 16, (16, 40, 96))
    return cv.png()


def photo_work_light() -> bytes:
    cv = Canvas(BACKDROP)
    cv.rect(156, 150, 164, 228, (40, 40, 44))  # tripod mast
    cv.rect(110, 222, 210, 228, (40, 40, 44))
    cv.box(70, 30, 250, 150, (252, 250, 232), (236, 186, 20), r=8)  # housing + panel
    cv.rect(72, 32, 248, 44, (236, 186, 20))
    for x in range(90, 240, 20):  # LED rows
        for y in range(62, 140, 20):
            cv.disc(x, y, 5, (255, 255, 255))
    return cv.png()


def photo_gaffer_tape() -> bytes:
    cv = Canvas(BACKDROP)
    cv.disc(164, 124, 86, SHADOW)
    cv.disc(160, 120, 86, (28, 28, 30), inner=48)
    cv.disc(160, 120, 48, (196, 164, 112), inner=40)  # cardboard core
    cv.disc(160, 120, 40, BACKDROP)
    cv.rect(236, 112, 300, 128, (28, 28, 30))  # loose end
    return cv.png()


# --------------------------------------------------------------------------
# Static data
# --------------------------------------------------------------------------

# id, name, handle, email, phone, company, title
PEOPLE = [
    (1, "Nora Lund", "nora", "nora@lundscenestrom.no", "+47 951 20 384", "Lund Scenestrøm", "Event electrician"),
    (2, "Jonas Vik", "jonas.vik", "jonas@sjoboden.no", "+47 924 11 870", "Sjøboden Kulturhus", "Venue manager"),
    (3, "Hilde Aas", "hilde.aas", "hilde.aas@avlager.no", "+47 552 30 114", "AVLager AS", "Account manager, Bergen"),
    (4, "Per Nygård", "per.nygard", "per@nygardlys.no", "+47 981 44 502", "Nygård Lys", "Lighting technician"),
]
NORA, JONAS, HILDE, PER = 1, 2, 3, 4
C_JONAS, C_HILDE, C_PER = 1, 2, 3

CATEGORIES = [
    (1, "power", "Power & surge protection"),
    (2, "cables", "Cables"),
    (3, "lighting", "Lighting"),
    (4, "consumables", "Consumables"),
]

SP6_NAME = "Strømvakt SP-6 surge protector, 6 outlets, 3 m"
LOOKALIKE = "PWR-SVK-SP6-3107"  # black chassis, no display
TARGET = "PWR-SVK-SP6-3112"  # white chassis, numeric voltage display

# sku, category slug, name, brand, unit, price NOK (excl. MVA), stock, photo
PRODUCTS = [
    (LOOKALIKE, "power", SP6_NAME, "Strømvakt", "pcs", 649, 14, photo_sp6_black),
    (TARGET, "power", SP6_NAME, "Strømvakt", "pcs", 649, 14, photo_sp6_white_display),
    ("PWR-SVK-SP3-2040", "power", "Strømvakt SP-3 travel surge protector, 3 outlets, 1.5 m", "Strømvakt",
     "pcs", 349, 25, photo_sp3_white),
    ("PWR-BRN-REEL25", "power", "Cable reel 25 m, 4 outlets, thermal cut-out", "Brennenstuhl", "pcs",
     1190, 8, photo_cable_reel),
    ("CBL-CEE16-10M", "cables", "CEE 16 A extension cable 3x2.5 mm², 10 m", "Titanex", "pcs", 890, 12,
     photo_cee_cable),
    ("CBL-SCH-5M", "cables", "Schuko extension cable, rubber, 5 m", "Titanex", "pcs", 329, 40, None),
    ("LGT-LED-WL50", "lighting", "LED work light 50 W on tripod", "Ledlenser", "pcs", 1490, 6,
     photo_work_light),
    ("CON-GAF-50", "consumables", "Gaffer tape 50 mm x 50 m black", "Le Mark", "roll", 189, 300,
     photo_gaffer_tape),
    ("CON-BAT-AA24", "consumables", "AA batteries (24-pack)", "Duracell", "pack", 219, 110, None),
]
PID = {p[0]: i + 1 for i, p in enumerate(PRODUCTS)}
CAT_ID = {c[1]: c[0] for c in CATEGORIES}

BRIEF_MD = """# Sjøboden Kulturhus - foyer bar and stage power

- Client: Sjøboden Kulturhus, Bryggen 41, 5003 Bergen (contact: Jonas Vik, venue manager)
- Job: LS-2026-07
- Install: Friday 2026-03-20, 08:00-15:00 (venue closed until 18:00)

## Scope

1. Foyer bar counter: replace the loose extension cords behind the bar with two surge
   protectors on the counter (coffee machine, till, fridge, lights)
2. Stage left and right: fixed 16 A CEE feeds for the touring rigs
3. Tidy the cable runs in the foyer (gaffer, no trip hazards)

## Purchases

Everything bought for the job is listed in `purchases.csv` (one line per SKU:
`sku,qty,for,status`, status `cart` until ordered, then the order number).
"""

SUPPLIERS_MD = """# Suppliers

| supplier | what | contact | account |
|----------|------|---------|---------|
| AVLager AS (Bergen warehouse) | power, cables, lighting, consumables | Hilde Aas, hilde.aas@avlager.no | customer 40318 |
| Nygård Lys | lighting hire, extra hands | Per Nygård, per@nygardlys.no | - |

AVLager prices are excl. MVA (25 %); free shipping from NOK 5,000.
"""

PURCHASES_HEADER = "sku,qty,for,status"


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
        W.insert("chat", "messages", id=mid, conversation_id=conv, sender_id=sender, body=body,
                 sent_at=NOW, is_read=1 if sender == NORA else 0, created_at=NOW, updated_at=NOW)
        return mid

    @staticmethod
    def read(conv: int, hhmm: str | None = None) -> None:
        if hhmm:
            W.at(hhmm)
        W.sql("chat", "UPDATE messages SET is_read = 1, updated_at = :ts "
                      "WHERE conversation_id = :conv AND sender_id <> 1 AND is_read = 0",
              {"ts": NOW, "conv": conv})

    @staticmethod
    def conversation(cid: int, members: list[int]) -> None:
        W.insert("chat", "conversations", id=cid, kind="direct", title=None, created_by=NORA,
                 created_at=NOW, updated_at=NOW)
        for uid in members:
            W.insert("chat", "conversation_members", conversation_id=cid, user_id=uid,
                     role="owner" if uid == NORA else "member", joined_at=NOW)


class Cart:
    next_id = 1

    @classmethod
    def add(cls, sku: str, qty: int) -> None:
        W.insert("shop", "cart_items", id=cls.next_id, user_id=NORA, product_id=PID[sku], quantity=qty,
                 added_at=NOW, updated_at=NOW)
        cls.next_id += 1


PURCHASES: list[str] = [PURCHASES_HEADER]


def purchase(sku: str, qty: int, what: str) -> None:
    PURCHASES.append(f"{sku},{qty},{what},cart")
    W.write("jobs/sjoboden/purchases.csv", "\n".join(PURCHASES) + "\n")


# --------------------------------------------------------------------------
# The story
# --------------------------------------------------------------------------


def day0() -> None:
    W.day(0, "07:30")
    for stmt in CHAT_SCHEMA:
        W.sql("chat", stmt)
    for stmt in SHOP_SCHEMA:
        W.sql("shop", stmt)
    W.sql("shop", """CREATE TABLE product_images(
        product_id INTEGER PRIMARY KEY REFERENCES products(id), content_type TEXT NOT NULL,
        data BLOB NOT NULL, alt TEXT)""")

    W.at("07:35")
    for uid, name, handle, email, phone, company, title in PEOPLE:
        W.insert("chat", "users", id=uid, name=name, handle=handle, email=email, phone=phone,
                 company=company, title=title, created_at=NOW, updated_at=NOW)
    Chat.conversation(C_JONAS, [NORA, JONAS])
    Chat.conversation(C_HILDE, [NORA, HILDE])
    Chat.conversation(C_PER, [NORA, PER])

    # the AVLager catalogue, photos included; Nora's shop account
    W.at("07:40")
    for cid, slug, name in CATEGORIES:
        W.insert("shop", "categories", id=cid, slug=slug, name=name, created_at=NOW, updated_at=NOW)
    for sku, cat, name, brand, unit, price, stock, _photo in PRODUCTS:
        W.insert("shop", "products", id=PID[sku], category_id=CAT_ID[cat], sku=sku, name=name,
                 brand=brand, unit=unit, price_cents=price * 100, currency="NOK", stock=stock,
                 is_active=1, created_at=NOW, updated_at=NOW)
    for sku, _cat, name, *_rest, photo in PRODUCTS:
        if photo is not None:
            # The alt text is the page's ("Photo of <name>"): it says nothing the name does not.
            W.sql("shop", f"INSERT INTO product_images(product_id, content_type, data, alt) "
                          f"VALUES (?, ?, X'{photo().hex().upper()}', ?)",
                  [PID[sku], "image/png", f"Photo of {name}"])
    W.insert("shop", "users", id=NORA, name="Nora Lund", email="nora@lundscenestrom.no",
             phone="+47 951 20 384", company="Lund Scenestrøm", org_number="931204577",
             created_at=NOW, updated_at=NOW)
    W.insert("shop", "addresses", id=1, user_id=NORA, label="Workshop", recipient="Nora Lund",
             company="Lund Scenestrøm", street="Damsgårdsveien 71", postal_code="5058", city="Bergen",
             country="NO", phone="+47 951 20 384", is_default=1, created_at=NOW, updated_at=NOW)

    W.at("07:50")
    W.write("docs/suppliers.md", SUPPLIERS_MD)

    Chat.msg(C_JONAS, JONAS,
             "Hi Nora, Jonas at Sjøboden. We finally have the budget for the foyer: the bar counter needs proper "
             "power (the extension cords behind the bar are a mess) and the stage needs fixed 16 A feeds for "
             "touring rigs. Could you do it on Friday 20 March? The venue is closed until 18:00.", "09:12")
    Chat.read(C_JONAS, "09:40")
    Chat.msg(C_JONAS, NORA,
             "Hi Jonas! Friday 20th works, 08:00-15:00. I'll order the parts from AVLager this week and send you "
             "the list.", "09:42")
    Chat.msg(C_JONAS, JONAS, "Great, thanks! I'll tell the bar staff.", "09:55")
    Chat.read(C_JONAS, "10:02")

    W.at("10:10")
    W.write("jobs/sjoboden/brief.md", BRIEF_MD)
    W.at("10:20")
    Cart.add("CON-GAF-50", 4)
    purchase("CON-GAF-50", 4, "foyer cable runs")

    Chat.msg(C_HILDE, HILDE,
             "Hi Nora! FYI the Strømvakt SP-6 surge protectors are back in the Bergen warehouse, in two batches "
             "with separate SKUs. The product pages in the web shop have photos of both.", "13:30")
    Chat.read(C_HILDE, "13:45")
    Chat.msg(C_HILDE, NORA, "Thanks Hilde, good to know.", "13:46")


def day1() -> None:
    W.day(1, "08:05")
    Chat.msg(C_PER, PER,
             "Morning! For Sjøboden on Friday: bring two 10 m CEE 16 A extensions for the stage feeds, my touring "
             "rig has short tails.", "08:05")
    Chat.read(C_PER, "08:30")
    Chat.msg(C_PER, NORA, "Will do, thanks Per.", "08:31")
    W.at("08:35")
    Cart.add("CBL-CEE16-10M", 2)
    purchase("CBL-CEE16-10M", 2, "stage left and right feeds")

    Chat.msg(C_JONAS, JONAS,
             "Hi Nora, one more thing for the bar counter: the bar staff want to see the mains voltage, so please "
             "get the white surge protector with the numeric voltage display from AVLager. A black one would look "
             "awful on our white counter anyway. We need 2 units. Could you put them in your cart and note them "
             "in the job's purchase list?", "14:20")


def pin_shipped_apps() -> None:
    """Pin the exact code of the apps that serve this world's services (the world hash
    covers it). Editing an app changes its digest: regenerate this file afterwards."""
    from worldenv.apps import SHIPPED  # needs the project installed (its venv)

    for service in ("chat", "shop"):
        app = SHIPPED[service]
        W.pin_app(service, app.name, app.version, app.digest)


def build() -> str:
    day0()
    pin_shipped_apps()
    day1()
    return W.dump()


def main() -> None:
    text = build()
    with open(OUT_PATH, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
    print(f"wrote {len(W.events)} events to {OUT_PATH}")


if __name__ == "__main__":
    main()
