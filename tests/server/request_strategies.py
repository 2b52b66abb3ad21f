"""Hypothesis strategies for hostile requests to sglang's `/generate`, `/v1/completions` and
`/v1/chat/completions`.

Each endpoint's schema is a table of fields, each with valid values and invalid ones (values just
outside the range, absurd values such as ids past int64, 2**40 or negative, wrong JSON types and
nested junk). A request is drawn in one of four ways: all fields valid (the server must run it),
valid but for one field (the guard must name it), every field valid or not (chaos), or junk in
place of the whole body.

Valid requests must stay cheap on a loaded 2-core CPU: every body carries its endpoint's
max-tokens field (the defaults are 128 tokens for `/generate` and the whole context for chat),
valid only from 1 to 4, valid prompts are short, and valid ``n`` is 1 or 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

INT64_MAX = 2**63 - 1
CONTEXT_OVERFLOW = 2**14  # tokens: more than any context these tests serve
TOP = ("",)  # the path of a field whose value (a dict) is merged into the body: the prompt
VALID_REGEXES = ("[0-9]{1,3}", "(yes|no)", "a*", "\\p{Lu}+")
BAD_REGEXES = ("(", "[", ")", "a{99999999}", "(a*)*b", "\\", "")
VALID_SCHEMAS = (
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "string", "maxLength": 3},
)
BAD_SCHEMAS = ({"type": "nonsense"}, {"type": "array", "items": {"$ref": "#/nowhere"}}, {"enum": []})
VALID_EBNFS = ('root ::= "a" | "b"', "root ::= [0-9]+")
BAD_EBNFS = ("root ::= ", 'root ::= root "a"', "x ::= y")


@dataclass(frozen=True)
class Case:
    """One request: an endpoint and the JSON body sent to it (a dict, or junk at the top level)."""

    path: str
    body: Any

    def dumps(self) -> str:
        return json.dumps(self.body, allow_nan=True)  # NaN / Infinity go out as such: junk too


@dataclass(frozen=True)
class Field:
    valid: st.SearchStrategy | None  # None: no valid value (a field a JSON request cannot carry)
    invalid: st.SearchStrategy
    required: bool = False


Schema = dict[tuple[str, ...], Field]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8))
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8,
)


def field(valid: st.SearchStrategy, *invalid: st.SearchStrategy, required: bool = False) -> Field:
    """A field whose invalid values are ``invalid`` or junk of any JSON type."""
    return Field(valid, st.one_of(*invalid, junk), required)


def valid_ids(vocab: int) -> st.SearchStrategy:
    return st.integers(0, vocab - 1)


def bad_ids(vocab: int) -> st.SearchStrategy:
    """Negative, ``vocab`` itself, 2**40, int64's maximum, beyond int64."""
    return st.one_of(st.integers(-(2**63), -1), st.sampled_from((vocab, vocab + 1, 2**40, INT64_MAX, 2**64)))


def id_lists(vocab: int, *, valid: bool, max_size: int = 12) -> st.SearchStrategy:
    if valid:
        return st.lists(valid_ids(vocab), min_size=1, max_size=max_size)
    one_bad = st.tuples(st.lists(valid_ids(vocab), max_size=4), bad_ids(vocab), st.lists(valid_ids(vocab), max_size=4))
    overflow = st.just(CONTEXT_OVERFLOW).map(lambda n: [1] * n)
    return st.one_of(one_bad.map(lambda t: t[0] + [t[1]] + t[2]), st.just([]), overflow)


def texts(*, valid: bool) -> st.SearchStrategy:
    """Unicode (control characters, any plane); invalid: empty, or longer than any context."""
    return st.text(min_size=1, max_size=40) if valid else st.sampled_from((0, CONTEXT_OVERFLOW)).map(lambda n: "a " * n)


def counts(valid_lo: int, valid_hi: int, *, required: bool = False) -> Field:
    """Integers in ``[valid_lo, valid_hi]``; invalid: below, above (past int64 too)."""
    return field(
        st.integers(valid_lo, valid_hi),
        st.integers(-(2**31), valid_lo - 1),
        st.integers(valid_hi + 1, max(valid_hi + 1, 2**70)),
        required=required,
    )


def reals(lo: float, hi: float) -> Field:
    return field(
        st.floats(lo, hi),
        st.floats(allow_nan=False).filter(lambda x: not lo <= x <= hi),
        st.sampled_from((float("nan"), float("inf"))),
    )


def flags() -> Field:
    return field(st.booleans())


def per_prompt(f: Field) -> Field:
    """A field a batch may give per prompt: lists of valid values (of any length) are invalid too."""
    return Field(f.valid, st.one_of(f.invalid, st.lists(f.valid, max_size=3)), f.required)


