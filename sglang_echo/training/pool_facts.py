"""Invented entities with facts: the passages of the pool's retrieval kind and the templated
assistant turns of its multi-turn kind.

Every entity (a town, a company, an animal species, a device) is made up from seeded draws, so a
question about it can only be answered from its passage (what retrieval-augmented answering
needs), and each question comes with the one-sentence answer the passage states (what a
templated earlier assistant turn needs). An entity kind is data: how its slots are drawn
(``SLOTS``) and, per fact, the passage sentence, a question and its answer (``FACTS``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .pool_words import (
    BUTTONS,
    COLOURS,
    COMPANY_LINES,
    COUNTRIES,
    CREATURES,
    DEVICES,
    FESTIVALS,
    FIRST_NAMES,
    FOODS,
    HABITATS,
    LAST_NAMES,
    MONTHS,
    NAME_ENDS,
    NAME_STARTS,
    PRODUCTS,
    REGIONS,
)

_MODELS = [f"{letter}{n}" for letter in "ABKMRSTVX" for n in range(2, 91)]
# Slot -> how it is drawn, in order: a list is a choice (a tuple item fills the comma-named
# slots), (low, high[, step]) an integer, "place"/"person" an invented name, "{...}" a pattern
# over the slots drawn before it.
SLOTS = {
    "town": {
        "name": "place",
        "other": "place",
        "founder": "person",
        "region": REGIONS,
        "country": COUNTRIES,
        "year": (1120, 1890),
        "pop": (800, 60000, 10),
        "days": (2, 9),
        "km": (6, 95),
        "product": PRODUCTS,
        "festival": FESTIVALS,
        "month": MONTHS,
    },
    "company": {
        "suffix,what,unit": COMPANY_LINES,
        "place": "place",
        "name": "{place} {suffix}",
        "city": "place",
        "country": COUNTRIES,
        "founder": "person",
        "year": (1950, 2022),
        "staff": (12, 9000),
        "sold": (500, 400000, 100),
        "model": _MODELS,
        "price": (30, 3000, 5),
    },
    "species": {
        "place": "place",
        "creature": CREATURES,
        "name": "{place} {creature}",
        "habitat": HABITATS,
        "country": COUNTRIES,
        "food": FOODS,
        "cm": (2, 60),
        "young": (1, 12),
        "life": (2, 25),
        "month": MONTHS,
    },
    "device": {
        "place": "place",
        "model": _MODELS,
        "name": "{place} {model}",
        "device": DEVICES,
        "button": BUTTONS,
        "secs": (3, 20),
        "colour": COLOURS,
        "blink": COLOURS,
        "years": (1, 5),
        "hours": (2, 40),
    },
}
# Per kind, (passage sentence, question or None, answer); the first sentence opens the passage,
# the others follow in a seeded order.
FACTS = {
    "town": [
        ("{name} is a small town in {region} of {country}.", None, ""),
        (
            "It was founded in {year} by {founder}.",
            "When was {name} founded, and by whom?",
            "{name} was founded in {year} by {founder}.",
        ),
        (
            "About {pop:,} people live there today.",
            "How many people live in {name}?",
            "About {pop:,} people live in {name}.",
        ),
        ("The town is known for its {product}.", "What is {name} known for?", "{name} is known for its {product}."),
        (
            "Every {month} it holds a {festival} festival that lasts {days} days.",
            "When is the festival in {name}, and how long does it last?",
            "The {festival} festival is held every {month} and lasts {days} days.",
        ),
        (
            "The nearest town, {other}, is {km} km away.",
            "How far is {name} from {other}?",
            "{name} is {km} km from {other}.",
        ),
    ],
    "company": [
        ("{name} is a company based in {city}, {country}.", None, ""),
        (
            "It was started in {year} by {founder}.",
            "Who started {name}, and when?",
            "{founder} started {name} in {year}.",
        ),
        ("It makes {what}.", "What does {name} make?", "{name} makes {what}."),
        ("It employs {staff:,} people.", "How many people work at {name}?", "{name} employs {staff:,} people."),
        (
            "Its best-selling {unit} is the {model}, which costs {price} dollars.",
            "How much does the {model} cost?",
            "The {model} costs {price} dollars.",
        ),
        (
            "Last year it sold {sold:,} of its {what}.",
            "How many products did {name} sell last year?",
            "{name} sold {sold:,} of its {what} last year.",
        ),
    ],
    "species": [
        (
            "The {name} is a small animal found in the {habitat} of {country}.",
            "Where does the {name} live?",
            "The {name} lives in the {habitat} of {country}.",
        ),
        ("Adults grow to about {cm} cm long.", "How big does the {name} get?", "Adults grow to about {cm} cm long."),
        ("It feeds mainly on {food}.", "What does the {name} eat?", "It feeds mainly on {food}."),
        (
            "A female raises up to {young} young each year, born in {month}.",
            "How many young does the {name} raise, and when?",
            "A female raises up to {young} young a year, born in {month}.",
        ),
        (
            "In the wild it lives for about {life} years.",
            "How long does the {name} live?",
            "In the wild it lives for about {life} years.",
        ),
    ],
    "device": [
        ("The {name} is a {device}.", None, ""),
        (
            "To reset it, hold the {button} button for {secs} seconds until the light turns {colour}.",
            "How do I reset the {name}?",
            "Hold the {button} button for {secs} seconds until the light turns {colour}.",
        ),
        (
            "It comes with a {years}-year warranty.",
            "How long is the warranty on the {name}?",
            "The {name} has a {years}-year warranty.",
        ),
        (
            "A full charge lasts about {hours} hours.",
            "How long does a full charge of the {name} last?",
            "A full charge lasts about {hours} hours.",
        ),
        (
            "If the light blinks {blink}, the {device} needs a software update.",
            "What does it mean when the light of the {name} blinks {blink}?",
            "A {blink} blinking light means that the {device} needs a software update.",
        ),
    ],
}
KINDS = tuple(SLOTS)


@dataclass(frozen=True)
class Facts:
    kind: str  # one of KINDS
    name: str  # the entity's name: the dev split's group
    passage: str
    qa: tuple[tuple[str, str], ...]  # (question, one-sentence answer from the passage)


def place_name(rng: random.Random) -> str:
    return rng.choice(NAME_STARTS) + rng.choice(NAME_ENDS)


def person_name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def _draw_slots(rng: random.Random, spec: dict) -> dict:
    slots: dict = {}
    for key, how in spec.items():
        if isinstance(how, list):
            value = rng.choice(how)
            slots.update(zip(key.split(","), value) if "," in key else [(key, value)])
        elif isinstance(how, tuple):
            slots[key] = rng.randrange(how[0], how[1] + 1, *how[2:])
        elif how in ("place", "person"):
            slots[key] = place_name(rng) if how == "place" else person_name(rng)
        else:
            slots[key] = how.format(**slots)
    return slots


def invent(rng: random.Random, kind: str | None = None) -> Facts:
    """An invented entity of ``kind`` (any kind if None)."""
    kind = kind or rng.choice(KINDS)
    slots = _draw_slots(rng, SLOTS[kind])
    first, *rest = [sentence.format(**slots) for sentence, _, _ in FACTS[kind]]
    rng.shuffle(rest)
    qa = tuple((q.format(**slots), a.format(**slots)) for _, q, a in FACTS[kind] if q is not None)
    return Facts(kind, slots["name"], " ".join([first, *rest]), qa)
