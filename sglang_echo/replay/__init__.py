"""Trace-replay simulator (``echo-replay``): record once, replay every policy exactly.

At temperature 0 the committed sequence is the same for every policy, so one recording of the
target's greedy output, with a deep and wide draft tree at every position, lets the real core
policies (``make_policy`` + ``build_trees`` + ``greedy_verify``) be replayed without the target:

* :mod:`.trace`     the trace dataclasses and their safetensors + JSON files;
* :mod:`.record`    ``record``: the offline loop with an exploring policy that keeps every draft;
* :mod:`.drafter`   :class:`RecordedDrafter`, a ``TreeDrafter`` served from the trace, with coverage;
* :mod:`.simulate`  the offline-loop mirror and the continuous-batching server at concurrency B;
* :mod:`.oracle`    the best accepted count any allocation of K_max slots could reach;
* :mod:`.cost`      measured cost curves and the throughput model; :mod:`.measure` measures them;
* :mod:`.validate`  replay == the offline engine, step for step (:mod:`.validate_server`: == a server);
* :mod:`.sim_inputs` a simulated-acceptance benchmark's prompts and sglang EAGLE3's accept length;
* :mod:`.report`, :mod:`.cli`  tables and the ``echo-replay`` command.
"""

from .drafter import Coverage, RecordedDrafter, StreamDiverged
from .oracle import oracle_accepted
from .simulate import ReplayResult, replay_offline, replay_serving
from .trace import Trace, TraceMeta

__all__ = [
    "Coverage",
    "RecordedDrafter",
    "ReplayResult",
    "StreamDiverged",
    "Trace",
    "TraceMeta",
    "oracle_accepted",
    "replay_offline",
    "replay_serving",
]
