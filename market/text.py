"""Input hygiene for text that people read: what a question, an option or a note may hold, and when two
options are the same to a reader. Plain functions, so that any API can use them (market/api/_models.py's
types do; so may another FastAPI app):

    clean_text("Is it?\\n", newlines=True)        # the value, or ValueError("contains ...")
    visible_key("a\\u200b") == visible_key("a")   # True: a zero-width space does not make a new option
    check_distinct(["a", "ａ"], "options")        # ValueError("options: ... read the same ...")

Refused in every text field: NUL and control characters (newline and tab allowed where `newlines`), lone
surrogates (not UTF-8; PostgreSQL refuses them), bidirectional controls (they reorder what a reader sees:
"Trojan Source", CVE-2021-42574), and a text with nothing visible in it. Format (Unicode category Cf) and
other invisible characters are kept in the text, but `visible_key` drops them, with NFKC normalisation and
whitespace runs collapsed, so texts that differ only by them compare equal.
"""

from __future__ import annotations

import re
import unicodedata

# the bidirectional controls: embeddings, overrides, isolates and the implicit marks (Unicode's Bidi_Control)
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# default-ignorable code points that are not format (Cf) characters: rendered as nothing (or blank)
_INVISIBLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u3164\uffa0"
    + "".join(map(chr, range(0xFE00, 0xFE10)))  # variation selectors 1-16
    + "".join(map(chr, range(0xE0100, 0xE01F0)))  # variation selectors 17-256
)
DIGITS_RE = re.compile(r"[0-9]{1,20}")  # ASCII only: str.isdigit() and \d also take '١' and '²'


def is_invisible(ch: str) -> bool:
    """A character that renders as nothing: a format character (Cf) or another default-ignorable one."""
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


def check_distinct(values: list[str], field: str) -> list[str]:
    """`values`, or ValueError naming the first two that read the same (visible_key)."""
    first: dict[str, int] = {}
    for i, v in enumerate(values):
        j = first.setdefault(visible_key(v), i)
        if j != i:
            raise ValueError(
                f"{field}: {ascii(values[j])[:40]} and {ascii(v)[:40]} (items {j} and {i}) read the same "
                "(they must differ in visible characters, after NFKC normalisation)"
            )
    return values


def plain_digits(value: object) -> object:
    """An id as text must be plain ASCII decimal digits: '+1', ' 1', '1_0', '1.0' and '١' are not round 1
    (pydantic's int parsing takes them all). Anything not a string passes to the type's own check."""
    if isinstance(value, str) and not DIGITS_RE.fullmatch(value):
        raise ValueError(f"expected plain decimal digits, got {ascii(value)[:40]}")
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
