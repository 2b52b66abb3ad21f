"""``echo-replay sim-inputs``: a simulated benchmark's prompts and sglang EAGLE3's accept length."""

from __future__ import annotations

import json

import pytest

from sglang_echo.replay.cli import main
from sglang_echo.replay.sim_inputs import LABEL, TreeShape, eagle3_acc_len, load_sim_inputs, sim_inputs

from .conftest import MAX_NEW


def _chain_mat(trace, depth: int) -> float:
    """Mean tokens per step of a top-1 chain of ``depth``, walked by hand over the recorded trees:
    at root o_s follow the first recorded child while it is the true next token."""
    steps = accepted = 0
    for p in range(trace.num_prompts):
        out, s = trace.output(p).tolist(), 0
        while s + 1 < trace.meta.max_new:
            base = int(trace.node_indptr[int(trace.tree_indptr[p]) + s])
            node, a = 0, 0
            while a < depth and int(trace.n_kept[base + node]) > 0:
                node = int(trace.first_child[base + node])
                if int(trace.token[base + node]) != out[s + a + 1]:
                    break
                a += 1
            steps, accepted, s = steps + 1, accepted + a, s + a + 1
    return (accepted + steps) / steps


def test_a_chain_shape_accepts_what_the_trees_hold(hash_trace):
    got = eagle3_acc_len(hash_trace, TreeShape(3, 1, 4))
    assert got["simulate_acc_len"] == pytest.approx(_chain_mat(hash_trace, 3), abs=1e-4)
    assert 1.0 < got["simulate_acc_len"] <= 4.0 and got["coverage"]["fraction"] == 1.0


def test_a_wider_tree_accepts_at_least_its_chain(hash_trace):
    chain = eagle3_acc_len(hash_trace, TreeShape(3, 1, 4))["simulate_acc_len"]
    tree = eagle3_acc_len(hash_trace, TreeShape(3, 3, 8))["simulate_acc_len"]
    assert tree > chain


@pytest.mark.parametrize("text", ["3/3", "3/3/1", "0/3/5", "a/b/c", ""])
def test_bad_shapes_name_the_option(text):
    with pytest.raises(ValueError, match="--eagle3-shape"):
        TreeShape.parse(text)


def test_the_file_holds_the_prompts_the_lengths_and_the_label(tmp_path, hash_trace):
    stem = tmp_path / "t"
    hash_trace.save(stem)
    main(["sim-inputs", "--trace", str(stem), "--eagle3-shape", "2/2/4", "--max-new-tokens", "12"])
    data = load_sim_inputs(tmp_path / "t.sim.json")
    assert data["label"] == LABEL and data["max_new"] == 12 and data["eagle3"]["shape"] == "2/2/4"
    assert [p["input_ids"] for p in data["prompts"]] == [
        hash_trace.prompt(p).tolist() for p in range(hash_trace.num_prompts)
    ]
    assert data["env"]["echo"]["SGLANG_ECHO_SIMULATE"] == str(stem.resolve())
    assert float(data["env"]["eagle3"]["SGLANG_SIMULATE_ACC_LEN"]) == data["eagle3"]["simulate_acc_len"]
    assert sim_inputs(hash_trace, stem, TreeShape(2, 2, 4), 99)["max_new"] == MAX_NEW  # capped at the trace's
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "x"}))
    with pytest.raises(ValueError, match="bad.json"):
        load_sim_inputs(tmp_path / "bad.json")
