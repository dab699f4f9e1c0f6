"""`facts`: generated private-fact yes/no questions (DESIGN.md "Models").

Each row is one short invented fact (the context, e.g. "The door of room 42 is painted red.") and
a yes/no question about it ("Is the door of room 42 painted blue?"). The facts are arbitrary, so a
model without the fact can only guess, while even a 135M model reads a one-sentence fact well:
this is what lets the offline demo show WALLA discovering the informed agent.

Balanced: exactly floor(n/2) "yes" rows (the question asks the fact's own value), the others ask
a different value of the same kind. Ten templates (colours, counts, cities, days, animals,
materials, fruit, instruments, vehicles); every (template, entity number) pair is used once, so
an irrelevant context (another row's fact) never talks about the same entity. Person names were
tried and dropped: SmolLM2-135M cannot use a fact about who owns what (AUC ~0.5 with the fact),
while on each template kept here it ranks yes above no with AUC 0.8-0.99 given the fact (bare
"<fact> <question>" prompt; the few-shot template in prompts.py is better still).
"""

from __future__ import annotations

import random

from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row, generated

DEFAULTS = {"n": 2000, "seed": 7}

# (fact template, question template, values); {e} = entity number, {v} = value; the generator splits the
# values on spaces.
TEMPLATES: list[tuple[str, str, str]] = [
    (
        "The door of room {e} is painted {v}.",
        "Is the door of room {e} painted {v}?",
        "red blue green yellow white black orange purple",
    ),
    (
        "Locker {e} holds {v} boxes.",
        "Does locker {e} hold {v} boxes?",
        "two three four five six seven eight nine",
    ),
    (
        "Ship {e} sails to {v}.",
        "Does ship {e} sail to {v}?",
        "Paris Tokyo Lima Cairo Oslo Delhi Boston Sydney",
    ),
    (
        "The train {e} leaves on {v}.",
        "Does the train {e} leave on {v}?",
        "Monday Tuesday Wednesday Thursday Friday Saturday Sunday",
    ),
    (
        "The pet in flat {e} is a {v}.",
        "Is the pet in flat {e} a {v}?",
        "cat dog rabbit parrot turtle hamster goldfish snake",
    ),
    (
        "The statue in hall {e} is made of {v}.",
        "Is the statue in hall {e} made of {v}?",
        "bronze marble wood glass iron clay stone silver",
    ),
    (
        "Crate {e} is full of {v}.",
        "Is crate {e} full of {v}?",
        "apples pears lemons plums cherries mangoes grapes peaches",
    ),
    (
        "The musician in band {e} plays the {v}.",
        "Does the musician in band {e} play the {v}?",
        "piano violin guitar drums flute trumpet cello harp",
    ),
    (
        "Courier {e} delivers mail by {v}.",
        "Does courier {e} deliver mail by {v}?",
        "bike car train boat van scooter truck bus",
    ),
    (
        "The flag of club {e} is {v}.",
        "Is the flag of club {e} {v}?",
        "red blue green yellow white black orange purple",
    ),
]
MAX_ENTITY = 9999


def generate(n: int = 2000, seed: int = 7) -> list[dict]:
    """n canonical rows, half "yes" (label 0), deterministic in (n, seed)."""
    if n > len(TEMPLATES) * MAX_ENTITY:
        raise ValueError(f"facts generator: n must be <= {len(TEMPLATES) * MAX_ENTITY}, got {n}")
    rng = random.Random(seed)
    answers = [0] * (n // 2) + [1] * (n - n // 2)  # 0 = yes, 1 = no
    rng.shuffle(answers)
    used: set[tuple[int, int]] = set()
    rows = []
    for i, label in enumerate(answers):
        while True:
            t, e = rng.randrange(len(TEMPLATES)), rng.randint(1, MAX_ENTITY)
            if (t, e) not in used:
                used.add((t, e))
                break
        fact_t, question_t, words = TEMPLATES[t]
        values = words.split()
        value = rng.choice(values)
        asked = value if label == 0 else rng.choice([v for v in values if v != value])
        rows.append(
            canonical_row(
                f"facts-{i:05d}",
                question_t.format(e=e, v=asked),
                ["yes", "no"],
                label,
                option_labels=["Yes", "No"],
                context=fact_t.format(e=e, v=value),
                subject=fact_t.split(" {e}")[0],
            )
        )
    return rows


def load(req: DatasetRequest) -> Loaded:
    """Loader entry point: `generator: {n, seed}` from the manifest."""
    return generated(req, DEFAULTS, 2, lambda n, seed, params: generate(n, seed))
