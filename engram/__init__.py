"""engram: serve the on-disk n-gram memory (Engram) of DeepSeek V4.1-class models.

The public API, re-exported here:

- :class:`Layout` -- primes, offsets and multipliers of the hashed tables (SPEC §2)
- :func:`build_token_map` -- the compressed token map (SPEC §3)
- :class:`Hasher`, :class:`History` -- the n-gram hash and its per-sequence state (SPEC §4)
- :func:`decode_rows`, :func:`encode_rows`, :func:`bf16_round` -- the row codec e4m3_e8m0_32_row264 (SPEC §5);
  ``decode_rows(raw, row_ids=)`` also decodes raw records read on another machine
- :func:`read_model` -> :class:`ModelInfo` -- the Engram part of a (split) GGUF model, headers only (SPEC §6);
  :func:`repair_model` -- rewrite one with the current keys
- :class:`Table`, :class:`TableGroup`, :class:`ReadStats` -- uncached, concurrent row reads (SPEC §8)
- :class:`RowCache` -- raw records of rows read, shared by a model's sessions (LRU or W-TinyLFU)
- :func:`usable_backends`, :func:`auto_backend`, :func:`probe_backends` -> :class:`BackendStatus` -- which read
  backends start and read on this machine now, and the one ``backend="auto"`` uses
- :class:`EngramModel`, :class:`Session`, :class:`Prefetcher` -- models, decode sessions, prefill (SPEC §8);
  ``EngramModel.encode(text)`` -- token ids of text, by a tokenizer checked against the file's vocabulary;
  ``Session.step_many``, ``rollback``, ``prefetch`` -> :class:`DraftPrefetch` -- speculative decoding
  (:mod:`engram.drafts`)
- :func:`check_tokenizer`, :func:`file_tokenizer`, :func:`tokenizer_vocabulary` -- the vocabulary a model
  file carries against the tokenizer that encodes text for it (:mod:`engram.vocabulary`)
- :func:`project`, :func:`gated_add`, :func:`kv_weights` -- projection and gated add of a layer (SPEC §7)
- :mod:`engram.gpu` (optional extra ``engram[gpu]``, not imported here) -- sessions on a PyTorch device:
  ``EngramModel.session(device="cuda")``, ``engram.gpu.step_batch``
- errors: :class:`EngramError` and its kinds
"""

from .errors import (
    ArgumentError,
    CacheCopyError,
    CacheError,
    CacheLayoutError,
    CachePolicyError,
    CacheSizeError,
    DecodeError,
    DeviceError,
    EngramError,
    FormatError,
    HistoryError,
    LayoutError,
    MaskError,
    RowRangeError,
    OutputError,
    TableIOError,
    TokenError,
    VocabularyError,
)
from .backends import BackendStatus, auto_backend, probe_backends, usable_backends
from .codec import bf16_round, decode_rows, encode_rows
from .hashing import DEAD, Hasher, History
from .gguf import EngramLayer, KeySource, KeyValue, ModelInfo, TableLocation, TensorLocation, read_model, repair_model
from .layout import Layout
from .mixer import gated_add, kv_weights, project
from .rowcache import RowCache
from .table import ReadStats, Table, TableGroup, available_backends
from .model import EngramModel, LayerWeights, Session
from .prefetch import PrefetchCancelled, Prefetcher
from .drafts import DraftCancelled, DraftPrefetch
from .tokenmap import build_token_map, default_tokenizer_json, load_tokenizer
from .vocabulary import Vocabulary, check_tokenizer, file_tokenizer, model_tokenizer, tokenizer_vocabulary

__version__ = "0.1.0"

__all__ = [
    "ArgumentError", "DecodeError", "DeviceError", "EngramError", "FormatError", "HistoryError", "LayoutError", "MaskError",
    "RowRangeError", "TableIOError", "TokenError", "VocabularyError", "OutputError",
    "CacheError", "CacheSizeError", "CachePolicyError", "CacheLayoutError", "CacheCopyError", "RowCache",
    "DEAD", "Hasher", "History", "Layout",
    "build_token_map", "default_tokenizer_json", "load_tokenizer",
    "Vocabulary", "check_tokenizer", "file_tokenizer", "model_tokenizer", "tokenizer_vocabulary",
    "decode_rows", "encode_rows", "bf16_round",
    "project", "gated_add", "kv_weights",
    "Table", "TableGroup", "ReadStats", "available_backends",
    "usable_backends", "auto_backend", "probe_backends", "BackendStatus",
    "EngramModel", "Session", "LayerWeights", "Prefetcher", "PrefetchCancelled", "DraftPrefetch", "DraftCancelled",
    "read_model", "repair_model", "ModelInfo", "TableLocation", "TensorLocation", "EngramLayer", "KeyValue",
    "KeySource",
]
