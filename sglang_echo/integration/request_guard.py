"""Request guard: a request the served model cannot run is answered with HTTP 400 at the door.

sglang checks lengths, sampling ranges, grammars and ``logit_bias`` keys in the tokenizer manager,
but lets some values through to the scheduler, where one request can kill the whole server: a
token id outside the vocabulary (``IndexError`` in the embedding on a CPU, a device-side assert on
a GPU), a prompt that tokenizes to nothing, ``top_logprobs_num`` above the vocabulary (``topk``),
a ``stop_token_ids`` entry outside it (the ``min_new_tokens`` penalizer scatters it), a ``top_k``
past int32 (the sampler's tensor), a ``logit_bias`` of 1e308 (infinite logits, then sampling
raises), ``positional_embed_overrides`` sent as JSON; and ``session_params`` with an unknown key,
``n: null`` or a ``stop_regex`` Python cannot compile ended in a 500. Every endpoint
(``/generate``, ``/encode``, OpenAI completions and chat, the Engine API) funnels each request,
after tokenization, chat templating and batch splitting, through
``TokenizerManager._validate_one_request(obj, input_ids)``, sglang's own validation seam; a BEFORE
hook there runs :func:`check_request` against the served model's :class:`ModelLimits`
(``model_config``, which the tokenizer manager holds with or without ``--skip-tokenizer-init``).
Its :class:`RequestRejected` is a ``ValueError``, which every handler already turns into a 400
whose message names the field.

Some values must be checked earlier: sglang multiplies the prompts by ``n`` while it normalizes
the request, before any per-request validation, so ``n = 10**9`` would exhaust the tokenizer
process's memory, and it indexes per-prompt lists (``top_logprobs_num``, ``lora_path``,
``positional_embed_overrides``, ...) per prompt without checking their length (a 500). A BEFORE
hook on ``GenerateReqInput.normalize_batch_and_arguments`` checks them (:func:`before_normalize`).

And some shapes must be checked before FastAPI validates the body: the chat request model's own
validators assume a JSON object, and an object ``response_format``, so a body of ``[]`` or a
``response_format`` of ``[]`` to ``/v1/chat/completions`` ended in a 500. An AROUND hook on the
JSON parse of sglang's HTTP server (``ORJSONRequest.json``) refuses non-object bodies on the
``/v1/`` routes (all of which take objects) and the fields of :data:`OBJECT_FIELDS` as a JSON
error, which each route answers in its own error format (400; the System One route's documented
422) (:func:`body_shape_error`). It is registered only in the process sglang was launched in, the
one that serves HTTP (``compat.serves_http``), so that spawned scheduler processes need not import
the HTTP server.

A grammar can compile and still admit no output at all (``root ::= root "a"`` has no base case):
sglang then aborts the request with a 500 at its first token. An AROUND hook on the xgrammar
backend's ``_from_context`` (where each compiled grammar becomes the request's matcher, once per
grammar: sglang caches them) fills the fresh matcher's first-token mask and, when it is empty and
the grammar cannot end there, returns sglang's own ``InvalidGrammarObject``, which sglang answers
with the 400 it gives grammars that do not compile (:func:`refuse_empty_grammar`).

Checks are whole-list numpy operations (one conversion and two comparisons per list); only the
error path looks for the first offending entry.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from sglang_echo.integration.compat import serves_http

VALIDATE_ONE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
NORMALIZE = "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments"
PARSE_JSON = "sglang.srt.entrypoints.http_server.ORJSONRequest.json"
GRAMMAR_MATCHER = "sglang.srt.constrained.xgrammar_backend.XGrammarGrammarBackend._from_context"
OBJECT_BODY_ROUTES = "/v1/"  # path prefix of the routes whose JSON body must be an object
# Fields sglang's request models dereference as objects before validating them (an array or a
# string there ended in a 500), by route; each must be an object where present and non-empty.
OBJECT_FIELDS = {
    "/v1/chat/completions": (
        "response_format",
        "response_format.schema",
        "response_format.schema.properties",
        "response_format.schema.properties.strict",
    )
}
JSON_TYPES = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
}

# GenerateReqInput fields a batch gives per prompt, which sglang indexes per prompt unchecked.
PER_PROMPT_FIELDS = (
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_sampling_mask",
    "sampling_logprobs_mode",
    "custom_logit_processor",
    "lora_path",
    "positional_embed_overrides",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "bootstrap_pair_key",
    "decode_tp_size",
)
# Samples per prompt (``n``): OpenAI's own bound. sglang has none and expands the request by it.
MAX_PARALLEL_SAMPLES = 128
INT32_MAX = 2**31 - 1


class RequestRejected(ValueError):
    """A request the served model cannot run; sglang's handlers answer ``ValueError`` with 400."""


