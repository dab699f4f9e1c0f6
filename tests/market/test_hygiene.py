"""Issue 37, finding 9: what a reader sees, ids as plain digits, whole answers. Each test here failed before
the fix: look-alike options, bidi controls and '+1' as an id were accepted, a report's answer said
"submitted_at": null, the 409 of a same-answer correction was cut off and HEAD was a 405.

On SQLite and on the suite's PostgreSQL (the `market` fixture), over a live server.
"""

from __future__ import annotations

import random
import sys
import unicodedata

import httpx
import pytest
from market_fixtures import OP_TOKEN, snapshot
from walla.market.text import check_distinct, clean_text, is_invisible, skeleton, visible_key

OP = {"Authorization": f"Bearer {OP_TOKEN}"}


def _one_line(r: httpx.Response, status: int, field: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert list(r.json()) == ["error"] and error.startswith(f"{field}:") and "\n" not in error, r.text


@pytest.mark.parametrize(
    "options",
    [
        ["yes", "yes\u200b"],  # zero-width space
        ["yes", "y\u00ades"],  # soft hyphen
        ["yes", "\u2060yes"],  # word joiner
        ["yes", "yes\ufe0f"],  # variation selector (Mn, default-ignorable)
        ["yes", "\uff59\uff45\uff53"],  # fullwidth letters (NFKC)
        ["fine", "\ufb01ne"],  # the fi ligature (NFKC)
        ["a b", "a\u00a0 b "],  # no-break space, a run of spaces, a trailing space
    ],
)
def test_options_that_read_the_same_are_refused(market, options):
    before = snapshot(market.ledger)
    r = httpx.post(f"{market.url}/rounds", json={"question": "q?", "options": options}, headers=OP)
    _one_line(r, 400, "options")
    assert "read the same" in r.json()["error"]
    assert snapshot(market.ledger) == before


def test_options_that_look_different_are_kept(market):
    r = httpx.post(
        f"{market.url}/rounds", json={"question": "q?", "options": ["Yes", "yes", "y es"]}, headers=OP
    )
    assert r.status_code == 201, r.text
    assert r.json()["options"] == ["Yes", "yes", "y es"]  # stored as sent


BIDI = ["\u202e", "\u202a", "\u2066", "\u2069", "\u200f", "\u061c"]


@pytest.mark.parametrize("ch", BIDI)
def test_bidi_controls_are_refused_in_every_text_field(market, ch):
    rid = market.op.open_round("open?", ["a", "b"])["id"]
    before = snapshot(market.ledger)
    base = {"question": "q?", "options": ["a", "b"]}
    cases = [
        ("POST", "/rounds", {**base, "question": f"is {ch}it?"}, "question"),
        ("POST", "/rounds", {**base, "options": ["a", f"b{ch}"]}, "options[1]"),
        ("POST", "/rounds", {**base, "criteria": f"x{ch}"}, "criteria"),
        ("POST", "/rounds", {**base, "source": f"{ch}x"}, "source"),
        ("POST", f"/rounds/{rid}/void", {"reason": f"r{ch}"}, "reason"),
        ("POST", f"/rounds/{rid}/resolve", {"label": 0, "note": f"n{ch}"}, "note"),
    ]
    for method, path, body, field in cases:
        r = httpx.request(method, market.url + path, json=body, headers=OP)
        _one_line(r, 400, field)
        assert "bidirectional control" in r.json()["error"]
    assert snapshot(market.ledger) == before


@pytest.mark.parametrize("text", ["\u200b", "\u200b \u2060", "\u3164", "\ufe0f\t"])
def test_text_with_nothing_visible_is_refused(market, text):
    before = snapshot(market.ledger)
    for body, field in [
        ({"question": text, "options": ["a", "b"]}, "question"),
        ({"question": "q?", "options": ["a", text]}, "options[1]"),
    ]:
        _one_line(httpx.post(f"{market.url}/rounds", json=body, headers=OP), 400, field)
    assert snapshot(market.ledger) == before


def test_text_helpers_for_other_apps():
    """market/text.py's plain functions (walla serve reuses them): the same rules without pydantic."""
    assert clean_text("Is it?\n", newlines=True) == "Is it?\n"
    assert visible_key(" a\u200b\u00a0\uff42 ") == "a b"
    with pytest.raises(ValueError, match="bidirectional"):
        clean_text("a\u202eb")
    with pytest.raises(ValueError, match=r"^opts: "):
        check_distinct(["x", "x\u00ad"], "opts")


# ------------------------------------------------ homoglyphs and blank-looking options (issue 47, item 5)


def _confusable_pairs() -> list[tuple[str, str]]:
    """Every pair of Unicode's confusables data (confusable-homoglyphs' copy of confusables.txt: each line
    stored both ways) whose two sides are in NFD, where UTS #39's skeleton maps them (it decomposes first)."""
    from confusable_homoglyphs.confusables import confusables_data

    pairs = set()
    for a, entries in confusables_data.items():
        for e in entries:
            x, y = (t.replace("\u200e", "").replace("\u200f", "") for t in (a, e["c"]))
            if x != y and all(unicodedata.is_normalized("NFD", t) for t in (x, y)):
                pairs.add((min(x, y), max(x, y)))
    return sorted(pairs)


LOOKALIKES = [  # options a reader takes for each other (UTS #39 skeleton); NFKC alone kept all these apart
    ["paypal", "p\u0430ypal"],  # Cyrillic a
    ["yes", "\u0443\u0435\u0455"],  # Cyrillic u, ie, dze
    ["no", "n\u03bf"],  # Greek omicron
    ["Apple", "\u0410pple"],  # Cyrillic A
    ["B", "\u0392"],  # Greek Beta
    ["cat", "\u0441\u0430t"],  # Cyrillic es, a
    ["hello", "\u04bb\u0435llo"],  # Cyrillic shha, ie
    ["modern", "modem"],  # rn and m
    ["w", "\u051d"],  # Cyrillic we
    ["0", "O"],
    ["l", "1"],
    ["I", "l"],
    ["x", "\u00d7"],  # multiplication sign
    ["a-b", "a\u2010b"],  # hyphen
    ["ok", "\u03bfk"],  # Greek omicron
    ["Tea", "\u13a2ea"],  # Cherokee TA
    ["a", "\u0251"],  # Latin alpha
    ["i", "\u0456"],  # Cyrillic i
    ["p", "\u0440"],  # Cyrillic er
    ["S", "\u0405"],  # Cyrillic dze
    ["y", "\u0443"],  # Cyrillic u
]
# blank-looking: the blank braille pattern, Hangul fillers, a reserved default-ignorable, a tag, a
# variation selector, a musical-notation format character
BLANKS = ["\u2800", "\u3164", "\uffa0", "\u115f", "\u2065", "\U000e0020", "\U000e0100", "\U0001d173"]


def test_every_confusable_pair_of_unicodes_data_reads_the_same():
    """Generated from the data: each of its ~5,000 NFD pairs, inside a word, is refused as two options."""
    pairs = _confusable_pairs()
    assert len(pairs) > 4000
    missed = []
    for x, y in pairs:
        try:
            check_distinct([f"a{x}b", f"a{y}b"], "options")
            missed.append((x, y))
        except ValueError as e:
            assert "read the same" in str(e)
    assert not missed, [tuple(map(ascii, p)) for p in missed[:20]]


def test_skeletons_keep_what_looks_different():
    rng = random.Random(47)
    words = ["".join(rng.choice("abcdefghjkpqstuxyz") for _ in range(rng.randint(1, 6))) for _ in range(300)]
    words = sorted(set(words))
    assert len({skeleton(w) for w in words}) == len(words)  # letters that do not look alike stay apart
    check_distinct(["Yes", "yes", "y es", "No", "Maybe"], "options")


def test_blank_looking_characters_are_invisible():
    """Generated: every format character, and the blank-looking BLANKS: alone it is no text, beside a letter
    it makes no new option."""
    chars = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"] + BLANKS
    for ch in chars:
        if ch in "\u061c\u200e\u200f" or "\u202a" <= ch <= "\u202e" or "\u2066" <= ch <= "\u2069":
            continue  # the bidirectional controls: refused for what they are
        assert is_invisible(ch), ascii(ch)
        with pytest.raises(ValueError, match="non-empty string"):
            clean_text(ch * 2)
        with pytest.raises(ValueError, match="read the same"):
            check_distinct(["ok", f"o{ch}k"], "options")


@pytest.mark.parametrize("options", LOOKALIKES, ids=[ascii(o[1]) for o in LOOKALIKES])
def test_lookalike_options_are_refused(market, options):
    before = snapshot(market.ledger)
    r = httpx.post(f"{market.url}/rounds", json={"question": "q?", "options": options}, headers=OP)
    _one_line(r, 400, "options")
    assert "read the same" in r.json()["error"]
    assert snapshot(market.ledger) == before


def test_generated_confusable_and_blank_options_are_refused(market):
    """A seeded sample of the generated pairs and every blank-looking option, over HTTP on both databases."""
    before = snapshot(market.ledger)
    for x, y in random.Random(47).sample(_confusable_pairs(), 40):
        body = {"question": "q?", "options": [f"a{x}b", f"a{y}b"]}  # some are marks: inside a word
        _one_line(httpx.post(f"{market.url}/rounds", json=body, headers=OP), 400, "options")
    for ch in BLANKS:
        body = {"question": "q?", "options": ["a", ch]}
        _one_line(httpx.post(f"{market.url}/rounds", json=body, headers=OP), 400, "options[1]")
        body = {"question": "q?", "options": ["a", f"a{ch}"]}
        _one_line(httpx.post(f"{market.url}/rounds", json=body, headers=OP), 400, "options")
    assert snapshot(market.ledger) == before


@pytest.mark.parametrize(
    "rid", ["%2B1", "%201", "1%20", "1.0", "1_0", "1e0", "%D9%A1", "0x1", "-0", "01", "001", "00"]
)
def test_round_ids_are_plain_decimal_digits(market, rid):
    """/rounds/%2B1 used to be round 1 (pydantic's int parsing takes '+1', ' 1', '1.0', '1_0', '١'), and
    /rounds/01 until issue 47: an id is written one way."""
    market.op.open_round("one?", ["a", "b"])
    r = httpx.get(f"{market.url}/rounds/{rid}", headers=OP)
    _one_line(r, 404, "round")
    assert httpx.get(f"{market.url}/rounds/1", headers=OP).status_code == 200


@pytest.mark.parametrize(
    "query", ["after=%2B0", "after=0.0", "after=1_0", "limit=%2010", "limit=1e2", "after=00", "limit=010"]
)
def test_query_ids_are_plain_decimal_digits(market, query):
    field = query.split("=")[0]
    _one_line(httpx.get(f"{market.url}/rounds?{query}", headers=OP), 400, field)
    alice = market.agent("alice")
    _one_line(httpx.get(f"{market.url}/me/payouts?{query}", headers=alice.http.headers), 400, field)


ID_PATHS = [
    ("GET", "/rounds/{}"),
    ("POST", "/rounds/{}/close"),
    ("POST", "/rounds/{}/resolve"),
    ("POST", "/rounds/{}/correct"),
    ("POST", "/rounds/{}/void"),
    ("GET", "/rounds/{}/reports"),
    ("GET", "/rounds/{}/history"),
    ("GET", "/rounds/{}/pool"),
    ("GET", "/rounds/{}/report"),
    ("PUT", "/rounds/{}/report"),
]


def test_ids_at_the_columns_limits_are_404_or_400_never_500(market):
    """Ids around 2**31 (PostgreSQL's integer) and 2**63 (SQLite's): an unknown round, or a 400 in a query."""
    alice = market.agent("alice")
    bodies = {
        "resolve": {"label": 0},
        "correct": {"label": 0},
        "void": {"reason": "r"},
        "report": {"probabilities": [0.5, 0.5], "wager": 0.1},
    }
    for big in [2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64]:
        for method, path in ID_PATHS:
            body = bodies.get(path.rsplit("/", 1)[-1]) if method != "GET" else None
            headers = alice.http.headers if path.endswith("/report") else OP
            r = httpx.request(method, market.url + path.format(big), json=body, headers=headers)
            _one_line(r, 404, "round")
        for query, ok in [("after", big <= 2**31 - 1), ("limit", False)]:
            r = httpx.get(f"{market.url}/rounds?{query}={big}", headers=OP)
            if ok:
                assert r.status_code == 200 and r.json() == [], r.text
            else:
                _one_line(r, 400, query)


def test_a_report_answer_carries_its_time(market):
    alice = market.agent("alice")
    rid = market.op.open_round("q?", ["a", "b"])["id"]
    answer = alice.submit(rid, [0.5, 0.5], 0.1)
    assert isinstance(answer["submitted_at"], float)
    assert answer == alice.my_report(rid)  # the stored time, not a second clock read
    again = alice.submit(rid, [0.4, 0.6], 0.1)
    assert again["version"] == 2 and again["submitted_at"] >= answer["submitted_at"]
    assert again == alice.my_report(rid)


def test_same_answer_correction_is_a_whole_409(market):
    alice = market.agent("alice")
    rid = market.op.open_round("q?", ["a", "b"])["id"]
    alice.submit(rid, [0.7, 0.3], 0.2)
    market.op.resolve(rid, label=0)
    before = snapshot(market.ledger)
    r = httpx.post(f"{market.url}/rounds/{rid}/correct", json={"label": 0}, headers=OP)
    assert r.status_code == 409
    assert r.json() == {
        "error": f"label: round {rid} is already resolved with this answer; nothing to correct"
    }
    r = httpx.post(f"{market.url}/rounds/{rid}/correct", json={"target": [1.0, 0.0]}, headers=OP)
    assert r.json()["error"].startswith("target: ") and r.json()["error"].endswith("nothing to correct")
    assert snapshot(market.ledger) == before


def test_head_is_answered_where_get_is(market):
    rid = market.op.open_round("q?", ["a", "b"])["id"]
    for path, headers in [("/", {}), ("/rounds", OP), (f"/rounds/{rid}", OP), ("/openapi.json", {})]:
        get, head = (
            httpx.get(market.url + path, headers=headers),
            httpx.head(market.url + path, headers=headers),
        )
        assert head.status_code == get.status_code == 200, (path, head.status_code)
        assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
    assert httpx.head(f"{market.url}/rounds", headers={}).status_code == 401  # the same rules as GET
    assert httpx.head(f"{market.url}/rounds/{rid}/close", headers=OP).status_code == 405  # POST only
    assert market.op.round(rid)["status"] == "open"


def test_ids_past_the_id_columns_are_refused_with_a_4xx(market):
    """Issue 47, item 5: with the round id sequence at 2^31 - 1 (PostgreSQL's integer, the API's MAX_ID) the
    next round was a 500 on PostgreSQL (and on SQLite a round id the API cannot name). Now: 409, one line,
    nothing written; the last id still works."""
    from sqlalchemy import text
    from walla.market.api import MAX_ID

    first = market.op.open_round("first?", ["a", "b"])["id"]
    with market.ledger.engine.begin() as conn:  # the next round id is MAX_ID
        if conn.dialect.name == "postgresql":
            conn.execute(text(f"SELECT setval(pg_get_serial_sequence('rounds', 'id'), {MAX_ID - 1})"))
        else:  # SQLite: max(rowid) + 1
            conn.execute(text(f"UPDATE rounds SET id = {MAX_ID - 1} WHERE id = {first}"))
    assert market.op.open_round("last?", ["a", "b"])["id"] == MAX_ID
    assert httpx.get(f"{market.url}/rounds/{MAX_ID}", headers=OP).json()["question"] == "last?"
    before = snapshot(market.ledger)
    r = httpx.post(
        f"{market.url}/rounds", json={"question": "one too many?", "options": ["a", "b"]}, headers=OP
    )
    _one_line(r, 409, "id")
    assert "round ids are used up" in r.json()["error"]
    assert snapshot(market.ledger) == before
    _one_line(httpx.get(f"{market.url}/rounds/{MAX_ID + 1}", headers=OP), 404, "round")
