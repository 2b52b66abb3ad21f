"""Head checkpoints on disk (``drafters/checkpoint.py``), the same for every head kind: the shipped
heads re-saved in every layout the Hub uses (single and sharded safetensors, single and sharded
``.bin``) load to the same tensors and draft the same outputs; a ``.bin`` that would run code is
refused by torch's restricted loader; a folder that is not a checkpoint is a clear one-line error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_echo.drafters.checkpoint import CheckpointError, MissingWeights, find_weights, read_weights
from sglang_echo.drafters.dart_head import DartHead
from sglang_echo.drafters.dflash_head import DFlashHead
from sglang_echo.drafters.eagle3_head import Eagle3Head
from sglang_echo.models.drafts import SHIPPED
from tests.drafters import test_dart, test_dflash, test_eagle3

KINDS = {
    "EAGLE-3": (test_eagle3.make_head, lambda path, h: Eagle3Head.load(path, h.embed)),
    "DART": (test_dart.make_head, lambda path, h: DartHead.load(path, h.embed)),
    "DFlash": (test_dflash.make_head, lambda path, h: DFlashHead.load(path, h.embed, h.lm_head)),
}
LAYOUTS = ("safetensors", "sharded-safetensors", "bin", "sharded-bin")


@pytest.fixture(params=list(KINDS))
def kind(request):
    return request.param


def resave(src: Path, out: Path, layout: str) -> Path:
    """``src``'s config and ``model.safetensors`` re-saved in ``layout`` (a :data:`LAYOUTS` name)."""
    tensors = load_file(str(src / "model.safetensors"))
    out.mkdir(parents=True)
    shutil.copy2(src / "config.json", out / "config.json")
    fmt, sharded = layout.removeprefix("sharded-"), layout.startswith("sharded-")
    write = (
        (lambda t, f: save_file(t, str(f), metadata={"format": "pt"}))
        if fmt == "safetensors"
        else (lambda t, f: torch.save(t, f))
    )
    stem, ext = ("model", "safetensors") if fmt == "safetensors" else ("pytorch_model", "bin")
    if not sharded:
        write(tensors, out / f"{stem}.{ext}")
        return out
    names = sorted(tensors)
    parts = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for i, part in enumerate(parts, 1):
        shard = f"{stem}-{i:05d}-of-{len(parts):05d}.{ext}"
        write({k: tensors[k] for k in part}, out / shard)
        weight_map.update({k: shard for k in part})
    (out / f"{stem}.{ext}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


# -- the shipped SmolLM2 heads, in every layout ------------------------------------------------------
L_TARGET, V_TARGET, H_TARGET = 30, 49152, 576  # SmolLM2-135M-Instruct: layers, vocabulary, hidden size


def load_shipped(kind: str, path: Path, embed: torch.Tensor):
    if kind == "eagle3":
        return Eagle3Head.load(path, embed, L_TARGET)
    if kind == "dart":
        return DartHead.load(path, embed, L_TARGET)
    return DFlashHead.load(path, embed, None, L_TARGET)


@torch.no_grad()
def draft_outputs(kind: str, head, seed: int = 0) -> torch.Tensor:
    """Draft logits of ``head`` for random target features: one causal EAGLE-3 pass, DART's ``d``
    shifted logits, DFlash's block."""
    g = torch.Generator().manual_seed(seed)
    n, H = 9, head.cfg.hidden_size
    tokens = torch.randint(0, head.cfg.vocab_size, (n,), generator=g)
    if kind == "dflash":
        return head.reference_block_logits(torch.randn(n, head.cfg.num_context_features * H, generator=g), 17)
    fused = head.fuse(torch.randn(n, len(head.cfg.aux_layer_ids) * H, generator=g))
    if kind == "dart":
        return head.prefix_logits(fused, tokens)
    p = head.project(fused[None], tokens[None], torch.arange(n)[None])
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    logits, out = head.finish(head.attend(p.q, p.k, p.v, causal), p.residual)
    return torch.cat([logits.flatten(), out.flatten()])


@pytest.mark.parametrize("shipped", list(SHIPPED))
def test_shipped_heads_load_the_same_from_every_layout(tmp_path, shipped):
    embed = torch.randn(V_TARGET, H_TARGET, generator=torch.Generator().manual_seed(3))
    ref = load_shipped(shipped, SHIPPED[shipped], embed)
    ref_state, ref_out = ref.state_dict(), draft_outputs(shipped, ref)
    for layout in LAYOUTS:
        path = resave(SHIPPED[shipped], tmp_path / layout, layout)
        assert find_weights(path).format == layout.removeprefix("sharded-")
        head = load_shipped(shipped, path, embed)
        assert head.cfg == ref.cfg
        state = head.state_dict()
        assert state.keys() == ref_state.keys()
        for k in ref_state:
            assert torch.equal(state[k], ref_state[k]), (layout, k)
        assert torch.equal(draft_outputs(shipped, head), ref_out), layout


# -- layouts, preference and errors, on tiny heads of each kind --------------------------------------
def test_a_directory_without_config_or_weights_says_which(tmp_path, kind):
    make, load = KINDS[kind]
    head = make(seed=1, dtype=torch.float32)
    with pytest.raises(FileNotFoundError, match=f"no config.json \\(not a {kind} head directory\\)"):
        load(tmp_path, head)
    (tmp_path / "config.json").write_text(json.dumps(head.cfg.to_hf({})))
    with pytest.raises(
        FileNotFoundError,
        match=f"{tmp_path}: no head weights \\(looked for model.safetensors.index"
        f".json, model.safetensors, model-\\*.safetensors, pytorch_model.bin",
    ):
        load(tmp_path, head)
    with pytest.raises(MissingWeights, match=f"config.json: not a directory \\(a {kind} head is a folder"):
        load(tmp_path / "config.json", head)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load(tmp_path, head)


def test_unindexed_shards_merge_and_other_safetensors_are_not_weights(tmp_path, kind):
    make, load = KINDS[kind]
    head = make(seed=2, dtype=torch.float32)
    head.save(tmp_path / "h", dtype=torch.float32)
    tensors = load_file(str(tmp_path / "h" / "model.safetensors"))
    (tmp_path / "h" / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    save_file({k: tensors[k] for k in names[:half]}, str(tmp_path / "h" / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[half:]}, str(tmp_path / "h" / "model-00002-of-00002.safetensors"))
    # A file beside the head (DART keeps its n-gram trie there) must not be read as weights.
    save_file({"not_a_weight": torch.zeros(3)}, str(tmp_path / "h" / "ngram-trie.safetensors"))
    again = load(tmp_path / "h", head)
    for (n1, p1), (n2, p2) in zip(head.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_safetensors_win_over_a_bin_beside_them(tmp_path, kind):
    make, load = KINDS[kind]
    head = make(seed=4, dtype=torch.float32)
    head.save(tmp_path / "h", dtype=torch.float32)
    stale = {k: torch.zeros_like(v) for k, v in load_file(str(tmp_path / "h" / "model.safetensors")).items()}
    torch.save(stale, tmp_path / "h" / "pytorch_model.bin")
    again = load(tmp_path / "h", head)
    for (n1, p1), (n2, p2) in zip(head.state_dict().items(), again.state_dict().items()):
        assert torch.equal(p1, p2), n1


class RunsCode:
    """Unpickled in full, this opens (creates) ``marker``: the stand-in for a pickle that runs code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.parametrize("sharded", [False, True])
def test_a_bin_that_would_run_code_is_refused(tmp_path, kind, sharded):
    make, load = KINDS[kind]
    head = make(seed=5, dtype=torch.float32)
    head.save(tmp_path / "src", dtype=torch.float32)
    path = resave(tmp_path / "src", tmp_path / "h", "sharded-bin" if sharded else "bin")
    victim = sorted(path.glob("*.bin"))[-1]
    marker = tmp_path / "code-ran"
    torch.save({**torch.load(victim, weights_only=True), "payload": RunsCode(marker)}, victim)
    with pytest.raises(CheckpointError, match=f"{victim}: refused by torch's restricted loader .*io.open") as e:
        load(path, head)
    assert "\n" not in str(e.value) and not marker.exists()
    torch.load(victim, weights_only=False)  # the control: unpickled in full, the file does run code
    assert marker.exists()


def test_unreadable_files_and_broken_indexes_are_one_line_errors(tmp_path):
    head = test_eagle3.make_head(seed=6, dtype=torch.float32)
    head.save(tmp_path / "src", dtype=torch.float32)
    path = resave(tmp_path / "src", tmp_path / "h", "sharded-safetensors")
    index = path / "model.safetensors.index.json"
    shard = path / "model-00002-of-00002.safetensors"
    good = shard.read_bytes()
    shard.write_bytes(b"\x00 not safetensors")
    with pytest.raises(CheckpointError, match=f"{shard}: not a readable safetensors file"):
        read_weights(path)
    shard.unlink()
    with pytest.raises(MissingWeights, match=f"{index}: names shard\\(s\\) missing from {path}: {shard.name}"):
        read_weights(path)
    shard.write_bytes(good)
    index.write_text(json.dumps({"weight_map": {"fc.weight": "../elsewhere.safetensors"}}))
    with pytest.raises(CheckpointError, match="shard names must be files beside the index"):
        read_weights(path)
    index.write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match=f"{index}: not a weight index"):
        read_weights(path)
    index.unlink()  # unindexed shards still load
    assert read_weights(path).keys() == load_file(str(tmp_path / "src" / "model.safetensors")).keys()
    for f in path.glob("model-*"):
        f.unlink()
    (path / "pytorch_model.bin").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: refused by torch's restricted loader") as e:
        read_weights(path)
    assert "\n" not in str(e.value)
    torch.save([torch.zeros(2)], path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="not a state dict"):
        read_weights(path)
