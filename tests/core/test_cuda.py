"""The control plane on CUDA tensors (as in a GPU server) gives exactly the CPU result.

Every policy builds, packs and verifies the same synthetic batch on both devices: trees, masks,
retrieve arrays and accepted tokens must be identical (integer outputs; log-probs to rounding).
"""

from __future__ import annotations

import pytest
import torch

from sglang_echo.core import PolicyConfig, build_trees, greedy_verify, make_policy, pack
from sglang_echo.core.factory import POLICIES
from sglang_echo.core.synthetic import SyntheticDrafter, SyntheticWorld
from sglang_echo.core.verify import greedy_verify_padded

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def run(policy: str, device: str, batch: int = 48, seed: int = 3):
    world = SyntheticWorld(batch, vocab=5000, seed=seed, device=device)
    roots = torch.randint(0, 5000, (batch,), generator=torch.Generator().manual_seed(seed)).to(device)
    prefix = torch.randint(1, 300, (batch,), generator=torch.Generator().manual_seed(seed + 1)).to(device)
    cfg = PolicyConfig(k_max=3 * batch, max_depth=6, w_def=1, w_max=4, topk=3, total_tokens=12)
    trees, _ = build_trees(make_policy(policy, cfg), SyntheticDrafter(world), roots)
    packed = pack(trees, prefix)
    pred = world.target_argmax(trees)
    return (
        trees,
        packed,
        greedy_verify(trees, pred),
        greedy_verify_padded(packed, pred[packed.retrieve_index.clamp(min=0)]),
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_on_cuda_equals_cpu(policy):
    cpu, gpu = run(policy, "cpu"), run(policy, "cuda")
    for name in ("indptr", "tokens", "parents", "depth"):
        assert torch.equal(getattr(cpu[0], name), getattr(gpu[0], name).cpu()), name
    torch.testing.assert_close(cpu[0].logprob, gpu[0].logprob.cpu())
    for name in (
        "qo_indptr",
        "positions",
        "tree_mask",
        "packed_mask",
        "retrieve_index",
        "retrieve_next_token",
        "retrieve_next_sibling",
    ):
        assert torch.equal(getattr(cpu[1], name), getattr(gpu[1], name).cpu()), name
    for res_cpu, res_gpu in ((cpu[2], gpu[2]), (cpu[3], gpu[3])):
        assert torch.equal(res_cpu.accept_len, res_gpu.accept_len.cpu())
        assert torch.equal(res_cpu.new_tokens, res_gpu.new_tokens.cpu())
    assert torch.equal(cpu[2].new_tokens, cpu[3].new_tokens)  # ragged and padded verify agree
