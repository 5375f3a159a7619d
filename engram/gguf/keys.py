"""The Engram metadata of a model file: key names, legacy aliases, and the layout they describe
(SPEC §2, §3, §6, §7).

Keys are ``{arch}.engram.*`` with ``arch = general.architecture``
(``deepseek41``).  Files converted before those keys existed spell them
``deepseek4.engram.*``; every key is read under both prefixes of the family
(:data:`ARCHITECTURES`), and where both spellings are present their values must
agree.

*Primary* keys carry what the file alone knows: ``encoding``, ``primes``,
``multipliers``, ``pad_id``, ``token_map`` (and ``layer_ids``, which the table
tensors also name).  Every other constant is *derived* when the file leaves it
out, and checked against the derivation when it is present:

============================  ==================================================
``rows``                      sum of each layer's primes (SPEC §2)
``offsets``                   running sum of each layer's primes (SPEC §2)
``max_ngram_size``            multipliers per layer (one per lookback)
``head_count``                primes per layer / (max_ngram_size - 1)
``key_length``                256 values a row, from the encoding (SPEC §5)
``compressed_vocab_size``     largest token-map entry + 1 (SPEC §3: the
                              compressed ids are 0..n-1 in order of appearance)
``layer_ids``                 layers with a table ``blk.L.engram_embd.weight``
============================  ==================================================

The gate epsilon ``{arch}.attention.layer_norm_rms_epsilon`` falls back to
:data:`DEFAULT_EPS` when absent.  :class:`EngramKeys.sources` records where each
constant came from (a key, a legacy key, a derivation, a default), so
``engram inspect`` can say so.

Contradictions raise :class:`~engram.errors.FormatError` naming the key(s), the
entry index of an array, and both values; where the file cannot be trusted the
message gives the exact ``engram repair`` command that writes a corrected file.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from gguf import GGUFValueType

from ..codec import ENCODING, ROW_VALUES
from ..errors import FormatError, LayoutError
from ..layout import MAX_ROWS, Layout
from .header import FLOAT_TYPES, INLINE_ARRAY_ELEMENTS, INT_TYPES, MAX_TOKEN_MAP, Header, KeyValue, load_array
from .shards import SHARD_RE

__all__ = [
    "ARCHITECTURE", "LEGACY_ARCHITECTURES", "ARCHITECTURES", "HIDDEN_SIZE", "HC_STREAMS", "MODEL_ALIGNMENT",
    "DEFAULT_EPS", "EPS_KEY", "DERIVABLE", "REQUIRED", "KeySource", "EngramKeys", "engram_keys", "repair_command", "family_keys",
]

#: ``general.architecture`` of DeepSeek V4.1 models; the Engram keys use it as prefix.
ARCHITECTURE = "deepseek41"
#: Prefixes older converters wrote the same keys under; read as aliases of the current ones.
LEGACY_ARCHITECTURES = ("deepseek4",)
#: The family whose keys are aliases of each other (current spelling first).
ARCHITECTURES = (ARCHITECTURE,) + LEGACY_ARCHITECTURES
#: Width of a residual stream, the gate's ``width`` (SPEC §7); used when the file
#: has no ``{arch}.embedding_length`` and no norm tensor to read it from.
HIDDEN_SIZE = 5120
#: Hyper-connection residual streams per token (SPEC §1, §7).
HC_STREAMS = 4
#: Alignment of the released model's tensor data (SPEC §6).
MODEL_ALIGNMENT = 16384
#: Key of the gate epsilon, after ``{arch}.`` (SPEC §6, §7).
EPS_KEY = "attention.layer_norm_rms_epsilon"
#: Gate epsilon of a file without :data:`EPS_KEY`: DeepSeek V3/V4's ``rms_norm_eps``
#: (config.json), the value converters write into that key for these models.  The
#: gate's two RMS norms are the model's RMSNorm, so its epsilon is the model's.
#: Some ports use 1e-20 (an RMSNorm without epsilon) instead; the two agree unless a
#: residual stream or key has a mean square near 1e-6, where gates move by up to
#: ~0.16.  Pass ``eps=`` to :meth:`engram.EngramModel.open` to use another value.
DEFAULT_EPS = 1e-6

#: Constants a file may leave out (derived, see the module docstring).
DERIVABLE = ("rows", "offsets", "max_ngram_size", "head_count", "key_length", "compressed_vocab_size",
             "layer_ids")
#: Constants a file must carry (SPEC §6): neither derived nor defaulted.  A file with some Engram keys but not
#: these is told which are missing, by name, all at once.
REQUIRED = ("encoding", "primes", "multipliers", "token_map", "pad_id")

_LAYOUT_FIELD_NAMES = {
    "layer_ids": "layer_ids", "primes": "primes", "multipliers": "multipliers",
    "compressed_vocab_size": "compressed_vocab_size", "pad_id": "pad_id", "rows": "rows",
    "heads": "head_count", "max_ngram": "max_ngram_size",
}


@dataclass(frozen=True)
class KeySource:
    """Where a constant of the Engram metadata came from.

    ``kind`` is ``"key"`` (the current spelling), ``"legacy key"`` (only a
    :data:`LEGACY_ARCHITECTURES` spelling), ``"keys"`` (both spellings, equal),
    ``"derived"`` or ``"default"``; ``detail`` names the keys, or what the value
    was derived from.
    """

    kind: str
    detail: str

    @property
    def derived(self) -> bool:
        return self.kind in ("derived", "default")

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.derived else f"{self.kind} {self.detail}"


@dataclass(frozen=True, eq=False)
class EngramKeys:
    """The validated Engram metadata of a file (see :func:`engram_keys`)."""

    architecture: str
    encoding: str
    layout: Layout
    token_map: np.ndarray
    eps: float
    hidden_size: Optional[int]
    sources: Dict[str, KeySource]


def repair_command(path: Path, prefer: Optional[str] = None) -> str:
    """The ``engram repair`` command line that rewrites the model holding ``path``."""
    m = SHARD_RE.match(path.name)
    stem = m.group("stem") if m else path.stem
    out = path.with_name(f"{stem}.repaired.gguf")
    return f"engram repair {path} {out}" + (f" --prefer {prefer}" if prefer else "")


def _first_difference(a, b) -> Optional[Tuple[Optional[int], object, object]]:
    """None when ``a`` equals ``b``; else ``(entry index or None, value in a, value in b)``."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return None, f"{a.shape[0]} entries", f"{b.shape[0]} entries"
        ne = np.flatnonzero(a != b)
        if not ne.size:
            return None
        i = int(ne[0])
        return i, a[i].item(), b[i].item()
    return None if a == b else (None, a, b)


