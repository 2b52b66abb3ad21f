"""Fused control-plane kernels: ECHO's step as a handful of Triton programs instead of ~770
tensor ops (each a GPU launch).

* :mod:`.elastic`: one program per draft depth (append, gates, grants, ranking, marks) and one
  for Priority 2: :data:`TRITON`, the :class:`~sglang_echo.core.scheduler.FusedControl` that
  ``make_policy(name, PolicyConfig(control_kernel="triton"), fused=TRITON)`` runs;
* :mod:`.layout`: the verify layout, ``pad_pool`` and ``dense_from_padded``, one program per
  request each (``GraphedTreeBuilder(pad=layout.pad_pool, finish=layout.dense_from_padded)``).

Import them only where Triton may run (on CPU, with ``TRITON_INTERPRET=1`` set first).
"""

from ...core.scheduler import FusedControl
from .elastic import elastic_depth, elastic_select

TRITON = FusedControl(elastic_depth, elastic_select)

__all__ = ["TRITON"]
