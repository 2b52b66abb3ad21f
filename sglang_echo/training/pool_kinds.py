"""The prompt pool's kinds: one seeded generator per kind, each drawing one prompt at a time.

A :class:`Draw` carries the prompt and its *group*, the piece of content it is about (a subject,
a passage, a function, an invented entity...). The dev split is decided per group, not per prompt
(``prompt_pool.is_dev``), so a dev prompt's content never reaches training through a sibling
prompt that differs only in its template or audience.

Kinds (``KINDS``):

* ``chat``: templated requests (explain, list, compare, write, plan, advise...);
* ``multi-turn``: two or three user turns. The earlier assistant turns are templated, with
  content that is right (an invented entity's facts, a parallel translation, a function's
  documentation, exact arithmetic, name suggestions); the target answers the last turn only.
  This is what one request per prompt can do (the self-distillation backends answer a prompt
  once, resumably, shard by shard); the loss falls on the target's last answer either way;
* ``code-chat``: "write a function that ..." requests;
* ``code``: raw completions shaped like HumanEval (a signature and a docstring, no template);
* ``math``: arithmetic word problems, half with a step-by-step instruction;
* ``summarize``: "summarize this passage" over standard-library docstrings;
* ``translation``: short texts between 16 languages (a six-language parallel set, English
  sentences over the word lists, documentation prose);
* ``qa``: factual and explanatory questions (countries, animals, inventions, subjects, "why"
  and "how" questions, standard-library functions);
* ``rag``: a passage (or several numbered documents) and a question answerable from it: facts
  about invented entities, or a function's documentation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from sglang_echo.models.prompts import Message

from . import pool_words as W
from .pool_facts import invent, person_name
from .pool_sentences import EN_SENTENCES, LANGUAGES, PARALLEL, TARGET_LANGUAGES
from .pool_stdlib import StdlibText
from .pool_vocab import (
    ACTIVITIES,
    AUDIENCES,
    CHAT_TEMPLATES,
    CODE_TASKS,
    CODE_TEMPLATES,
    FORMATS,
    MATH_TEMPLATES,
    PAIRS,
    PERSONS,
    SUBJECTS,
    TASK_TEMPLATES,
    THINGS,
)

STEP_BY_STEP = " Think step by step, then give the final answer after '####'."
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


@dataclass(frozen=True)
class Draw:
    """One prompt: raw text (``prompt``) or a conversation ending with a user turn (``messages``)."""

    group: str  # the content it is about: the dev split is decided on it
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None


def _ask(group: str, text: str) -> Draw:
    return Draw(group, messages=({"role": "user", "content": text},))


def _dialogue(group: str, *turns: str) -> Draw:
    """User and assistant turns alternating, user first and last."""
    assert len(turns) % 2 == 1
    return Draw(
        group, messages=tuple({"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns))
    )


def _chat(rng: random.Random, text: StdlibText) -> Draw:
    if rng.random() < 0.55:
        s, t = rng.sample(SUBJECTS, 2)
        return _ask(s, rng.choice(CHAT_TEMPLATES).format(s=s, t=t, a=rng.choice(AUDIENCES), f=rng.choice(FORMATS)))
    template = rng.choice(TASK_TEMPLATES)
    (x, y), slots = rng.choice(PAIRS), {"act": rng.choice(ACTIVITIES), "thing": rng.choice(THINGS)}
    slots.update(p=rng.choice(PERSONS), s=rng.choice(SUBJECTS), x=x, y=y)
    group = next(slots[k] for k in ("act", "thing", "x", "s", "p") if "{" + k + "}" in template)
    return _ask(group, template.format(**slots, n=rng.randint(2, 7), f=rng.choice(FORMATS)))


def _math(rng: random.Random, text: StdlibText) -> Draw:
    x, y, z = rng.randint(2, 90), rng.randint(2, 12), rng.randint(20, 400)
    q = rng.choice(MATH_TEMPLATES).format(x=x, y=y, z=z, p=rng.choice(W.FIRST_NAMES))
    return _ask(q, q + (STEP_BY_STEP if rng.random() < 0.5 else ""))  # numbers vary: the group is the problem


def _code_chat(rng: random.Random, text: StdlibText) -> Draw:
    task = rng.choice(CODE_TASKS) if rng.random() < 0.4 or not text.descriptions else rng.choice(text.descriptions)
    return _ask(task, rng.choice(CODE_TEMPLATES).format(c=task))


def _code(rng: random.Random, text: StdlibText) -> Draw | None:
    if not text.stubs:
        return None
    stub = rng.choice(text.stubs)
    return Draw(stub, prompt=stub)


def _summarize(rng: random.Random, text: StdlibText) -> Draw | None:
    if not text.passages:
        return None
    passage = rng.choice(text.passages)
    how = rng.choice(("in two sentences", "in one paragraph", "in three bullet points", "for a beginner", "briefly"))
    return _ask(passage, f"Summarize the following passage {how}.\n\n{passage}")


def _english(rng: random.Random) -> str:
    """One to three English sentences over the word lists."""
    out = []
    for template in rng.sample(EN_SENTENCES, rng.randint(1, 3)):
        p = rng.choice(PERSONS)
        s, t = rng.sample(SUBJECTS, 2)
        out.append(
            template.format(
                P=p[0].upper() + p[1:],
                p=p,
                s=s,
                t=t,
                act=rng.choice(ACTIVITIES),
                thing=rng.choice(THINGS),
                day=rng.choice(DAYS),
                n=rng.randint(2, 9),
            )
        )
    return " ".join(out)


def _translation(rng: random.Random, text: StdlibText) -> Draw:
    r = rng.random()
    if r < 0.45:  # the parallel set, from any of its languages
        rows = rng.sample(range(len(PARALLEL)), rng.randint(1, 3))
        src = rng.randrange(len(LANGUAGES))
        source, group, src_name = " ".join(PARALLEL[i][src] for i in rows), f"parallel {sorted(rows)}", LANGUAGES[src]
    elif r < 0.85 or not text.passages:
        source = group = _english(rng)
        src_name = "English"
    else:  # documentation prose: the passage is the group, as in summarize
        group = rng.choice(text.passages)
        source, src_name = group.split("\n\n")[0], "English"
    tgt = rng.choice([lang for lang in TARGET_LANGUAGES if lang != src_name])
    return _ask(group, rng.choice(W.TRANSLATE_REQUESTS).format(src=src_name, tgt=tgt, text=source))


def _qa(rng: random.Random, text: StdlibText) -> Draw:
    r = rng.random()
    if r < 0.25:
        group = question = rng.choice(W.WHY_QUESTIONS)
    elif r < 0.4:
        group = rng.choice(W.COUNTRIES)
        question = rng.choice(W.COUNTRY_QUESTIONS).format(c=group)
    elif r < 0.55:
        group = rng.choice(W.ANIMALS)
        question = rng.choice(W.ANIMAL_QUESTIONS).format(x=group)
    elif r < 0.65:
        group = rng.choice(W.INVENTIONS)
        question = rng.choice(W.INVENTION_QUESTIONS).format(x=group)
    elif r < 0.85 or not text.documented:
        group = rng.choice(SUBJECTS)
        question = rng.choice(W.SUBJECT_QUESTIONS).format(s=group)
    else:
        group = rng.choice(text.documented).name
        question = rng.choice(W.PYTHON_QUESTIONS).format(f=group)
    return _ask(group, question + rng.choice(W.QA_STYLES).format(a=rng.choice(AUDIENCES)))


def _rag(rng: random.Random, text: StdlibText) -> Draw:
    r = rng.random()
    if r < 0.2 and text.documented:  # a function's documentation
        d = rng.choice(text.documented)
        q = rng.choice(W.DOC_QUESTIONS).format(f=d.name)
        return _ask(d.name, rng.choice(W.DOC_INSTRUCTIONS).format(f=d.name, doc=d.doc, q=q))
    facts = invent(rng)
    q = rng.choice(facts.qa)[0]
    if r < 0.45:  # several numbered documents, one of them holding the answer
        docs = [facts.passage, *(invent(rng).passage for _ in range(rng.randint(1, 3)))]
        rng.shuffle(docs)
        numbered = "\n\n".join(f"Document {i + 1}: {d}" for i, d in enumerate(docs))
        return _ask(facts.name, rng.choice(W.RAG_MULTI_INSTRUCTIONS).format(docs=numbered, q=q))
    return _ask(facts.name, rng.choice(W.RAG_INSTRUCTIONS).format(doc=facts.passage, q=q, ql=q[0].lower() + q[1:]))


# --- multi-turn: every earlier assistant turn is templated, and right
def _invented_dialogue(rng: random.Random, three: bool) -> Draw:
    facts = invent(rng)
    opener = rng.choice(W.INVENT_OPENERS[facts.kind])
    if not three:
        return _dialogue(facts.name, opener, facts.passage, rng.choice(W.INVENT_FOLLOWUPS))
    question, answer = rng.choice(facts.qa)
    return _dialogue(facts.name, opener, facts.passage, question, answer, rng.choice(W.INVENT_LAST_TURNS))


def _translation_dialogue(rng: random.Random, three: bool) -> Draw:
    row = rng.randrange(len(PARALLEL))
    a, b = rng.sample(range(1, len(LANGUAGES)), 2)  # two target languages, English the source
    first = rng.choice(W.TRANSLATE_REQUESTS[:4]).format(src="English", tgt=LANGUAGES[a], text=PARALLEL[row][0])
    group = f"parallel {[row]}"
    if three:
        second = W.TRANSLATE_FOLLOWUPS[0].format(tgt=LANGUAGES[b])
        return _dialogue(group, first, PARALLEL[row][a], second, PARALLEL[row][b], rng.choice(W.TRANSLATE_LAST_TURNS))
    follow = rng.choice(W.TRANSLATE_FOLLOWUPS).format(tgt=LANGUAGES[b], lang=LANGUAGES[a])
    return _dialogue(group, first, PARALLEL[row][a], follow)


def _function_dialogue(rng: random.Random, three: bool, text: StdlibText) -> Draw:
    d = rng.choice(text.documented)
    first = rng.choice(W.FUNCTION_OPENERS).format(f=d.name)
    answer = "According to its documentation: " + d.doc.split("\n\n")[0]
    if not three:
        return _dialogue(d.name, first, answer, rng.choice(W.FUNCTION_FOLLOWUPS))
    params = ", ".join(f"`{p}`" for p in d.params) if d.params else "no arguments"
    return _dialogue(
        d.name, first, answer, "Which arguments does it take?", f"It takes {params}.", rng.choice(W.FUNCTION_LAST_TURNS)
    )


def _math_dialogue(rng: random.Random, three: bool) -> Draw:
    who = person_name(rng).split()[0]
    step = STEP_BY_STEP if rng.random() < 0.3 else ""
    if rng.random() < 0.5:  # shopping: total, change, then a what-if
        n, price = rng.randint(2, 12), rng.randint(2, 40)
        item, total = rng.choice(("notebooks", "tickets", "plants", "mugs", "scarves")), n * price
        paid = (total // 50 + 1) * 50
        turns = [
            f"{who} buys {n} {item} at {price} dollars each. How much does {who} pay?",
            f"{who} pays {n} × {price} = {total} dollars.",
            f"{who} pays with {paid} dollars. How much change is that?",
            f"The change is {paid} − {total} = {paid - total} dollars.",
            f"How many {item} could {who} buy with {paid} dollars at that price?{step}",
        ]
    else:  # a trip: distance, then time at another speed, then the difference
        v, h = rng.choice((40, 50, 60, 80, 90, 100, 120)), rng.randint(2, 6)
        d = v * h
        t2 = rng.choice([t for t in range(2, 10) if d % t == 0 and t != h])  # every speed has such divisors
        v2 = d // t2
        turns = [
            f"A car drives at {v} km per hour for {h} hours. How far does it go?",
            f"It goes {v} × {h} = {d} km.",
            f"How long would the same trip take at {v2} km per hour?",
            f"It would take {d} ÷ {v2} = {t2} hours.",
            f"How many minutes is the difference between the two trips?{step}",
        ]
    if not three:
        turns = turns[:3]
        turns[2] += step
    return _dialogue(turns[0], *turns)


def _naming_dialogue(rng: random.Random) -> Draw:
    shop = rng.choice(W.SHOPS)
    words = rng.sample(W.NAME_WORDS, 6)
    names = [f"The {a} {b}" for a, b in zip(words[:3], words[3:])]
    answer = f"Here are three ideas: {names[0]}, {names[1]} and {names[2]}."
    return _dialogue(
        shop,
        rng.choice(W.NAME_REQUESTS).format(shop=shop),
        answer,
        rng.choice(W.NAME_FOLLOWUPS).format(name=rng.choice(names)),
    )


def _multi_turn(rng: random.Random, text: StdlibText) -> Draw:
    r, three = rng.random(), rng.random() < 0.5
    if r < 0.3:
        return _invented_dialogue(rng, three)
    if r < 0.5:
        return _translation_dialogue(rng, three)
    if r < 0.7 and text.documented:
        return _function_dialogue(rng, three, text)
    if r < 0.9:
        return _math_dialogue(rng, three)
    return _naming_dialogue(rng)


KINDS: dict[str, Callable[[random.Random, StdlibText], Draw | None]] = {
    "chat": _chat,
    "multi-turn": _multi_turn,
    "code-chat": _code_chat,
    "code": _code,
    "math": _math,
    "summarize": _summarize,
    "translation": _translation,
    "qa": _qa,
    "rag": _rag,
}
