"""Head checkpoints on disk (``drafters/checkpoint.py``), the same for every head kind: a directory
that is not a checkpoint is a clear error, shards merge, and only ``model*.safetensors`` are read."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_echo.drafters.dart_head import DartHead
from sglang_echo.drafters.dflash_head import DFlashHead
from sglang_echo.drafters.eagle3_head import Eagle3Head
from tests.drafters import test_dart, test_dflash, test_eagle3

KINDS = {
    "EAGLE-3": (test_eagle3.make_head, lambda path, h: Eagle3Head.load(path, h.embed)),
    "DART": (test_dart.make_head, lambda path, h: DartHead.load(path, h.embed)),
    "DFlash": (test_dflash.make_head, lambda path, h: DFlashHead.load(path, h.embed, h.lm_head)),
}


@pytest.fixture(params=list(KINDS))
def kind(request):
    return request.param


def test_a_directory_without_config_or_weights_says_which(tmp_path, kind):
    make, load = KINDS[kind]
    head = make(seed=1, dtype=torch.float32)
    with pytest.raises(FileNotFoundError, match=f"no config.json \\(not a {kind} head directory\\)"):
        load(tmp_path, head)
    (tmp_path / "config.json").write_text(json.dumps(head.cfg.to_hf({})))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load(tmp_path, head)


def test_shards_merge_and_other_safetensors_are_not_weights(tmp_path, kind):
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
