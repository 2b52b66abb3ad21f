"""Temperature > 0 through real servers: speculative decoding samples the target distribution.

The first generated token comes from prefill; the second from a verify step (accepted draft or
bonus token). So the joint distribution of (token 1, token 2) over many samples of one prompt
must be the same with ECHO (EAGLE-3 head, and the n-gram drafter) as without speculation: a
chi-square test of homogeneity. The same test, on the same reference samples, must reject what
sglang did on CPU before the platform's sampled verify (token 2 = the target's argmax given
token 1), so it cannot pass by lacking power. The no-speculation samples come with the run's
shared SmolLM2 reference (``smollm2_nospec`` in conftest.py).
"""

from __future__ import annotations

from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from .conftest import SAMPLES, TEMPERATURE, sample_pairs, start

pytestmark = pytest.mark.server

ALPHA = 1e-3


def _p_value(a: list, b: list) -> float:
    """Chi-square homogeneity of two samples; categories seen < 10 times in total are pooled."""
    counts = Counter(a) + Counter(b)
    keep = {k for k, n in counts.items() if n >= 10}
    ca = Counter(k if k in keep else "other" for k in a)
    cb = Counter(k if k in keep else "other" for k in b)
    cats = sorted(set(ca) | set(cb), key=str)
    return float(chi2_contingency([[ca[c] for c in cats], [cb[c] for c in cats]])[1])


@pytest.fixture(scope="module")
def reference(smollm2_nospec) -> list[tuple[int, int]]:
    return smollm2_nospec.sampled


def test_reference_is_spread_and_the_test_has_power(reference) -> None:
    firsts = Counter(t1 for t1, _ in reference)
    assert len(set(reference)) >= 10 and len(firsts) >= 3, "prompt too deterministic for a distribution test"
    # Greedy verify: token 2 would be the most likely token given token 1.
    mode = {t1: Counter(t2 for u, t2 in reference if u == t1).most_common(1)[0][0] for t1 in firsts}
    greedy = [(t1, mode[t1]) for t1, _ in reference]
    assert _p_value(reference, greedy) < ALPHA


@pytest.mark.parametrize("drafter", ["eagle3", "ngram"])
def test_echo_samples_the_target_distribution(drafter, smollm2_dir, sampled_prompt_ids, reference) -> None:
    from sglang_echo.models.drafts import stage_head

    draft = stage_head(smollm2_dir) if drafter == "eagle3" else None
    env = {"SGLANG_ECHO_POLICY": "echo", "SGLANG_ECHO_DRAFTER": drafter}
    srv = start(smollm2_dir, spec="echo", draft=draft, env=env, tag=f"sampled-echo-{drafter}")
    try:
        got, meta = sample_pairs(srv.base_url, sampled_prompt_ids)
    finally:
        srv.stop()
    assert sum(m["spec_verify_ct"] for m in meta) >= SAMPLES  # token 2 came from verify steps
    p = _p_value(reference, got)
    print(f"[{drafter}] chi-square p = {p:.3g}, {len(set(got))} distinct pairs")
    assert p > ALPHA, f"ECHO ({drafter}) at temperature {TEMPERATURE} differs from the target distribution (p={p:.2g})"