class _Keys:
    """Typed reads of one header's keys under every spelling of the family, with their sources."""

    def __init__(self, h: Header, arch: str, prefer: Optional[str], ignore: Sequence[str] = ()):
        self.h = h
        self.kv = h.kv  # arrays loaded on demand are stored back (ModelInfo.metadata holds the token map)
        self.arch = arch
        family = arch in ARCHITECTURES
        self.prefixes = [arch] + ([p for p in ARCHITECTURES if p != arch] if family else [])
        self.prefer = prefer
        self.ignored = frozenset(ignore)
        self.sources: Dict[str, KeySource] = {}

    # ---------------------------------------------------------------- errors
    def err(self, key: str, msg: str) -> FormatError:
        kv = self.kv.get(key)
        where = f" (byte offset {kv.offset})" if kv is not None else ""
        return FormatError(f"{self.h.path}: {key}: {msg}{where}")

    def key(self, name: str) -> str:
        """The key a constant was read from (the first spelling present), or its current spelling."""
        src = self.sources.get(name)
        if src is not None and src.kind in ("key", "legacy key", "keys"):
            return src.detail.split(" = ")[0]
        return f"{self.arch}.{_SUFFIX[name]}"

    def said(self, name: str) -> str:
        """``"(key K)"`` or ``"(derived: ...)"``: how a number in a message reached it."""
        src = self.sources.get(name)
        if src is None:
            return ""
        if src.derived:
            return f" ({src.kind}: {src.detail})"
        return f" ({self.key(name)})"

    def missing(self, name: str, why: str = "") -> FormatError:
        names = [f"{p}.{_SUFFIX[name]}" for p in self.prefixes]
        also = f" (nor its legacy spelling {', '.join(names[1:])})" if len(names) > 1 else ""
        return FormatError(f"{self.h.path}: required metadata key {names[0]} is missing{also}{why}")

    # ---------------------------------------------------------------- reads
    def value(self, name: str, read: Callable[[str], object]):
        """Read constant ``name`` under every spelling present; they must agree.  None if absent."""
        if name in self.ignored:
            return None
        found = [(k, read(k)) for k in (f"{p}.{_SUFFIX[name]}" for p in self.prefixes) if k in self.kv]
        if not found:
            return None
        k0, v0 = found[0]
        for k, v in found[1:]:
            diff = _first_difference(v0, v)
            if diff is None:
                continue
            if self.prefer is not None:
                found = [next(((kk, vv) for kk, vv in found if kk.startswith(self.prefer + ".")), found[0])]
                break
            i, a, b = diff
            entry = f" at entry [{i}]" if i is not None else ""
            fix = (f"run `{repair_command(self.h.path)}` to rewrite it from the rest" if name in DERIVABLE else
                   f"the file cannot say which is right; if you know, run `{repair_command(self.h.path, 'P')}` "
                   f"with P one of {', '.join(p for p in self.prefixes)}")
            raise FormatError(f"{self.h.path}: {k0} and {k} (the other spelling) disagree{entry}: {a!r} vs {b!r}; "
                              f"{fix}")
        keys = [k for k, _ in found]
        if len(keys) > 1:
            self.sources[name] = KeySource("keys", " = ".join(keys))
        else:
            legacy = keys[0].split(".", 1)[0] in LEGACY_ARCHITECTURES
            self.sources[name] = KeySource("legacy key" if legacy else "key", keys[0])
        return found[0][1]

    def derive(self, name: str, detail: str) -> None:
        self.sources[name] = KeySource("derived", detail)

    def string(self, key: str) -> str:
        kv = self.kv[key]
        if kv.type != GGUFValueType.STRING:
            raise self.err(key, f"has type {kv.describe_type()}, expected STRING")
        return kv.value

    def integer(self, lo: int = 0, hi: int = 2**64 - 1) -> Callable[[str], int]:
        def read(key: str) -> int:
            kv = self.kv[key]
            if kv.type not in INT_TYPES:
                raise self.err(key, f"has type {kv.describe_type()}, expected an integer (UINT32)")
            v = int(kv.value)
            if not lo <= v <= hi:
                raise self.err(key, f"value {v} outside [{lo}, {hi}]")
            return v
        return read

    def number(self, key: str) -> float:
        kv = self.kv[key]
        if kv.type not in FLOAT_TYPES:
            raise self.err(key, f"has type {kv.describe_type()}, expected FLOAT32")
        return float(kv.value)

    def int_array(self, max_len: int = INLINE_ARRAY_ELEMENTS) -> Callable[[str], np.ndarray]:
        def read(key: str) -> np.ndarray:
            kv = self.kv[key]
            if kv.type != GGUFValueType.ARRAY or kv.subtype not in INT_TYPES:
                raise self.err(key, f"has type {kv.describe_type()}, expected an integer array")
            if kv.count > max_len:
                raise self.err(key, f"array of {kv.count} entries is longer than the limit of {max_len}")
            arr = kv.value
            if arr is None:
                arr = load_array(kv)
                self.kv[key] = dataclasses.replace(kv, value=arr)
            if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
                i = int(np.argmax(arr < 0))
                raise self.err(key, f"entry [{i}] = {int(arr[i])} is negative")
            return arr
        return read