@dataclass(frozen=True)
class ModelLimits:
    """What the served model accepts: token ids in ``[0, vocab_size)``, prompts shorter than
    ``context_len``, input embeddings ``hidden_size`` wide."""

    vocab_size: int
    context_len: int
    hidden_size: int

    @classmethod
    def of(cls, manager: Any) -> ModelLimits:
        config = manager.model_config
        return cls(int(config.vocab_size), int(manager.context_len), int(config.hidden_size))


def json_type(value: Any) -> str:
    """How a JSON reader names ``value``'s type ("an array", "null", ...)."""
    return JSON_TYPES.get(type(value), type(value).__name__)


def check_token_ids(field: str, ids: Any, vocab_size: int) -> None:
    """``ids`` is a flat list of integers in ``[0, vocab_size)`` (empty is allowed)."""
    _check_indices(field, ids, vocab_size, "the vocabulary", "token ids")


def _check_indices(field: str, values: Any, size: int, within: str, what: str) -> None:
    if values is None or (isinstance(values, (list, tuple)) and not values):
        return
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise RequestRejected(f"{field} must be a flat list of integer {what} (int64)")
    outside = (arr < 0) | (arr >= size)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise RequestRejected(f"{field}[{i}] = {int(arr[i])} is outside {within} [0, {size})")


def _check_int_range(field: str, value: Any, lo: int, hi: int | None = None, *, nullable: bool = True) -> None:
    """``value`` is an integer in ``[lo, hi]`` (``hi`` None: no upper bound), or None if ``nullable``."""
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise RequestRejected(f"{field} must be an integer, got {json_type(value)}")
    if value < lo or (hi is not None and value > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f"at least {lo}"
        raise RequestRejected(f"{field} = {value} must be {bound}")


def check_parallel_samples(obj: Any) -> None:
    """``n`` of every ``sampling_params`` of a (possibly batched) request, where given, is an
    integer in ``[1, MAX_PARALLEL_SAMPLES]`` (sglang compares it with ``>``: ``null`` was a 500);
    runs before sglang expands the request by it."""
    params = obj.sampling_params
    rows = params if isinstance(params, list) else [params]
    for r, row in enumerate(rows):
        if isinstance(row, Mapping) and "n" in row:
            field = "sampling_params.n" if rows is not params else f"sampling_params[{r}].n"
            _check_int_range(field, row["n"], 1, MAX_PARALLEL_SAMPLES, nullable=False)


def check_prompt(obj: Any, input_ids: Any, limits: ModelLimits) -> None:
    """The prompt the scheduler will embed: at least one token, every id inside the vocabulary.

    ``input_ids`` are the final ids (the tokenizer's for text prompts). A multimodal processor
    puts its own placeholder ids in them, so for such requests only the caller's ids are checked.
    """
    embeds = getattr(obj, "input_embeds", None)
    if embeds is not None:
        check_input_embeds(embeds, limits)
        return
    given = getattr(obj, "input_ids", None)
    if obj.contains_mm_input():
        check_token_ids("input_ids", given, limits.vocab_size)
        return
    field = "input_ids" if given is not None else "input_ids (tokenized text)"
    if input_ids is None or len(input_ids) == 0:
        raise RequestRejected(f"the prompt is empty: {field} has no tokens; a request needs at least one")
    check_token_ids(field, input_ids, limits.vocab_size)


def check_input_embeds(embeds: Any, limits: ModelLimits) -> None:
    """``input_embeds`` is a non-empty ``[tokens, hidden_size]`` array of finite numbers that fits
    the context."""
    try:
        arr = np.asarray(embeds, dtype=np.float32)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] != limits.hidden_size:
        shape = "ragged or not numeric" if arr is None else f"shape {list(arr.shape)}"
        raise RequestRejected(f"input_embeds must be [tokens >= 1, {limits.hidden_size}] numbers, got {shape}")
    if not np.isfinite(arr).all():
        raise RequestRejected("input_embeds must be finite numbers")
    if arr.shape[0] >= limits.context_len:
        raise RequestRejected(
            f"input_embeds has {arr.shape[0]} tokens, the model's context length is {limits.context_len}"
        )


