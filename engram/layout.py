"""The Engram layout: primes, offsets and multipliers of the hashed tables (SPEC §2).

A layout says, for each Engram layer, how the n-gram hash maps onto rows of that
layer's table: one bucket space (a prime number of rows) per column, where a
column is one (n-gram order, head) pair, laid end to end from row 0, and one odd
multiplier per lookback position.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ._checks import need_int_array
from .errors import LayoutError

INT64_MAX = np.iinfo(np.int64).max
#: Row ids are ``uint32`` throughout the engine, so a table holds at most this many rows.
MAX_ROWS = 2**32 - 1

# Deterministic Miller-Rabin witnesses for every n < 3.3e24 (covers uint64).
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(n: int) -> bool:
    """Deterministic primality test for ``0 <= n < 2**64`` (Miller-Rabin)."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x == 1 or x == n - 1:
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _next_prime(n: int) -> int:
    """Smallest prime strictly greater than ``n``."""
    c = n + 1
    if c <= 2:
        return 2
    if c % 2 == 0:
        c += 1
    while not is_prime(c):
        c += 2
    return c


def _order_sizes(vocab_per_ngram, max_ngram: int) -> list[int]:
    """The target bucket count of each order ``2..max_ngram`` (one value for all, or one per order),
    checked: ``LayoutError`` naming ``vocab_per_ngram``."""
    orders = max_ngram - 1
    try:
        if isinstance(vocab_per_ngram, (int, np.integer)):
            sizes = [operator.index(vocab_per_ngram)] * orders
        else:
            sizes = [operator.index(v) for v in vocab_per_ngram]
    except TypeError:
        raise LayoutError(f"vocab_per_ngram: expected an integer or a sequence of integers, "
                          f"got {vocab_per_ngram!r:.200}") from None
    if len(sizes) != orders:
        raise LayoutError(f"vocab_per_ngram: expected {orders} sizes (orders 2..{max_ngram}), got {len(sizes)}")
    if any(s < 1 for s in sizes):
        raise LayoutError(f"vocab_per_ngram: sizes must be >= 1, got {sizes}")
    if any(s > MAX_ROWS for s in sizes):
        # every prime of the order exceeds the size, so the rows could not fit uint32 row ids
        raise LayoutError(f"vocab_per_ngram: sizes must be at most {MAX_ROWS} (rows are uint32 row ids), "
                          f"got {sizes}")
    return sizes


def _derive_primes(sizes: Sequence[int], n_layers: int, heads: int) -> np.ndarray:
    """uint64 ``[n_layers, orders * heads]``: for each layer, order and head the next prime above the
    order's size not taken yet (one ``seen`` set across layers, walked in order; SPEC §2)."""
    seen: set[int] = set()
    primes = np.zeros((n_layers, len(sizes) * heads), dtype=np.uint64)
    for li in range(n_layers):
        for o, size in enumerate(sizes):
            candidate = size - 1
            for h in range(heads):
                candidate = _next_prime(candidate)
                while candidate in seen:
                    candidate = _next_prime(candidate)
                seen.add(candidate)
                primes[li, o * heads + h] = candidate
    return primes