#: Constant name -> key after ``{arch}.``.
_SUFFIX = {
    "encoding": "engram.encoding", "layer_ids": "engram.layer_ids", "rows": "engram.rows",
    "compressed_vocab_size": "engram.compressed_vocab_size", "pad_id": "engram.pad_id",
    "token_map": "engram.token_map", "primes": "engram.primes", "multipliers": "engram.multipliers",
    "offsets": "engram.offsets", "head_count": "engram.head_count", "key_length": "engram.key_length",
    "max_ngram_size": "engram.max_ngram_size", "eps": EPS_KEY, "vocab_size": "vocab_size",
    "embedding_length": "embedding_length",
}


# ====================================================================== the steps
def _architecture(h: Header) -> str:
    kv = h.kv.get("general.architecture")
    if kv is None:
        raise FormatError(f"{h.path}: required metadata key general.architecture is missing")
    if kv.type != GGUFValueType.STRING:
        raise FormatError(f"{h.path}: general.architecture: has type {kv.describe_type()}, expected STRING "
                          f"(byte offset {kv.offset})")
    if not kv.value:
        raise FormatError(f"{h.path}: general.architecture: is empty (byte offset {kv.offset})")
    return kv.value


def _required(k: _Keys, table_layers: Sequence[int]) -> None:
    """Every :data:`REQUIRED` key present (and ``layer_ids``, unless table tensors name the layers), or one
    error naming each missing key and the Engram keys the file has.  A file with no Engram key of its
    architecture is left to :func:`_encoding` ("no Engram metadata")."""
    def has(name: str) -> bool:
        return any(f"{p}.{_SUFFIX[name]}" in k.kv for p in k.prefixes)

    have = sorted(key for key in k.kv if any(key.startswith(f"{p}.engram.") for p in k.prefixes))
    if not have:
        return
    missing = [n for n in REQUIRED if not has(n)]
    if not table_layers and not has("layer_ids"):
        missing.append("layer_ids")
    if missing:
        keys = [f"{k.arch}.{_SUFFIX[n]}" for n in missing]
        legacy = [f"{p}.{_SUFFIX[n]}" for n in missing for p in k.prefixes[1:]]
        also = f" (nor under {'their' if len(keys) > 1 else 'its'} legacy spelling {', '.join(legacy)})" if legacy \
            else ""
        raise FormatError(f"{k.h.path}: incomplete Engram metadata: required key{'s' if len(keys) > 1 else ''} "
                          f"{', '.join(keys)} {'are' if len(keys) > 1 else 'is'} missing{also} (the file has "
                          f"{len(have)} Engram key{'s' if len(have) != 1 else ''}: {', '.join(have)})")