def check_sampling(params: Any, limits: ModelLimits) -> None:
    """The sampling fields sglang passes on unchecked: ``stop_token_ids`` inside the vocabulary,
    ``top_k`` (sglang checks ``>= 1`` or -1) within the int32 the sampler stores it in,
    ``stop_regex`` (:func:`check_stop_regex`) and ``logit_bias`` values (:func:`check_logit_bias`)."""
    if not isinstance(params, Mapping):
        return
    check_token_ids("sampling_params.stop_token_ids", params.get("stop_token_ids"), limits.vocab_size)
    top_k = params.get("top_k")
    if top_k != -1:
        _check_int_range("sampling_params.top_k (-1: all)", top_k, 1, INT32_MAX)
    check_stop_regex(params.get("stop_regex"))
    check_logit_bias(params.get("logit_bias"))


def check_logit_bias(bias: Any) -> None:
    """Each ``logit_bias`` value is a number in OpenAI's ``[-100, 100]`` (sglang checks the keys
    only: a bias of 1e308 made the logits infinite and sampling raised in the scheduler)."""
    if not isinstance(bias, Mapping):
        return
    for key, value in bias.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise RequestRejected(f"sampling_params.logit_bias[{key!r}] = {value!r} must be a number in [-100, 100]")


def check_stop_regex(patterns: Any) -> None:
    """Each ``stop_regex`` compiles with Python's ``re``, which sglang matches them with (its own
    length estimate parses them first and raised ``re.error``: a 500)."""
    many = isinstance(patterns, list)
    for i, pattern in enumerate(patterns if many else [patterns]):
        if not isinstance(pattern, str):
            continue  # None, or a type sglang's schemas refuse
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as e:
            field = f"sampling_params.stop_regex[{i}]" if many else "sampling_params.stop_regex"
            raise RequestRejected(f"{field} = {pattern!r} is not a valid regular expression: {e}") from None


def check_logprobs(obj: Any, limits: ModelLimits) -> None:
    """``top_logprobs_num`` (OpenAI: ``logprobs`` / ``top_logprobs``) in ``[0, vocab_size]`` and
    ``logprob_start_len >= -1`` (-1: output tokens only); sglang bounds the rest."""
    _check_int_range(
        "top_logprobs_num (OpenAI: logprobs / top_logprobs)",
        getattr(obj, "top_logprobs_num", None),
        0,
        limits.vocab_size,
    )
    _check_int_range("logprob_start_len", getattr(obj, "logprob_start_len", None), -1)


def check_override_types(overrides: Any) -> None:
    """``positional_embed_overrides`` is an Engine-API object (tensors), or a non-empty list of
    them (or None) for a batch: JSON cannot carry one, and sglang indexes a list per prompt."""
    from sglang.srt.managers.embed_types import PositionalEmbeds

    items = overrides if isinstance(overrides, list) and overrides else [overrides]
    for item in items:
        if item is not None and not isinstance(item, PositionalEmbeds):
            raise RequestRejected(
                "positional_embed_overrides must be a PositionalEmbeds object (Engine API); "
                f"a request cannot carry it as {json_type(overrides)}"
            )


def check_overrides(obj: Any, input_ids: Any) -> None:
    """One request's ``positional_embed_overrides``: of the right type, at positions inside the prompt."""
    overrides = getattr(obj, "positional_embed_overrides", None)
    if overrides is None:
        return
    check_override_types(overrides)
    if isinstance(overrides, list):
        raise RequestRejected("positional_embed_overrides of one prompt must be one PositionalEmbeds, got a list")
    prompt_len = 0 if input_ids is None else len(input_ids)
    _check_indices("positional_embed_overrides.positions", overrides.positions, prompt_len, "the prompt", "positions")


def check_session_params(params: Any) -> None:
    """``session_params`` holds only ``SessionParams`` fields, each of its declared type (sglang
    builds the struct with ``SessionParams(**params)``, which raises on an unknown key and checks
    no type)."""
    if params is None:
        return
    from sglang.srt.managers.io_struct import SessionParams

    if not isinstance(params, Mapping):
        raise RequestRejected(f"session_params must be an object, got {type(params).__name__}")
    known = SessionParams.__struct_fields__
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise RequestRejected(f"session_params has unknown field(s) {unknown}; it takes {list(known)}")
    hints = typing.get_type_hints(SessionParams)
    for name, value in params.items():
        try:
            msgspec.convert(value, hints[name], strict=True)
        except msgspec.ValidationError as e:
            raise RequestRejected(f"session_params.{name}: {e}") from None


def check_request(obj: Any, input_ids: Any, limits: ModelLimits) -> None:
    """Everything this guard checks about one (already split) request; raises
    :class:`RequestRejected` naming the first bad field."""
    check_prompt(obj, input_ids, limits)
    check_sampling(getattr(obj, "sampling_params", None), limits)
    check_logprobs(obj, limits)
    check_overrides(obj, input_ids)
    check_session_params(getattr(obj, "session_params", None))