def grammar(vocab: int) -> Field:
    """At most one of regex / json_schema / ebnf (as a dict merged into the sampling fields)."""

    def one(valid: bool) -> st.SearchStrategy:
        return st.one_of(
            st.sampled_from(VALID_REGEXES if valid else BAD_REGEXES).map(lambda r: {"regex": r}),
            st.sampled_from(VALID_SCHEMAS if valid else BAD_SCHEMAS).map(json.dumps).map(lambda s: {"json_schema": s}),
            st.sampled_from(VALID_EBNFS if valid else BAD_EBNFS).map(lambda e: {"ebnf": e}),
        )

    both = st.tuples(one(True), one(True)).map(lambda t: {**t[0], **t[1]})
    return Field(st.one_of(st.just({}), one(True)), st.one_of(one(False), both, junk.map(lambda j: {"regex": j})))


def sampling_fields(vocab: int) -> dict[str, Field]:
    """The sampling fields the three endpoints share, by sglang's names."""
    return {
        "temperature": reals(0.0, 2.0),
        "top_p": reals(0.01, 1.0),
        "min_p": reals(0.0, 1.0),
        "top_k": field(st.sampled_from((-1, 1, 5, vocab, vocab + 7, 2**40)), st.integers(-(2**31), -2), st.just(0)),
        "n": field(st.integers(1, 2), st.integers(-5, 0), st.sampled_from((129, 10**6, 2**62))),
        "ignore_eos": flags(),
        "skip_special_tokens": flags(),
        "logit_bias": field(
            st.dictionaries(valid_ids(vocab).map(str), st.floats(-100, 100), max_size=3),
            st.dictionaries(bad_ids(vocab).map(str), st.floats(-100, 100), min_size=1, max_size=2),
            st.dictionaries(valid_ids(vocab).map(str), st.sampled_from((1e308, -1e308)), min_size=1),
        ),
        "stop": field(
            st.one_of(st.text(max_size=6), st.lists(st.text(max_size=6), max_size=3)),
            st.lists(st.text(max_size=2), min_size=33, max_size=40),
        ),
        "stop_token_ids": field(st.lists(valid_ids(vocab), max_size=4), id_lists(vocab, valid=False)),
        "stop_regex": field(st.sampled_from(VALID_REGEXES), st.sampled_from(BAD_REGEXES)),
        "custom_params": Field(None, junk),
        "frequency_penalty": reals(-2.0, 2.0),
        "presence_penalty": reals(-2.0, 2.0),
        "repetition_penalty": reals(0.01, 2.0),
    }


def generate_schema(vocab: int) -> Schema:
    """`/generate`: text, ids (flat or batched) or junk, sampling_params, logprob options."""
    prompt_valid = st.one_of(
        texts(valid=True).map(lambda t: {"text": t}),
        id_lists(vocab, valid=True).map(lambda i: {"input_ids": i}),
        st.lists(id_lists(vocab, valid=True, max_size=6), min_size=1, max_size=3).map(lambda rows: {"input_ids": rows}),
        st.lists(texts(valid=True), min_size=1, max_size=3).map(lambda t: {"text": t}),
    )
    prompt_invalid = st.one_of(
        texts(valid=False).map(lambda t: {"text": t}),
        id_lists(vocab, valid=False).map(lambda i: {"input_ids": i}),
        st.lists(id_lists(vocab, valid=False), min_size=1, max_size=2).map(lambda rows: {"input_ids": [[1, 2]] + rows}),
        junk.map(lambda j: {"input_ids": j}),
        junk.map(lambda j: {"text": j}),
    )
    sp = ("sampling_params",)
    schema: Schema = {
        TOP: Field(prompt_valid, prompt_invalid, required=True),
        sp + ("max_new_tokens",): counts(1, 4, required=True),
        sp + ("min_new_tokens",): counts(0, 1),
        sp + ("sampling_seed",): counts(0, INT64_MAX),
        sp + ("no_stop_trim",): flags(),
        sp + ("bogus_field",): Field(None, junk),
        sp + ("",): grammar(vocab),
        ("return_logprob",): per_prompt(flags()),
        ("top_logprobs_num",): per_prompt(counts(0, 5)),
        ("logprob_start_len",): per_prompt(counts(-1, 0)),
        sp: Field(None, st.lists(st.fixed_dictionaries({"max_new_tokens": st.integers(1, 4)}), max_size=3)),
        ("token_ids_logprob",): field(st.lists(valid_ids(vocab), max_size=3), id_lists(vocab, valid=False)),
        ("stream",): flags(),
        ("return_text_in_logprobs",): flags(),
    }
    schema.update({sp + (k,): f for k, f in sampling_fields(vocab).items()})
    schema.update(
        {
            (k,): Field(None, junk)
            for k in (
                "positional_embed_overrides",
                "input_embeds",
                "session_params",
                "lora_path",
                "custom_logit_processor",
            )
        }
    )
    return schema


