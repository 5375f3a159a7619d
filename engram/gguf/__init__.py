"""The Engram part of a (split) GGUF model file (SPEC §6): read from headers only, repaired, written.

Modules, each one idea:

- :mod:`.header` -- bounded parsing of one file's header (fixed header, metadata, tensor infos);
- :mod:`.shards` -- split sets ``NAME-0000k-of-0000N.gguf`` and their ``split.*`` keys;
- :mod:`.keys` -- the Engram keys, their legacy ``deepseek4.*`` aliases, what the layout derives
  when a key is absent, and the cross-checks between them;
- :mod:`.tensors` -- where each tensor lies, and the checks of the Engram tensors' types and shapes;
- :mod:`.info` -- :func:`read_model` and :class:`ModelInfo`;
- :mod:`.write` -- files that appear only complete (:func:`atomic_outputs`) and
  :func:`repair_model` (``engram repair``).
"""

from .header import GGUF_VERSION, KeyValue, read_kv
from .info import ModelInfo, read_model
from .keys import (ARCHITECTURE, ARCHITECTURES, DEFAULT_EPS, HC_STREAMS, HIDDEN_SIZE, LEGACY_ARCHITECTURES,
                   MODEL_ALIGNMENT, KeySource)
from .shards import shard_name, shard_paths
from .tensors import EngramLayer, TableLocation, TensorLocation, check_finite
from .write import atomic_outputs, repair_model

__all__ = [
    "ARCHITECTURE", "ARCHITECTURES", "LEGACY_ARCHITECTURES", "HIDDEN_SIZE", "HC_STREAMS", "MODEL_ALIGNMENT",
    "DEFAULT_EPS", "GGUF_VERSION", "KeyValue", "KeySource", "TensorLocation", "TableLocation", "EngramLayer",
    "ModelInfo", "read_model", "read_kv", "shard_paths", "shard_name", "atomic_outputs", "repair_model",
    "check_finite",
]
