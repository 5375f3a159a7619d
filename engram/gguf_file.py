"""Deprecated module name: the GGUF reader now lives in :mod:`engram.gguf` (one module per idea).

``from engram.gguf_file import read_model`` and the other names below keep
working; new code imports from :mod:`engram` or :mod:`engram.gguf`.
"""

from .codec import ENCODING, ROW_BYTES, ROW_VALUES
from .gguf import (ARCHITECTURE, GGUF_VERSION, HC_STREAMS, HIDDEN_SIZE, MODEL_ALIGNMENT, EngramLayer, KeyValue,
                   ModelInfo, TableLocation, TensorLocation, read_kv, read_model, shard_paths)

__all__ = [
    "ARCHITECTURE", "ENCODING", "ROW_VALUES", "ROW_BYTES", "HIDDEN_SIZE", "HC_STREAMS", "GGUF_VERSION",
    "MODEL_ALIGNMENT", "KeyValue", "TensorLocation", "TableLocation", "EngramLayer", "ModelInfo",
    "read_model", "shard_paths", "read_kv",
]