def completion_schema(vocab: int) -> Schema:
    """`/v1/completions`: the prompt as text, ids, lists of either, or junk."""
    prompt = field(
        st.one_of(
            texts(valid=True),
            id_lists(vocab, valid=True),
            st.lists(id_lists(vocab, valid=True, max_size=6), min_size=1, max_size=3),
            st.lists(texts(valid=True), min_size=1, max_size=3),
        ),
        texts(valid=False),
        id_lists(vocab, valid=False),
        st.lists(id_lists(vocab, valid=False), min_size=1, max_size=2),
        required=True,
    )
    schema: Schema = {
        ("model",): field(st.just("default"), required=True),
        ("prompt",): prompt,
        ("max_tokens",): counts(1, 4, required=True),
        ("logprobs",): counts(0, 5),
        ("echo",): flags(),
        ("best_of",): counts(1, 2),
        ("min_tokens",): counts(0, 1),
        ("seed",): counts(0, 2**31),
        ("stream",): flags(),
        ("suffix",): field(st.text(max_size=5)),
        ("",): grammar(vocab),
    }
    schema.update({(k,): f for k, f in sampling_fields(vocab).items()})
    return schema


def chat_schema(vocab: int) -> Schema:
    """`/v1/chat/completions`: messages (valid roles or not, text or junk content), ids, formats."""

    def messages(valid: bool) -> st.SearchStrategy:
        role = st.sampled_from(("system", "user", "assistant") if valid else ("tool", "developer", "", "admin"))
        one = st.fixed_dictionaries({"role": role, "content": texts(valid=True) if valid else junk})
        return st.lists(one, min_size=1, max_size=3).map(lambda m: m + [{"role": "user", "content": "Hi"}])

    schema_fmt = st.sampled_from(VALID_SCHEMAS).map(
        lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
    )
    bad_fmt = st.one_of(
        st.sampled_from(BAD_SCHEMAS).map(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}),
        junk.map(lambda j: {"type": "json_schema", "schema": j}),  # the legacy spelling, dereferenced by sglang
        junk.map(lambda j: {"type": "json_schema", "schema": {"properties": {"strict": j}}}),
    )
    schema: Schema = {
        ("model",): field(st.just("default"), required=True),
        ("messages",): field(messages(True), messages(False), st.just([]), required=True),
        ("max_tokens",): counts(1, 4, required=True),
        ("max_completion_tokens",): counts(1, 4),
        ("logprobs",): flags(),
        ("top_logprobs",): counts(0, 5),
        ("min_tokens",): counts(0, 1),
        ("input_ids",): field(id_lists(vocab, valid=True), id_lists(vocab, valid=False)),
        ("response_format",): field(
            st.one_of(st.sampled_from(({"type": "text"}, {"type": "json_object"})), schema_fmt), bad_fmt
        ),
        ("stream",): flags(),
        ("continue_final_message",): flags(),
        ("seed",): counts(0, 2**31),
        ("tools",): field(
            st.just([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
            st.lists(junk, min_size=1, max_size=2),
        ),
        ("tool_choice",): field(st.sampled_from(("none", "auto", "required")), st.text(max_size=5)),
        ("chat_template_kwargs",): Field(None, junk),
        ("reasoning_effort",): Field(None, junk),
        ("",): grammar(vocab),
    }
    schema.update({(k,): f for k, f in sampling_fields(vocab).items()})
    return schema


def nest(flat: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """``{("a", "b"): 1, ("a", ""): {"c": 2}}`` -> ``{"a": {"b": 1, "c": 2}}`` (a path ending in ""
    merges its dict value into its parent; a non-dict parent value is junk and stays as drawn)."""
    body: dict[str, Any] = {}
    for path, value in sorted(flat.items(), key=lambda kv: len(kv[0])):
        parent = body
        for key in path[:-1]:
            parent = parent.setdefault(key, {})
            if not isinstance(parent, dict):
                break
        else:
            if path[-1] == "" and isinstance(value, dict):
                parent.update(value)
            elif path[-1] == "":
                parent.setdefault("junk", value)
            else:
                parent[path[-1]] = value
    return body


def bodies(schema: Schema) -> st.SearchStrategy:
    """Valid, one field invalid, chaos, or junk (weights 2:2:1:1)."""

    def draw(pick) -> st.SearchStrategy:
        fields = {p: pick(f) for p, f in schema.items()}
        required = {p: s for p, s in fields.items() if schema[p].required}
        optional = {p: s for p, s in fields.items() if not schema[p].required and s is not None}
        return st.fixed_dictionaries(required, optional=optional)

    valid = draw(lambda f: f.valid)
    one_bad = st.tuples(valid, st.sampled_from(sorted(schema))).flatmap(
        lambda vp: schema[vp[1]].invalid.map(lambda bad: {**vp[0], vp[1]: bad})
    )
    chaos = draw(lambda f: f.invalid if f.valid is None else st.one_of(f.valid, f.invalid))
    return st.one_of(valid.map(nest), valid.map(nest), one_bad.map(nest), one_bad.map(nest), chaos.map(nest), junk)


def hostile_requests(vocab: int) -> st.SearchStrategy:
    """A request to any of the three endpoints."""
    return st.one_of(
        bodies(generate_schema(vocab)).map(lambda b: Case("/generate", b)),
        bodies(completion_schema(vocab)).map(lambda b: Case("/v1/completions", b)),
        bodies(chat_schema(vocab)).map(lambda b: Case("/v1/chat/completions", b)),
    )
