"""The audit's proof of the state: rebuild every ledger row from the event log alone, then compare the
tables with it field by field.

    expected, max_diff = rebuild(event_rows)      # raises Mismatch (one line) on an event that cannot be
    problem = compare(rows, expected)             # None when every table equals what the log says

The log is replayed in order: agents, tokens (as sha256 of the stored token hash), revocations and limits;
rounds with the settings their round_opened event recorded; reports (each accepted only while its round was
open); resolutions, corrections and voids, whose pay rows are recomputed from the replayed reports with
the ledger's own payouts.round_payouts (train/mechanism.py) and must equal what the event recorded, within
the deficit bound, a correction's or void's reversals the exact negation of the entry before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from walla.market.api import RoundSettings
from walla.market.audit._values import where
from walla.market.ledger.common import token_check
from walla.market.payouts import round_payouts

TOLERANCE = 1e-12  # |recorded - recomputed| per payout (both float64 through the same formulas)
ENTRY_OF = {"resolved": "resolve", "resolution_corrected": "correct", "round_voided": "void"}
FLOATS = ("score", "baseline", "advantage", "payout")  # payout columns compared to TOLERANCE


# the data fields a walla older than its audit (before 2026-11-28, when the audit began to prove the state)
# did not write, by event kind, and the column each proves: those ledgers cannot be proved, only said so
SINCE_AUDIT = {
    "operator_added": ("name", "token"),
    "agent_added": ("token",),
    "operator_token_set": ("token",),
    "token_rotated": ("token",),
    "report": ("id",),
}
PROVES = {
    "name": "agents.name",
    "token": "agents.token_hash (which token acts as which agent)",
    "id": "reports.id and payouts.report_id (which report each payout paid)",
}


class Mismatch(Exception):
    """One line naming the first event or row that does not agree with the log."""


@dataclass
class State:
    agents: dict = field(default_factory=dict)  # id -> columns
    rounds: dict = field(default_factory=dict)  # id -> columns
    reports: dict = field(default_factory=dict)  # (round_id, agent_id) -> columns
    resolutions: dict = field(default_factory=dict)  # (round_id, seq) -> columns
    payouts: dict = field(default_factory=dict)  # (round_id, seq, agent_id, kind) -> columns
    max_diff: float = 0.0


def _agent(s: State, e, d: dict) -> None:
    if e.kind in ("agent_added", "operator_added"):
        if e.agent_id in s.agents:
            raise Mismatch(f"events: row {e.id} ({e.kind}) adds agent {e.agent_id} a second time")
        role = d["role"] if e.kind == "agent_added" else "operator"
        s.agents[e.agent_id] = {
            "name": d["name"],
            "role": role,
            "created_at": e.at,
            "max_wager": d.get("max_wager"),
            "floor": d.get("floor"),
            "revoked_at": None,
            "token_hash": d["token"],
        }
        return
    a = s.agents.get(e.agent_id)
    if a is None:
        raise Mismatch(f"events: row {e.id} ({e.kind}) names agent {e.agent_id}, which no event added")
    if e.kind == "token_revoked":
        a["revoked_at"] = e.at
    else:  # operator_token_set, token_rotated (which reinstates a revoked agent)
        a["token_hash"] = d["token"]
        a["revoked_at"] = None


def _round(s: State, e, d: dict) -> dict:
    r = s.rounds.get(e.round_id)
    if r is None:
        raise Mismatch(f"events: row {e.id} ({e.kind}) names round {e.round_id}, which no event opened")
    return r


def _open(s: State, e, d: dict) -> None:
    if e.round_id in s.rounds:
        raise Mismatch(f"events: row {e.id} (round_opened) opens round {e.round_id} a second time")
    c = d["settings"]
    s.rounds[e.round_id] = {
        "question": d["question"],
        "options": d["options"],
        "n_options": len(d["options"]),
        **{k: c[k] for k in ("variant", "c1", "c2", "c3", "pooling")},
        "status": "open",
        "close_at": d["close_at"],
        "created_at": e.at,
        "closed_at": None,
        "publish_pool": d["publish_pool"],
        "max_wager": d["max_wager"],
        "criteria": d["criteria"],
        "source": d["source"],
        "walla_version": d["walla_version"],
    }


def _close(s: State, e, d: dict) -> None:
    r = _round(s, e, d)
    if r["status"] != "open":
        raise Mismatch(
            f"events: row {e.id} (round_closed) closes round {e.round_id}, which was {r['status']}"
        )
    r["status"], r["closed_at"] = "closed", d["closed_at"]


def _report(s: State, e, d: dict) -> None:
    r = _round(s, e, d)
    if r["status"] != "open" or (r["close_at"] is not None and e.at >= r["close_at"]):
        raise Mismatch(f"events: row {e.id} (report) is a report to round {e.round_id} after it closed")
    if s.agents.get(e.agent_id, {}).get("role") != "agent":
        raise Mismatch(f"events: row {e.id} (report) is from agent {e.agent_id}, which no event added")
    if len(d["probabilities"]) != r["n_options"]:
        raise Mismatch(f"events: row {e.id} (report) has {len(d['probabilities'])} probabilities")
    old = s.reports.get((e.round_id, e.agent_id))
    if d["version"] != (old["version"] + 1 if old else 1) or (old and old["id"] != d["id"]):
        raise Mismatch(f"events: row {e.id} (report) version {d['version']} does not follow the one before")
    s.reports[(e.round_id, e.agent_id)] = {
        "id": d["id"],
        "probabilities": d["probabilities"],
        "wager": d["wager"],
        "version": d["version"],
        "submitted_at": e.at,
    }


def _entry(s: State, e, d: dict) -> None:
    r, kind, seq = _round(s, e, d), ENTRY_OF[e.kind], d["seq"]
    last = max((q for (rid, q) in s.resolutions if rid == e.round_id), default=0)
    allowed = {
        "resolve": ("open", "closed"),
        "correct": ("resolved",),
        "void": ("open", "closed", "resolved"),
    }
    if seq != last + 1 or r["status"] not in allowed[kind]:
        raise Mismatch(f"events: row {e.id} ({e.kind}) seq {seq} of round {e.round_id}, {r['status']}")
    # the settings its round_opened event recorded (stored values: checked when they were written)
    settings = RoundSettings.model_construct(**{k: r[k] for k in ("variant", "c1", "c2", "c3", "pooling")})
    bound = settings.deficit_bound
    reps = [] if kind == "void" else sorted((a, v) for (rid, a), v in s.reports.items() if rid == e.round_id)
    target = d["target"]
    pay = round_payouts(
        [v["probabilities"] for _, v in reps], [v["wager"] for _, v in reps], target, settings
    )
    recorded = d["payouts"]
    if sorted(recorded) != sorted(str(a) for a, _ in reps):
        raise Mismatch(
            f"events: row {e.id} ({e.kind}) pays agents {sorted(recorded)}, not the round's reports"
        )
    for i, (a, v) in enumerate(reps):
        diff = abs(recorded[str(a)] - pay.payout[i])
        s.max_diff = max(s.max_diff, diff)
        if diff > TOLERANCE * max(1.0, abs(pay.payout[i])):
            raise Mismatch(
                f"events: row {e.id} ({e.kind}) pays agent {a} {recorded[str(a)]!r}, recomputed from its "
                f"report {pay.payout[i]!r}"
            )
        s.payouts[(e.round_id, seq, a, "pay")] = {
            "report_id": v["id"],
            "wager": v["wager"],
            **{k: getattr(pay, k)[i] for k in ("score", "baseline", "advantage")},
            "payout": recorded[str(a)],
        }
    prev = {k[2]: v for k, v in s.payouts.items() if k[:2] == (e.round_id, seq - 1) and k[3] == "pay"}
    if d["reversed"] != {str(a): -p["payout"] for a, p in prev.items()}:
        raise Mismatch(f"events: row {e.id} ({e.kind}) does not reverse entry {seq - 1}'s payouts exactly")
    for a, p in prev.items():
        s.payouts[(e.round_id, seq, a, "reverse")] = {**p, "payout": -p["payout"]}
    total = d["total_payout"]
    if abs(total - sum(recorded.values())) > TOLERANCE * max(1.0, len(recorded)) or total > bound + TOLERANCE:
        raise Mismatch(f"events: row {e.id} ({e.kind}) total {total!r} (its payouts, bound {bound!r})")
    s.resolutions[(e.round_id, seq)] = {
        "kind": kind,
        "label": d["label"],
        "target": target,
        "n_reports": len(reps),
        "total_payout": total,
        "deficit_bound": bound,
        "resolved_at": e.at,
        "note": d["note"],
    }
    r["status"] = "void" if kind == "void" else "resolved"
    if kind != "correct":
        r["closed_at"] = r["closed_at"] or e.at


def _chain_only(s: State, e, d: dict) -> None:
    """key_set, key_rotated, head_recorded: about the chain itself (events.first_unsigned and audit_heads
    check them), no table row."""


APPLY = {
    "key_set": _chain_only,
    "key_rotated": _chain_only,
    "head_recorded": _chain_only,
    "agent_added": _agent,
    "operator_added": _agent,
    "operator_token_set": _agent,
    "token_revoked": _agent,
    "token_rotated": _agent,
    "round_opened": _open,
    "round_closed": _close,
    "report": _report,
    **{k: _entry for k in ENTRY_OF},
}


def rebuild(event_rows: list) -> State:
    """The state the event log describes (raises Mismatch on an event that is unknown, out of place or
    malformed)."""
    s = State()
    for e in event_rows:
        fn = APPLY.get(e.kind)
        if fn is None:
            raise Mismatch(f"events: row {e.id} has an unknown kind {e.kind!r}")
        try:
            data = json.loads(e.data)
            _check_not_older(e, data)
            fn(s, e, data)
        except KeyError as err:
            raise Mismatch(
                f"events: row {e.id} ({e.kind}) data lacks {err} (written by an older walla, or edited)"
            ) from None
        except (TypeError, ValueError, IndexError, AttributeError) as err:
            raise Mismatch(
                f"events: row {e.id} ({e.kind}) data is malformed ({type(err).__name__}: {err})"
            ) from None
    return s


def _check_not_older(e, data) -> None:
    """Raise Mismatch, saying so plainly, for an event written before the audit's fields existed: the values
    it lacks are not in the ledger anywhere the audit could prove them from, and none is made up."""
    missing = [f for f in SINCE_AUDIT.get(e.kind, ()) if isinstance(data, dict) and f not in data]
    if missing:
        s = "s" if len(missing) > 1 else ""
        raise Mismatch(
            f"ledger written by a walla older than its audit (before 2026-11-28): event {e.id} ({e.kind}) "
            f"lacks field{s} {', '.join(missing)}, so the audit cannot prove "
            f"{', '.join(PROVES[f] for f in missing)} from the event log; its chain verified, its state is "
            "unproven (export it with walla market export and start a new ledger)"
        )


def _stored(table: str, row) -> tuple[tuple, dict]:
    """(the row's key in State, its columns as the replay builds them) of a stored row."""
    cols = row._asdict()
    if table == "agents":
        cols["token_hash"] = token_check(cols["token_hash"])
        return (cols.pop("id"),), cols
    if table == "rounds":
        cols["options"] = json.loads(cols["options"])
        return (cols.pop("id"),), cols
    if table == "reports":
        cols["probabilities"] = json.loads(cols["probabilities"])
        return (cols.pop("round_id"), cols.pop("agent_id")), cols
    if table == "resolutions":
        cols["target"] = json.loads(cols["target"])
        return (cols.pop("round_id"), cols.pop("seq")), cols
    cols.pop("id")
    return (cols.pop("round_id"), cols.pop("seq"), cols.pop("agent_id"), cols.pop("kind")), cols


def _differs(table: str, col: str, have, want) -> bool:
    if table == "payouts" and col in FLOATS:
        return abs(have - want) > TOLERANCE * max(1.0, abs(want))
    return have != want


def compare(rows: dict[str, list], s: State) -> str | None:
    """The first row of the tables that is not what the event log says, as one line; None when all agree.
    First rows without an event (or events without a row), then each row's columns."""
    tables = ("agents", "rounds", "reports", "resolutions", "payouts")
    stored = {t: {} for t in tables}
    for t in tables:
        for row in rows[t]:
            key, cols = _stored(t, row)
            stored[t][key if len(key) > 1 else key[0]] = (row, cols)
    for t in tables:
        want = getattr(s, t)
        for key, (row, _) in stored[t].items():
            if key not in want:
                return f"{where(t, row)} has no event (the event log was cut short?)"
        for key in want:
            if key not in stored[t]:
                return f"{t}: {key} is in the event log but not in the table (a row deleted?)"
    for t in tables:
        for key, (row, cols) in stored[t].items():
            for col, value in getattr(s, t)[key].items():
                if _differs(t, col, cols[col], value):
                    if col == "token_hash":
                        return f"{where(t, row)} column token_hash is not the token its events set (swapped?)"
                    return f"{where(t, row)} column {col} is {cols[col]!r} but the event log says {value!r}"
    return None
