"""Tree-verify attention over ECHO's packed ragged layout (issue 7).

One contract, several implementations (see :mod:`.metadata` for the layout):

* :mod:`.reference`: vectorised PyTorch, the oracle;
* :mod:`.triton_kernel`: Triton, split-K over the prefix, GQA-shared K/V loads, bit-packed mask;
* :mod:`.flashinfer_path`: FlashInfer paged prefill with a custom mask (when installed);
* :mod:`.graph_buffers`: token buckets and static buffers for CUDA-graph capture.
* :mod:`.ragged_tier`: ECHO's compact verify padded to a CUDA-graph token tier (torch only).

Only the torch-only modules are re-exported; import the Triton module explicitly (it reads
``TRITON_INTERPRET`` at import time).
"""

from .metadata import (
    TreeAttentionPlan,
    VerifyLayout,
    build_block_table,
    full_mask_cells,
    gather_kv_indices,
    lengths_to_indptr,
    pack_dense_blocks,
    pack_full_mask_rows,
    ragged_rows,
    unpack_bits,
)
from .reference import tree_attention_reference

__all__ = [
    "TreeAttentionPlan",
    "VerifyLayout",
    "build_block_table",
    "full_mask_cells",
    "gather_kv_indices",
    "lengths_to_indptr",
    "pack_dense_blocks",
    "pack_full_mask_rows",
    "ragged_rows",
    "tree_attention_reference",
    "unpack_bits",
]
