"""Input hygiene for text that people read: what a question, an option or a note may hold, and when two
options are the same to a reader. Plain functions, so that any API can use them (market/api/_models.py's
types do; so may another FastAPI app):

    clean_text("Is it?\\n", newlines=True)        # the value, or ValueError("contains ...")
    visible_key("a\\u200b") == visible_key("a")   # True: a zero-width space does not make a new option
    skeleton("pаypal") == skeleton("paypal")     # True: a Cyrillic а looks like a Latin a (UTS #39)
    check_distinct(["a", "ａ"], "options")        # ValueError("options: ... read the same ...")

Refused in every text field: NUL and control characters (newline and tab allowed where `newlines`), lone
surrogates (not UTF-8; PostgreSQL refuses them), bidirectional controls (they reorder what a reader sees:
"Trojan Source", CVE-2021-42574), and a text with nothing visible in it. Invisible characters (Unicode's
Default_Ignorable_Code_Point: format characters, variation selectors, fillers, tags, and the blank braille
pattern that renders as nothing) are kept in the text, but `visible_key` drops them, with NFKC
normalisation and whitespace runs collapsed, so texts that differ only by them compare equal. Options are
compared under Unicode's confusable skeleton of that key (UTS #39 section 4: NFD, each character replaced
by its prototype in Unicode's confusables data, NFD again), so homoglyphs from other scripts (Cyrillic а,
Greek ο, ...) and look-alike sequences (rn and m) read the same too.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import defaultdict

# the bidirectional controls: embeddings, overrides, isolates and the implicit marks (Unicode's Bidi_Control)
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt), the format (Cf) characters among them
# included, reserved ones too (U+2065, U+FFF0..U+FFF8, the unassigned tags): rendered as nothing. And
# U+2800, the blank braille pattern, a symbol (So) that renders as a blank. (Python's unicodedata has no
# such property; these ranges are stable: Unicode adds no default-ignorable outside them.)
_INVISIBLE_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x2800, 0x2800),
    (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)  # fmt: skip
_INVISIBLE = frozenset(chr(c) for lo, hi in _INVISIBLE_RANGES for c in range(lo, hi + 1))
# ASCII only (str.isdigit() and \d also take '١' and '²'), canonical: no leading zero ('01' is not round 1)
DIGITS_RE = re.compile(r"0|[1-9][0-9]{0,19}")


def is_invisible(ch: str) -> bool:
    """A character that renders as nothing: a default-ignorable one (format characters among them), or
    blank (U+2800)."""
    return ch in _INVISIBLE or unicodedata.category(ch) == "Cf"


def clean_text(value: str, newlines: bool = False) -> str:
    """`value` unchanged, or ValueError saying what it holds that a text field may not."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate (not valid UTF-8)") from None
    allowed = "\n\t" if newlines else ""
    for ch in value:
        if ch in BIDI_CONTROLS:
            raise ValueError(f"contains the bidirectional control {ascii(ch)} (it reorders the text shown)")
        if unicodedata.category(ch) == "Cc" and ch not in allowed:
            raise ValueError(f"contains the control character {ascii(ch)}")
    if not visible_key(value):
        raise ValueError("expected a non-empty string (of visible characters)")
    return value


def visible_key(value: str) -> str:
    """What a reader sees of `value`: invisible characters dropped, NFKC-normalised ('ａ' and 'ﬁ' are 'a'
    and 'fi'), whitespace runs one space, no leading or trailing space."""
    seen = "".join(ch for ch in value if not is_invisible(ch))
    seen = "".join(ch for ch in unicodedata.normalize("NFKC", seen) if not is_invisible(ch))
    return " ".join(seen.split())


@functools.cache
def _prototypes() -> dict[str, str]:
    """character -> its prototype in Unicode's confusables.txt (UTS #39), rebuilt from the package that ships
    it. confusable-homoglyphs stores each line `source -> prototype` both ways (confusables_data: a string ->
    the strings it is confusable with; right-to-left ones wrapped in U+200E marks for display), so every
    class is a star: its prototype is the centre (the one string with several neighbours, or a sequence,
    never a source), its sources the leaves. Of a class of two single characters either one may be the
    prototype; the smaller is taken (equality under the skeleton does not depend on which)."""
    from confusable_homoglyphs.confusables import confusables_data  # 0.9 MB of JSON: loaded once, on use

    near: defaultdict[str, set[str]] = defaultdict(set)
    for a, entries in confusables_data.items():
        for e in entries:
            x, y = (s.replace("\u200e", "").replace("\u200f", "") for s in (a, e["c"]))
            if x and y and x != y:
                near[x].add(y)
                near[y].add(x)
    out = {}
    for x, ys in near.items():
        if len(x) == 1 and len(ys) == 1:
            (y,) = ys
            if len(y) > 1 or len(near[y]) > 1 or y < x:
                out[x] = y
    # a prototype sequence is made of prototypes (the data is idempotent); of a class of two, the one taken
    return {x: "".join(out.get(ch, ch) for ch in y) for x, y in out.items()}


def skeleton(value: str) -> str:
    """Unicode's confusable skeleton of `value` (UTS #39 section 4): NFD, each character replaced by its
    prototype, NFD again. Two strings a reader could take for each other have the same skeleton."""
    proto = _prototypes()
    mapped = "".join(proto.get(ch, ch) for ch in unicodedata.normalize("NFD", value))
    return unicodedata.normalize("NFD", mapped)


def reading_keys(value: str) -> tuple[str, str]:
    """Two keys of what a reader sees of `value`: the confusable skeleton of its visible_key (NFKC first:
    fullwidth and compatibility forms), and UTS #39's own skeleton of it with only the invisible characters
    dropped and whitespace collapsed (NFKC would turn some look-alikes, a small em dash, into something
    else than what they look like)."""
    bare = " ".join("".join(ch for ch in value if not is_invisible(ch)).split())
    return skeleton(visible_key(value)), skeleton(bare)


def check_distinct(values: list[str], field: str) -> list[str]:
    """`values`, or ValueError naming the first two that read the same: equal in either reading key."""
    first: list[dict[str, int]] = [{}, {}]
    for i, v in enumerate(values):
        for seen, key in zip(first, reading_keys(v), strict=True):
            j = seen.setdefault(key, i)
            if j != i:
                raise ValueError(
                    f"{field}: {ascii(values[j])[:40]} and {ascii(v)[:40]} (items {j} and {i}) read the same "
                    "(they must differ in visible characters, after NFKC normalisation, and not only by "
                    "look-alike characters: Unicode's confusable skeleton, UTS #39)"
                )
    return values


def plain_digits(value: object) -> object:
    """An id as text must be plain ASCII decimal digits, written canonically: '+1', ' 1', '1_0', '1.0', '١'
    and '01' are not round 1 (pydantic's int parsing takes them all). Anything not a string passes to the
    type's own check."""
    if isinstance(value, str) and not DIGITS_RE.fullmatch(value):
        raise ValueError(f"expected plain decimal digits without a leading zero, got {ascii(value)[:40]}")
    return value


NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,62}[A-Za-z0-9])?$"  # pydantic's regex: $ is the very end
NAME_RE = re.compile(NAME_PATTERN.replace("$", r"\Z"))


def agent_name(name: str) -> str:
    """A valid agent name or ValueError (the API's AgentIn and the CLI's add-agent check the same)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(
            f"name: expected 1-64 characters of A-Z a-z 0-9 _ . - starting and ending with a letter or "
            f"digit, got {ascii(name)[:70]}"
        )
    return name