def _encoding(k: _Keys) -> str:
    enc = k.value("encoding", k.string)
    if enc is None:
        others = sorted({key[: -len(".engram.encoding")] for key in k.kv if key.endswith(".engram.encoding")})
        if others:
            raise FormatError(f"{k.h.path}: general.architecture is {k.arch!r} but the Engram keys use prefix "
                              f"{others[0]!r} (key {others[0]}.engram.encoding)")
        raise FormatError(f"{k.h.path}: no Engram metadata: required key {k.arch}.engram.encoding is missing "
                          f"(general.architecture = {k.arch!r})")
    if enc != ENCODING:
        raise k.err(k.key("encoding"), f"row encoding {enc!r} is not supported (need {ENCODING!r})")
    key_length = k.value("key_length", k.integer())
    if key_length is None:
        k.derive("key_length", f"{ROW_VALUES} values a row of {ENCODING}")
    elif key_length != ROW_VALUES:
        raise k.err(k.key("key_length"), f"= {key_length} contradicts {k.key('encoding')} = {ENCODING} "
                                         f"({ROW_VALUES} values a row); run `{repair_command(k.h.path)}` to "
                                         f"rewrite the derived keys")
    return enc


def _layer_ids(k: _Keys, table_layers: Sequence[int]) -> Tuple[int, ...]:
    ids = k.value("layer_ids", k.int_array(max_len=1024))
    if ids is None:
        if not table_layers:
            raise k.missing("layer_ids", "; no table tensor blk.L.engram_embd.weight names a layer either")
        k.derive("layer_ids", "layers of the table tensors " +
                 ", ".join(f"blk.{L}.engram_embd.weight" for L in table_layers))
        return tuple(int(x) for x in table_layers)
    if ids.shape[0] == 0:
        raise k.err(k.key("layer_ids"), "is empty")
    return tuple(int(x) for x in ids)


def _rederive(k: _Keys, name: str) -> str:
    return (f"if {k.key(name)} is the wrong one, run `{repair_command(k.h.path)}` (it derives it from the "
            f"lengths and checks the tensors)")