@dataclass(frozen=True, eq=False)
class Layout:
    """Constants of the Engram hash for every Engram layer (SPEC §2).

    Attributes
    ----------
    layer_ids : tuple[int, ...]
        Decoder layers that carry an Engram table, e.g. ``(1, 14)``.
    heads : int
        Heads per n-gram order (8 for V4.1 Flash).
    max_ngram : int
        Largest n-gram order (4): columns cover orders ``2..max_ngram``.
    compressed_vocab_size : int
        Size of the compressed vocabulary (99,092 for V4.1 Flash).
    pad_id : int
        Compressed id that replaces missing history (2).
    primes : numpy.ndarray
        uint64 ``[layers, columns]``, the bucket count of each column; column ``c``
        has n-gram order ``c // heads + 2``.
    multipliers : numpy.ndarray
        uint64 ``[layers, max_ngram]``, odd multiplier per lookback ``k = 0..max_ngram-1``.
    offsets : numpy.ndarray
        uint64 ``[layers, columns]``, first row of each column (derived).
    rows : numpy.ndarray
        uint64 ``[layers]``, rows of each layer's table (sum of its primes, derived).
    """

    layer_ids: tuple[int, ...]
    primes: np.ndarray
    multipliers: np.ndarray
    compressed_vocab_size: int
    pad_id: int
    heads: int = 8
    max_ngram: int = 4
    offsets: np.ndarray = field(init=False, repr=False)
    rows: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            layer_ids = tuple(int(x) for x in self.layer_ids)
        except (TypeError, ValueError):
            raise LayoutError(f"layer_ids: expected a sequence of integers, got {self.layer_ids!r}") from None
        object.__setattr__(self, "layer_ids", layer_ids)
        for name in ("heads", "max_ngram", "compressed_vocab_size", "pad_id"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise LayoutError(f"{name}: expected an integer, got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.heads < 1:
            raise LayoutError(f"heads: must be >= 1, got {self.heads}")
        if self.max_ngram < 2:
            raise LayoutError(f"max_ngram: must be >= 2, got {self.max_ngram}")
        L = len(layer_ids)
        if L == 0:
            raise LayoutError("layer_ids: a layout needs at least one Engram layer")
        primes = need_int_array("primes", self.primes, (L, self.columns), np.uint64, error=LayoutError)
        mults = need_int_array("multipliers", self.multipliers, (L, self.max_ngram), np.uint64, error=LayoutError)
        object.__setattr__(self, "primes", primes)
        object.__setattr__(self, "multipliers", mults)
        offsets = np.zeros_like(primes)
        # Python ints: no silent wrap-around, checked by validate().
        rows = []
        for li in range(L):
            acc = 0
            for c in range(self.columns):
                offsets[li, c] = min(acc, 2**64 - 1)
                acc += int(primes[li, c])
            rows.append(acc)
        offsets.setflags(write=False)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "_rows_exact", tuple(rows))
        r = np.array([min(x, 2**64 - 1) for x in rows], dtype=np.uint64)
        r.setflags(write=False)
        object.__setattr__(self, "rows", r)
        self.validate()

    # ------------------------------------------------------------------ shape
    @property
    def columns(self) -> int:
        """Columns per layer: ``(max_ngram - 1) * heads`` (24 for V4.1 Flash)."""
        return (self.max_ngram - 1) * self.heads

    @property
    def layers(self) -> int:
        """Number of Engram layers."""
        return len(self.layer_ids)

    def order_of_column(self, column: int) -> int:
        """n-gram order (2..max_ngram) of ``column``."""
        return column // self.heads + 2

    def layer_index(self, layer_id: int) -> int:
        """Position of ``layer_id`` in :attr:`layer_ids`; ``LayoutError`` if absent."""
        try:
            return self.layer_ids.index(int(layer_id))
        except ValueError:
            raise LayoutError(f"layer {layer_id} has no Engram table (layers: {list(self.layer_ids)})") from None

    # ------------------------------------------------------------- validation
    def validate(self) -> "Layout":
        """Check every invariant of SPEC §2 and return ``self``.

        Raises
        ------
        LayoutError
            Naming the broken field (and layer/column): duplicate layer ids, a
            prime below 2, an even multiplier, ``multiplier * compressed_vocab_size``
            outside int64, rows that do not fit uint32 row ids, ``pad_id`` outside
            the compressed vocabulary.
        """
        if len(set(self.layer_ids)) != len(self.layer_ids):
            raise LayoutError(f"layer_ids: duplicate layer ids in {list(self.layer_ids)}")
        if any(x < 0 for x in self.layer_ids):
            raise LayoutError(f"layer_ids: negative layer id in {list(self.layer_ids)}")
        if self.compressed_vocab_size < 1:
            raise LayoutError(f"compressed_vocab_size: must be >= 1, got {self.compressed_vocab_size}")
        if not 0 <= self.pad_id < self.compressed_vocab_size:
            raise LayoutError(
                f"pad_id: {self.pad_id} is outside the compressed vocabulary [0, {self.compressed_vocab_size})"
            )
        for li, lid in enumerate(self.layer_ids):
            for c in range(self.columns):
                p = int(self.primes[li, c])
                if p < 2:
                    raise LayoutError(f"primes: layer {lid} column {c} has {p}, must be a prime >= 2")
            for k in range(self.max_ngram):
                m = int(self.multipliers[li, k])
                if m % 2 == 0:
                    raise LayoutError(f"multipliers: layer {lid} lookback {k} is even ({m})")
                if m * self.compressed_vocab_size > INT64_MAX:
                    raise LayoutError(
                        f"multipliers: layer {lid} lookback {k}: {m} x compressed_vocab_size "
                        f"{self.compressed_vocab_size} overflows int64"
                    )
            if self._rows_exact[li] > MAX_ROWS:
                raise LayoutError(
                    f"rows: layer {lid} has {self._rows_exact[li]} rows, more than uint32 row ids hold"
                )
        return self

    # ------------------------------------------------------------- derivation
    @classmethod
    def derive(
        cls,
        vocab_per_ngram: int | Sequence[int],
        layer_ids: Sequence[int],
        heads: int = 8,
        max_ngram: int = 4,
        *,
        compressed_vocab_size: int,
        pad_id: int,
        seed: int = 0,
    ) -> "Layout":
        """Derive primes and multipliers as the released model does (SPEC §2).

        Parameters
        ----------
        vocab_per_ngram : int or sequence of int
            Target bucket count per n-gram order (16,000,000 for V4.1 Flash); one
            value for all orders or one per order ``2..max_ngram``.
        layer_ids : sequence of int
            Engram layers, walked in the given order (one ``seen`` set across layers).
        heads, max_ngram : int
            Heads per order and largest order.
        compressed_vocab_size, pad_id : int
            Compressed vocabulary size and pad id.
        seed : int
            Multiplier seed (0 for the released model); layer ``L`` draws from
            ``numpy.random.default_rng(seed + 10007 * L)``.

        Raises
        ------
        LayoutError
            On non-positive sizes or any invariant broken by the result.
        """
        for name, v in (("heads", heads), ("max_ngram", max_ngram), ("compressed_vocab_size", compressed_vocab_size),
                        ("pad_id", pad_id), ("seed", seed)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise LayoutError(f"{name}: expected an integer, got {v!r}")
        if heads < 1:
            raise LayoutError(f"heads: must be >= 1, got {heads}")
        if max_ngram < 2:
            raise LayoutError(f"max_ngram: must be >= 2, got {max_ngram}")
        if seed < 0:
            raise LayoutError(f"seed: must be >= 0, got {seed}")
        try:
            layer_ids = [operator.index(x) for x in layer_ids]
        except TypeError:
            raise LayoutError(f"layer_ids: expected a sequence of integers, got {layer_ids!r:.200}") from None
        if any(x < 0 for x in layer_ids):
            raise LayoutError(f"layer_ids: negative layer id in {layer_ids}")
        sizes = _order_sizes(vocab_per_ngram, max_ngram)
        if compressed_vocab_size < 1:
            raise LayoutError(f"compressed_vocab_size: must be >= 1, got {compressed_vocab_size}")
        primes = _derive_primes(sizes, len(layer_ids), heads)
        bound = max(1, (int(INT64_MAX) // compressed_vocab_size) // 2)
        mults = np.zeros((len(layer_ids), max_ngram), dtype=np.uint64)
        for li, lid in enumerate(layer_ids):
            r = np.random.default_rng(seed + 10007 * int(lid)).integers(0, bound, size=max_ngram, dtype=np.int64)
            mults[li] = (2 * r.astype(np.uint64) + 1)
        return cls(
            layer_ids=tuple(layer_ids),
            primes=primes,
            multipliers=mults,
            compressed_vocab_size=compressed_vocab_size,
            pad_id=pad_id,
            heads=heads,
            max_ngram=max_ngram,
        )

    @classmethod
    def deepseek_v41_flash(cls, scale: float = 1.0) -> "Layout":
        """The released DeepSeek V4.1 Flash layout (SPEC §2).

        ``scale`` shrinks the per-order bucket size (``16,000,000 * scale``) for
        test tables of any size; every other constant stays real.

        Raises
        ------
        LayoutError
            ``scale`` is not a finite number > 0, or makes the tables too large
            for uint32 row ids.
        """
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
                or not math.isfinite(float(scale)) or scale <= 0:
            raise LayoutError(f"scale: must be a finite number > 0, got {scale!r}")
        size = max(2, int(round(16_000_000 * scale)))
        return cls.derive(size, (1, 14), heads=8, max_ngram=4,
                          compressed_vocab_size=99_092, pad_id=2, seed=0)

    # ---------------------------------------------------------------- helpers
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return (
            self.layer_ids == other.layer_ids
            and self.heads == other.heads
            and self.max_ngram == other.max_ngram
            and self.compressed_vocab_size == other.compressed_vocab_size
            and self.pad_id == other.pad_id
            and np.array_equal(self.primes, other.primes)
            and np.array_equal(self.multipliers, other.multipliers)
        )

    def __hash__(self) -> int:
        return hash((self.layer_ids, self.heads, self.max_ngram, self.compressed_vocab_size,
                     self.pad_id, self.primes.tobytes(), self.multipliers.tobytes()))

    def to_dict(self) -> dict:
        """A JSON-ready description (lists of ints)."""
        return {
            "layer_ids": list(self.layer_ids),
            "heads": self.heads,
            "max_ngram": self.max_ngram,
            "columns": self.columns,
            "compressed_vocab_size": self.compressed_vocab_size,
            "pad_id": self.pad_id,
            "rows": [int(x) for x in self.rows],
            "primes": self.primes.astype(int).tolist(),
            "offsets": self.offsets.astype(int).tolist(),
            "multipliers": [[int(x) for x in row] for row in self.multipliers],
        }
