"""The request guard's checks without a server (``sglang_echo/integration/request_guard.py``); the
real servers: ``test_hostile_requests.py``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_echo.integration import request_guard as guard
from sglang_echo.integration.request_guard import ModelLimits, RequestRejected

VOCAB = 49152
LIMITS = ModelLimits(vocab_size=VOCAB, context_len=64, hidden_size=8)


def req(**fields):
    from sglang.srt.managers.io_struct import GenerateReqInput

    fields.setdefault("sampling_params", {"max_new_tokens": 4})
    return GenerateReqInput(**fields)


def rejected(obj, input_ids=None, limits: ModelLimits = LIMITS) -> str:
    with pytest.raises(RequestRejected) as e:
        guard.check_request(obj, obj.input_ids if input_ids is None else input_ids, limits)
    return str(e.value)


@pytest.mark.parametrize("bad", [-3, -(2**63), VOCAB, VOCAB + 1, 2**40, 2**63 - 1])
def test_ids_outside_the_vocabulary_name_the_position(bad: int) -> None:
    assert rejected(req(input_ids=[1, bad, 2])) == f"input_ids[1] = {bad} is outside the vocabulary [0, {VOCAB})"


@pytest.mark.parametrize("ids", [[1, 2**64], [1, 2**70], [1, 2.5], [[1, 2]], ["3"]])
def test_ids_that_are_not_int64s_are_refused(ids) -> None:
    assert rejected(req(input_ids=ids)) == "input_ids must be a flat list of integer token ids (int64)"


def test_valid_requests_pass() -> None:
    for obj in (
        req(input_ids=[0, 5, VOCAB - 1]),
        req(text="hi", top_logprobs_num=VOCAB, logprob_start_len=-1),
        req(input_ids=[3], sampling_params={"top_k": -1, "stop_token_ids": [0, VOCAB - 1]}),
        req(input_ids=[3], session_params={"id": "s", "offset": 2, "replace": False}),
    ):
        guard.check_request(obj, obj.input_ids or [7], LIMITS)


def test_the_final_prompt_is_checked() -> None:
    """Text prompts: the tokenizer's ids (empty, or beyond the model's vocabulary)."""
    assert rejected(req(text=""), []) == (
        "the prompt is empty: input_ids (tokenized text) has no tokens; a request needs at least one"
    )
    assert rejected(req(input_ids=[]), []).startswith("the prompt is empty: input_ids has no tokens")
    assert rejected(req(text="hi"), [5, VOCAB]) == (
        f"input_ids (tokenized text)[1] = {VOCAB} is outside the vocabulary [0, {VOCAB})"
    )


def test_multimodal_placeholders_are_left_to_the_processor() -> None:
    image = "data:image/png;base64,AAAA"
    guard.check_request(req(text="hi", image_data=image), [1, 2**40, 2], LIMITS)  # the processor's pad ids
    assert rejected(req(input_ids=[1, -1], image_data=image), [1, 5]).startswith("input_ids[1] = -1")


def test_sampling_fields() -> None:
    assert rejected(req(input_ids=[1], sampling_params={"stop_token_ids": [4, -5]})) == (
        f"sampling_params.stop_token_ids[1] = -5 is outside the vocabulary [0, {VOCAB})"
    )
    for top_k in (0, -2, 2**31, 2**40):
        assert rejected(req(input_ids=[1], sampling_params={"top_k": top_k})) == (
            f"sampling_params.top_k (-1: all) = {top_k} must be in [1, {2**31 - 1}]"
        )
    assert "must be an integer, got a string" in rejected(req(input_ids=[1], sampling_params={"top_k": "5"}))
    assert rejected(req(input_ids=[1], sampling_params={"stop_regex": ["a+", "\\p{Lu}+"]})).startswith(
        "sampling_params.stop_regex[1] = '\\\\p{Lu}+' is not a valid regular expression: bad escape \\p"
    )
    guard.check_request(req(input_ids=[1], sampling_params={"stop_regex": "[0-9]+"}), [1], LIMITS)


def test_logprob_fields() -> None:
    msg = rejected(req(input_ids=[1], top_logprobs_num=VOCAB + 1))
    assert msg == f"top_logprobs_num (OpenAI: logprobs / top_logprobs) = {VOCAB + 1} must be in [0, {VOCAB}]"
    assert rejected(req(input_ids=[1], top_logprobs_num=-3)).endswith(f"= -3 must be in [0, {VOCAB}]")
    assert rejected(req(input_ids=[1], logprob_start_len=-7)) == "logprob_start_len = -7 must be at least -1"


def test_positional_embed_overrides() -> None:
    from sglang.srt.managers.embed_types import PositionalEmbeds

    assert rejected(req(input_ids=[1, 2], positional_embed_overrides=[1, 2])) == (
        "positional_embed_overrides must be a PositionalEmbeds object (Engine API); a request cannot carry it as "
        "an array"
    )
    ok = PositionalEmbeds(embeds=torch.zeros(1, 8), positions=[1])
    guard.check_request(req(input_ids=[1, 2], positional_embed_overrides=ok), [1, 2], LIMITS)
    past = PositionalEmbeds(embeds=torch.zeros(1, 8), positions=[2])
    assert rejected(req(input_ids=[1, 2], positional_embed_overrides=past)) == (
        "positional_embed_overrides.positions[0] = 2 is outside the prompt [0, 2)"
    )


def test_override_types_are_checked_before_the_batch_is_split() -> None:
    """sglang indexes a list of overrides per prompt while it splits the batch (``[]``: a 500)."""
    for junk in ([1, 2], [None, 3], {"a": 1}, "x"):
        with pytest.raises(RequestRejected, match="positional_embed_overrides must be a PositionalEmbeds"):
            guard.before_normalize(req(input_ids=[[1, 2], [3]], positional_embed_overrides=junk))
    with pytest.raises(RequestRejected, match="positional_embed_overrides has 0 entries"):
        guard.before_normalize(req(input_ids=[[1, 2], [3]], positional_embed_overrides=[]))


def test_per_prompt_lists_have_one_entry_per_prompt() -> None:
    """sglang indexes them per prompt unchecked while it splits the batch (a 500 each)."""
    for fields, error in (
        ({"input_ids": [[1, 2], [3]], "top_logprobs_num": [1]}, "top_logprobs_num has 1 entries"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params has 1 entries"),
        ({"input_ids": [[1]], "sampling_params": []}, "sampling_params has 0 entries"),
        ({"input_ids": [[1], [2]], "token_ids_logprob": [[1]]}, "token_ids_logprob has 1 entries"),
        ({"text": ["a", "b"], "lora_path": ["x", "y", "z"]}, "lora_path has 3 entries"),
        (
            {"input_ids": [1, 2], "sampling_params": [{"max_new_tokens": 2}]},
            "sampling_params must not be a list for a single prompt, got an array",
        ),
        ({"input_ids": [1, 2], "lora_path": [], "sampling_params": {"n": 2}}, "lora_path must not be a list"),
    ):
        with pytest.raises(RequestRejected, match=error):
            guard.before_normalize(req(**fields))
    for fields in (
        {"input_ids": [[1], [2]], "token_ids_logprob": [1]},  # one list for every prompt
        {"text": ["a", "b"], "return_logprob": [True, False], "sampling_params": [{}, {"n": 1}]},
        {"input_ids": [[1]], "sampling_params": [{}]},
    ):
        guard.before_normalize(req(**fields))


def test_logit_bias_values() -> None:
    guard.check_request(req(input_ids=[1], sampling_params={"logit_bias": {"5": -100, "6": 100.0}}), [1], LIMITS)
    for value in (1e308, -100.5, float("nan"), "1", True):
        assert rejected(req(input_ids=[1], sampling_params={"logit_bias": {"5": value}})) == (
            f"sampling_params.logit_bias['5'] = {value!r} must be a number in [-100, 100]"
        )


def test_session_params() -> None:
    assert rejected(req(input_ids=[1], session_params={"+": {}})) == (
        "session_params has unknown field(s) ['+']; it takes ['id', 'rid', 'offset', 'replace', 'drop_previous_output']"
    )
    assert rejected(req(input_ids=[1], session_params={"offset": "x"})) == (
        "session_params.offset: Expected `int | null`, got `str`"
    )


def test_input_embeds_shape_and_length() -> None:
    guard.check_request(req(input_embeds=[[0.0] * 8] * 3), None, LIMITS)
    for embeds, what in (([[0.0] * 7], "shape [1, 7]"), ([], "shape [0]"), ([[0.0] * 8, [1.0]], "ragged")):
        assert what in rejected(req(input_embeds=embeds), None)
    assert "context length is 64" in rejected(req(input_embeds=[[0.0] * 8] * 64), None)


def test_parallel_samples_are_bounded_before_expansion() -> None:
    for n in (0, -1, guard.MAX_PARALLEL_SAMPLES + 1, 10**9):
        with pytest.raises(RequestRejected, match=f"sampling_params.n = {n} must be in"):
            guard.check_parallel_samples(req(text="hi", sampling_params={"n": n}))
    with pytest.raises(RequestRejected, match=r"sampling_params\[1\].n must be an integer, got a string"):
        guard.check_parallel_samples(req(text=["a", "b"], sampling_params=[{"n": 2}, {"n": "2"}]))
    with pytest.raises(RequestRejected, match="sampling_params.n must be an integer, got null"):  # was a 500
        guard.check_parallel_samples(req(text="hi", sampling_params={"n": None}))
    guard.check_parallel_samples(req(text="hi", sampling_params={"n": guard.MAX_PARALLEL_SAMPLES}))


def test_limits_come_from_the_served_model_without_a_tokenizer() -> None:
    """``--skip-tokenizer-init``: the manager has no tokenizer, its model config still bounds ids."""
    manager = SimpleNamespace(
        tokenizer=None, context_len=32, model_config=SimpleNamespace(vocab_size=100, hidden_size=8)
    )
    guard.before_validate_one_request(manager, req(input_ids=[99]), [99])
    with pytest.raises(RequestRejected, match=r"input_ids\[0\] = 100 is outside the vocabulary \[0, 100\)"):
        guard.before_validate_one_request(manager, req(input_ids=[100]), [100])


@pytest.mark.parametrize(
    "path, body, error",
    [
        ("/v1/chat/completions", None, "the request body must be a JSON object, got null"),
        ("/v1/completions", [1], "the request body must be a JSON object, got an array"),
        ("/v1/chat/completions", {"response_format": [1]}, "response_format must be a JSON object, got an array"),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "schema": "x"}},
            "response_format.schema must be a JSON object, got a string",
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"schema": {"properties": {"strict": 1}}}},
            "response_format.schema.properties.strict must be a JSON object, got a number",
        ),
        ("/v1/chat/completions", {"response_format": {"type": "text"}}, None),
        ("/v1/chat/completions", {"response_format": None}, None),
        ("/generate", [1], None),  # sglang's own contract check answers /generate
    ],
)
def test_body_shapes(path: str, body, error) -> None:
    assert guard.body_shape_error(path, body) == error


def test_a_grammar_that_admits_nothing_is_invalid(smollm2_dir: Path) -> None:
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
    from transformers import AutoTokenizer

    vocab = json.loads((smollm2_dir / "config.json").read_text())["vocab_size"]
    backend = XGrammarGrammarBackend(AutoTokenizer.from_pretrained(str(smollm2_dir)), vocab_size=vocab)

    def compiled(ebnf: str):
        ctx = backend.grammar_compiler.compile_grammar(ebnf)
        unhooked = getattr(type(backend)._from_context, "__wrapped__", type(backend)._from_context)
        return guard.refuse_empty_grammar(unhooked, backend, ctx, ebnf, None)

    assert isinstance(compiled('root ::= root "a"'), InvalidGrammarObject)  # no base case: empty language
    for ok in ('root ::= "a" root', 'root ::= "a" | "b"', 'root ::= ""', "root ::= [0-9]+"):
        assert not isinstance(compiled(ok), InvalidGrammarObject), ok


def test_registration(monkeypatch) -> None:
    registered = []
    registry = SimpleNamespace(register=lambda target, fn, kind: registered.append((target, fn, kind)))
    kinds = SimpleNamespace(BEFORE="before", AROUND="around")
    guard.register(registry, kinds)
    assert registered == [
        (guard.VALIDATE_ONE, guard.before_validate_one_request, "before"),
        (guard.NORMALIZE, guard.before_normalize, "before"),
        (guard.GRAMMAR_MATCHER, guard.refuse_empty_grammar, "around"),
        (guard.PARSE_JSON, guard.object_json_body, "around"),
    ]
    registered.clear()
    monkeypatch.setattr(guard, "serves_http", lambda: False)  # a process sglang spawned
    guard.register(registry, kinds)
    assert guard.PARSE_JSON not in [target for target, _, _ in registered]


def test_the_plugin_hooks_sglangs_tokenizer_manager() -> None:
    """Through sglang's plugin loader: the real validation seam raises the guard's error first."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.plugins import load_plugins

    load_plugins()
    manager = SimpleNamespace(context_len=32, model_config=SimpleNamespace(vocab_size=100, hidden_size=8))
    with pytest.raises(RequestRejected, match=r"input_ids\[2\] = -1 is outside"):
        TokenizerManager._validate_one_request(manager, req(input_ids=[1, 2, -1]), [1, 2, -1])
    with pytest.raises(RequestRejected, match="sampling_params.n = 0"):
        req(text="hi", sampling_params={"n": 0}).normalize_batch_and_arguments()


def test_http_rows_are_checked_only_where_http_is_served(monkeypatch) -> None:
    """compat: spawned scheduler processes skip the HTTP server's rows instead of importing it."""
    from sglang_echo.integration import compat

    row = compat.Hook("no_such_http_module", "ORJSONRequest.json", ("self",), "test", "register", http=True)
    monkeypatch.setattr(compat, "HOOKS", (row,))
    assert "no_such_http_module" in " ".join(compat.check_hooks("register"))
    monkeypatch.setattr(compat, "serves_http", lambda: False)
    assert compat.check_hooks("register") == []