def _orders_and_heads(k: _Keys, n_layers: int, primes: np.ndarray, mults: np.ndarray) -> Tuple[int, int]:
    """``(max_ngram, heads)`` from the keys, or derived from the lengths of primes and multipliers."""
    pk, mk = k.key("primes"), k.key("multipliers")
    n_m, n_p = int(mults.shape[0]), int(primes.shape[0])
    max_ngram = k.value("max_ngram_size", k.integer(lo=2, hi=64))
    if max_ngram is None:
        if n_m % n_layers or n_m // n_layers < 2:
            raise k.err(mk, f"has {n_m} entries: not {n_layers} layers{k.said('layer_ids')} x one multiplier per "
                            f"lookback of an n-gram order >= 2")
        max_ngram = n_m // n_layers
        k.derive("max_ngram_size", f"{mk} has {n_m} entries = {n_layers} layers x {max_ngram} lookbacks")
    elif n_m != n_layers * max_ngram:
        raise k.err(mk, f"has {n_m} entries, but {k.key('max_ngram_size')} = {max_ngram} needs {n_layers} layers "
                        f"x {max_ngram} lookbacks = {n_layers * max_ngram}; {_rederive(k, 'max_ngram_size')}")
    orders = max_ngram - 1
    heads = k.value("head_count", k.integer(lo=1, hi=1 << 12))
    if heads is None:
        if n_p % (n_layers * orders) or n_p == 0:
            raise k.err(pk, f"has {n_p} entries: not {n_layers} layers x {orders} n-gram orders (max n-gram "
                            f"{max_ngram}{k.said('max_ngram_size')}) x a whole number of heads")
        heads = n_p // (n_layers * orders)
        k.derive("head_count", f"{pk} has {n_p} entries = {n_layers} layers x {orders} orders x {heads} heads")
    elif n_p != n_layers * orders * heads:
        raise k.err(pk, f"has {n_p} entries, but {n_layers} layers x {orders} orders (max n-gram {max_ngram}"
                        f"{k.said('max_ngram_size')}) x {k.key('head_count')} = {heads} heads = "
                        f"{n_layers * orders * heads}; {_rederive(k, 'head_count')}")
    return max_ngram, heads


def _token_map(k: _Keys) -> Tuple[np.ndarray, int]:
    """The token map (int32, read-only) and the compressed vocabulary size (key or derived)."""
    tm = k.value("token_map", k.int_array(max_len=MAX_TOKEN_MAP))
    if tm is None:
        raise k.missing("token_map")
    tk = k.key("token_map")
    if tm.shape[0] == 0:
        raise k.err(tk, "is empty")
    top = int(tm.max())
    cvs = k.value("compressed_vocab_size", k.integer(lo=1, hi=2**31 - 1))
    if cvs is None:
        if top > 2**31 - 2:
            i = int(np.argmax(tm))
            raise k.err(tk, f"entry [{i}] = {top} is beyond any compressed vocabulary")
        cvs = top + 1
        k.derive("compressed_vocab_size", f"largest entry of {tk} + 1 (SPEC §3)")
    else:
        ck = k.key("compressed_vocab_size")
        over = np.flatnonzero(tm >= cvs)  # negatives were rejected when reading
        if over.size:
            i = int(over[0])
            raise k.err(tk, f"entry [{i}] = {int(tm[i])} is outside the compressed vocabulary [0, {cvs}) of {ck}")
        if top + 1 != cvs:
            raise k.err(ck, f"= {cvs}, but the largest entry of {tk} ({tm.shape[0]} entries) is {top}, so the "
                            f"compressed ids are 0..{top} and the size is {top + 1} (SPEC §3: every compressed id "
                            f"is the image of a token id); run `{repair_command(k.h.path)}` to rewrite the "
                            f"derived keys")
    vocab = k.value("vocab_size", k.integer())
    if vocab is not None and vocab != tm.shape[0]:
        raise k.err(tk, f"has {tm.shape[0]} entries but {k.key('vocab_size')} = {vocab}")
    toks = k.kv.get("tokenizer.ggml.tokens")
    if toks is not None and toks.count is not None and toks.count != tm.shape[0]:
        raise k.err(tk, f"has {tm.shape[0]} entries but tokenizer.ggml.tokens has {toks.count}")
    token_map = tm.astype(np.int32)
    token_map.setflags(write=False)
    return token_map, cvs