def before_validate_one_request(manager: Any, obj: Any, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on ``TokenizerManager._validate_one_request``: returns None (arguments unchanged)."""
    check_request(obj, input_ids, ModelLimits.of(manager))


def prompt_count(obj: Any) -> int | None:
    """How many prompts sglang will find in a request (None: one, not a batch), as it decides it:
    a list of texts, of id lists or of embedding matrices is a batch. None also where the shape is
    too broken to tell (sglang refuses those itself)."""
    try:
        if obj.text is not None:
            return len(obj.text) if isinstance(obj.text, list) else None
        if obj.input_ids is not None:
            return len(obj.input_ids) if isinstance(obj.input_ids[0], list) else None
        if obj.input_embeds is not None:
            return len(obj.input_embeds) if isinstance(obj.input_embeds[0][0], list) else None
    except (TypeError, IndexError, KeyError):
        pass
    return None


def check_per_prompt_lists(obj: Any) -> None:
    """A per-prompt field given as a list has one entry per prompt, and is not a list at all for a
    single prompt (sglang indexes such lists per prompt unchecked, also where ``n > 1`` turns one
    prompt into a batch: ``top_logprobs_num: [1]`` for two prompts, ``sampling_params: [{}]`` for
    one, ``lora_path: []`` with ``n: 2`` were 500s)."""
    count = prompt_count(obj)
    lists = {name: getattr(obj, name, None) for name in PER_PROMPT_FIELDS}
    nested = obj.token_ids_logprob
    if isinstance(nested, list) and nested and isinstance(nested[0], list):  # else: one list for all prompts
        lists["token_ids_logprob"] = nested
    for name, value in lists.items():
        if not isinstance(value, list):
            continue
        if count is None:
            raise RequestRejected(f"{name} must not be a list for a single prompt, got an array")
        if len(value) != count:
            raise RequestRejected(f"{name} has {len(value)} entries, not one per prompt of a batch of {count}")


def before_normalize(obj: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on ``GenerateReqInput.normalize_batch_and_arguments``: what must hold before
    sglang expands the request by ``n`` and splits it per prompt."""
    check_parallel_samples(obj)
    check_per_prompt_lists(obj)
    if obj.positional_embed_overrides is not None:
        check_override_types(obj.positional_embed_overrides)


def body_shape_error(path: str, body: Any) -> str | None:
    """Why a parsed JSON body cannot reach ``path``'s request model, or None."""
    if not path.startswith(OBJECT_BODY_ROUTES):
        return None
    if not isinstance(body, dict):
        return f"the request body must be a JSON object, got {json_type(body)}"
    for dotted in OBJECT_FIELDS.get(path, ()):
        value: Any = body
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value and not isinstance(value, dict):
            return f"{dotted} must be a JSON object, got {json_type(value)}"
    return None


async def object_json_body(original: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``ORJSONRequest.json``: a body :func:`body_shape_error` refuses raises the
    JSON error FastAPI turns into the route's request-validation answer."""
    body = await original(request, *args, **kwargs)
    error = body_shape_error(request.url.path, body)
    if error is not None:
        raise json.JSONDecodeError(error, "", 0)
    return body


def admits_nothing(grammar: Any, vocab_size: int) -> bool:
    """A fresh grammar object whose first step allows no token and which cannot end there."""
    mask = grammar.allocate_vocab_mask(vocab_size, 1, "cpu")
    grammar.fill_vocab_mask(mask, 0)
    return not bool(mask.any()) and not grammar.is_terminated()


def refuse_empty_grammar(original: Any, backend: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``XGrammarGrammarBackend._from_context``: an empty-language grammar becomes
    an ``InvalidGrammarObject`` (a 400), not a request aborted with a 500."""
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject

    grammar = original(backend, *args, **kwargs)
    if not isinstance(grammar, InvalidGrammarObject) and admits_nothing(grammar, backend.vocab_size):
        return InvalidGrammarObject("the grammar admits no output (no token can start it and it cannot be empty)")
    return grammar


def register(registry: Any, hook_type: Any) -> None:
    """Register the hooks (``registry``: sglang's ``HookRegistry``; ``hook_type``: its ``HookType``)."""
    registry.register(VALIDATE_ONE, before_validate_one_request, hook_type.BEFORE)
    registry.register(NORMALIZE, before_normalize, hook_type.BEFORE)
    registry.register(GRAMMAR_MATCHER, refuse_empty_grammar, hook_type.AROUND)
    if serves_http():
        registry.register(PARSE_JSON, object_json_body, hook_type.AROUND)