def _check_entries(k: _Keys, layer_ids: Tuple[int, ...], primes: np.ndarray, mults: np.ndarray, cvs: int,
                   columns: int, max_ngram: int) -> None:
    """SPEC §2 entry by entry, so an error names the entry: unique layer ids, primes >= 2, odd
    multipliers whose product with the compressed vocabulary size fits int64."""
    seen: Dict[int, int] = {}
    for i, lid in enumerate(layer_ids):
        if lid in seen:
            raise k.err(k.key("layer_ids"), f"entry [{i}] = {lid} repeats entry [{seen[lid]}]")
        seen[lid] = i
    p64 = primes.astype(np.uint64)
    bad = np.flatnonzero((p64 < 2) | (p64 > MAX_ROWS))
    if bad.size:
        i = int(bad[0])
        raise k.err(k.key("primes"), f"entry [{i}] (layer {layer_ids[i // columns]} column {i % columns}) = "
                                     f"{int(primes[i])} is outside [2, {MAX_ROWS}]: a column's bucket count is a "
                                     f"prime >= 2 whose rows fit uint32 row ids (SPEC §2)")
    for li, lid in enumerate(layer_ids):
        total = sum(int(x) for x in p64[li * columns:(li + 1) * columns])
        if p64.size >= (li + 1) * columns and total > MAX_ROWS:
            raise k.err(k.key("primes"), f"entries [{li * columns}, {(li + 1) * columns}) (layer {lid}) sum to "
                                         f"{total} rows, more than the {MAX_ROWS} that uint32 row ids address "
                                         f"(a layer's rows are the sum of its primes, SPEC §2)")
    for i, m in enumerate(int(x) for x in mults):
        where = f"entry [{i}] (layer {layer_ids[i // max_ngram]} lookback {i % max_ngram}) = {m}"
        if m % 2 == 0:
            raise k.err(k.key("multipliers"), f"{where} is even; multipliers are odd (SPEC §2)")
        if m * cvs > np.iinfo(np.int64).max:
            raise k.err(k.key("multipliers"), f"{where}: times compressed_vocab_size {cvs}"
                                              f"{k.said('compressed_vocab_size')} it overflows int64")


def _layout(k: _Keys, layer_ids: Tuple[int, ...], primes: np.ndarray, mults: np.ndarray, cvs: int, pad: int,
            heads: int, max_ngram: int) -> Layout:
    n = len(layer_ids)
    _check_entries(k, layer_ids, primes, mults, cvs, (max_ngram - 1) * heads, max_ngram)
    try:
        return Layout(layer_ids=layer_ids,
                      primes=primes.astype(np.uint64).reshape(n, (max_ngram - 1) * heads),
                      multipliers=mults.astype(np.uint64).reshape(n, max_ngram),
                      compressed_vocab_size=cvs, pad_id=pad, heads=heads, max_ngram=max_ngram)
    except LayoutError as exc:
        fld = str(exc).split(":", 1)[0]
        name = _LAYOUT_FIELD_NAMES.get(fld, fld)
        notes = k.said("compressed_vocab_size") if "compressed" in str(exc) and \
            k.sources["compressed_vocab_size"].derived and name != "compressed_vocab_size" else ""
        what = str(exc)[len(fld) + 2:] if str(exc).startswith(fld + ": ") else str(exc)
        raise FormatError(f"{k.h.path}: {k.key(name) if name in _SUFFIX else name}: {what}{notes}") from None


def _check_derived_arrays(k: _Keys, layout: Layout) -> None:
    """``rows`` and ``offsets``, when present, against the primes; derived otherwise."""
    pk = k.key("primes")
    rows = k.value("rows", k.int_array())
    if rows is None:
        k.derive("rows", f"sum of each layer's primes ({pk})")
    else:
        rk = k.key("rows")
        if rows.shape[0] != layout.layers:
            raise k.err(rk, f"has {rows.shape[0]} entries, but there are {layout.layers} layers "
                            f"{list(layout.layer_ids)}{k.said('layer_ids')}")
        for li, lid in enumerate(layout.layer_ids):
            if int(rows[li]) != int(layout.rows[li]):
                raise k.err(rk, f"entry [{li}] (layer {lid}) = {int(rows[li])}, but the primes of layer {lid} "
                                f"({pk}) sum to {int(layout.rows[li])}; run `{repair_command(k.h.path)}` to "
                                f"rewrite the derived keys (it checks the table tensors first)")
    offsets = k.value("offsets", k.int_array(max_len=1 << 16))
    if offsets is None:
        k.derive("offsets", f"running sum of each layer's primes ({pk})")
        return
    ok = k.key("offsets")
    n = layout.layers * layout.columns
    if offsets.shape[0] != n:
        raise k.err(ok, f"has {offsets.shape[0]} entries, expected {layout.layers} layers x {layout.columns} "
                        f"columns = {n}")
    o = offsets.astype(np.uint64).reshape(layout.layers, layout.columns)
    bad = np.argwhere(o != layout.offsets)
    if bad.size:
        li, c = (int(x) for x in bad[0])
        raise k.err(ok, f"entry [{li * layout.columns + c}] (layer {layout.layer_ids[li]} column {c}) = "
                        f"{int(o[li, c])}, but the primes ({pk}) put that column at row "
                        f"{int(layout.offsets[li, c])}; run `{repair_command(k.h.path)}` to rewrite the "
                        f"derived keys")


def _eps(k: _Keys) -> float:
    eps = k.value("eps", k.number)
    if eps is None:
        k.sources["eps"] = KeySource("default", f"{DEFAULT_EPS:g} (DeepSeek V4 rms_norm_eps; the file has no "
                                                f"{k.arch}.{EPS_KEY})")
        return DEFAULT_EPS
    if not (math.isfinite(eps) and 0.0 < eps < 1.0):
        raise k.err(k.key("eps"), f"epsilon {eps!r} must be finite and in (0, 1)")
    return eps


def engram_keys(h: Header, table_layers: Sequence[int] = (), *, derive_only: bool = False,
                prefer: Optional[str] = None) -> EngramKeys:
    """Read and cross-check the Engram keys of the first shard's header ``h``.

    Parameters
    ----------
    h : Header
        The parsed header of the file (or first shard) holding the metadata.
    table_layers : sequence of int
        Layers that have a table tensor (from which ``layer_ids`` is derived
        when the key is absent).
    derive_only : bool
        Ignore the derivable keys present (:data:`DERIVABLE` except
        ``layer_ids``) and derive them all: what ``engram repair`` writes.
    prefer : str, optional
        An architecture prefix of :data:`ARCHITECTURES`: where two spellings of
        a key disagree, take this one's value instead of raising.

    Raises
    ------
    FormatError
        Naming the key, the entry and both values (see the module docstring).
    """
    arch = _architecture(h)
    k = _Keys(h, arch, prefer, [n for n in DERIVABLE if n != "layer_ids"] if derive_only else ())
    _required(k, table_layers)
    enc = _encoding(k)
    layer_ids = _layer_ids(k, table_layers)
    primes = k.value("primes", k.int_array(max_len=1 << 16))
    if primes is None:
        raise k.missing("primes")
    mults = k.value("multipliers", k.int_array(max_len=1 << 16))
    if mults is None:
        raise k.missing("multipliers")
    max_ngram, heads = _orders_and_heads(k, len(layer_ids), primes, mults)
    token_map, cvs = _token_map(k)
    pad = k.value("pad_id", k.integer())
    if pad is None:
        raise k.missing("pad_id")
    layout = _layout(k, layer_ids, primes, mults, cvs, pad, heads, max_ngram)
    _check_derived_arrays(k, layout)
    eps = _eps(k)
    hidden = k.value("embedding_length", k.integer(lo=1, hi=1 << 20))
    return EngramKeys(arch, enc, layout, token_map, eps, hidden, dict(k.sources))


def family_keys(kv: Dict[str, KeyValue]) -> List[str]:
    """Every Engram key (and gate-epsilon key) of the family present in ``kv``."""
    out = []
    for key in kv:
        p, _, rest = key.partition(".")
        if p in ARCHITECTURES and (rest.startswith("engram.") or rest == EPS_KEY):
            out.append(key)
    return out
