"""Argument checks shared by the engine's entry points: one wording, one rule each.

Every check raises an :class:`~engram.errors.EngramError` kind (``ArgumentError``
unless the caller names another) before anything is written, and names the
argument, the expected dtype/shape and what was given.  Shapes print as
``[d0, d1, ...]`` everywhere.

The mask rule (issue 17): a mask is a 1-D array (or sequence) with one flag a
token, either ``bool`` or integers that are all 0 or 1 (an attention mask).
Anything else, floats included, is refused naming the first bad entry.
:func:`as_mask` is the one implementation; ``Hasher.hash``, ``Session.prefill``,
``Session.apply`` and ``gated_add`` all call it.

The fields of settings dataclasses (``engram.synth.Writing``, the simulator's run
settings) are checked by :func:`setting_int`, :func:`setting_number`,
:func:`setting_bool`, :func:`setting_str` and :func:`setting_choice`, in one
wording: ``Class.field = value: expected ...``; :func:`settings_from` builds
one from a mapping, refusing a key that is not a field.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping
from numbers import Real
from typing import Any, Optional, Tuple, Type, Union

import numpy as np

from .errors import ArgumentError, EngramError, MaskError

__all__ = [
    "shape_str", "need_array", "need_output", "need_contiguous", "no_overlap", "as_mask", "need_eps",
    "need_int", "need_int_array", "need_finite", "need_layer", "setting_bool", "setting_choice", "setting_int",
    "setting_number", "setting_str", "settings_from",
]

DTypes = Union[np.dtype, type, Tuple[Union[np.dtype, type], ...]]


def shape_str(a) -> str:
    """``[d0, d1, ...]`` of an array or a shape tuple."""
    shape = a.shape if hasattr(a, "shape") else tuple(a)
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _dtype_names(dtype: DTypes) -> str:
    kinds = dtype if isinstance(dtype, tuple) else (dtype,)
    return " or ".join(np.dtype(k).name for k in kinds)


def need_array(name: str, a, dtype: DTypes, ndim: int, error: Type[EngramError] = ArgumentError) -> np.ndarray:
    """``a`` itself, if it is a numpy array of ``dtype`` (one or a tuple) with ``ndim`` dimensions."""
    if not isinstance(a, np.ndarray):
        raise error(f"{name} must be a numpy.ndarray of {_dtype_names(dtype)}, got {type(a).__name__}")
    kinds = dtype if isinstance(dtype, tuple) else (dtype,)
    if a.dtype not in [np.dtype(k) for k in kinds]:
        raise error(f"{name} must be {_dtype_names(dtype)}, got {a.dtype} with shape {shape_str(a)}")
    if a.ndim != ndim:
        raise error(f"{name} must have {ndim} dimensions, got shape {shape_str(a)}")
    return a


def need_contiguous(name: str, a: np.ndarray, hint: str = "") -> None:
    """``a`` must be C-contiguous (``hint`` says how to get there)."""
    if not a.flags.c_contiguous:
        raise ArgumentError(f"{name} (shape {shape_str(a)}) must be C-contiguous{hint}")


def need_output(name: str, a: np.ndarray) -> None:
    """An output array: C-contiguous and writable."""
    for bad, why in ((not a.flags.c_contiguous, "it is not C-contiguous"), (not a.flags.writeable, "it is read-only")):
        if bad:
            raise ArgumentError(f"{name} (shape {shape_str(a)}) must be C-contiguous and writable; {why}")


def no_overlap(name: str, out: np.ndarray, **others: Optional[np.ndarray]) -> None:
    """``out`` shares no memory with any of ``others`` (``None`` entries are skipped)."""
    for other_name, other in others.items():
        if other is not None and out.size and other.size and np.may_share_memory(out, other):
            raise ArgumentError(f"{name} (shape {shape_str(out)}) overlaps {other_name} (shape {shape_str(other)})")


def as_mask(mask, n: int, name: str = "mask") -> np.ndarray:
    """The mask rule: ``mask`` as a C-contiguous uint8 ``[n]`` array of 0/1 (1 = text).

    Accepts a bool array or sequence, or integers (any integer dtype) that are
    all 0 or 1.  Raises :class:`~engram.errors.MaskError` (an ``ArgumentError``)
    for another length or number of dimensions, a float, string or object
    entry (an object array is refused even when it holds Python bools:
    ``np.array([True] * n, dtype=object)``), or an integer other than 0/1,
    naming the first bad entry.
    """
    m = mask if isinstance(mask, np.ndarray) else np.asarray(mask)
    if m.shape != (n,):
        raise MaskError(f"{name} must have shape [{n}] (one flag a token), got {shape_str(m)}")
    if m.dtype == np.bool_:
        return np.ascontiguousarray(m).view(np.uint8)
    if m.size == 0:  # an empty list comes as float64
        return np.zeros(0, np.uint8)
    if m.dtype.kind in "iu":
        bad = np.flatnonzero((m != 0) & (m != 1))
        if bad.size:
            i = int(bad[0])
            raise MaskError(f"{name}[{i}] = {_entry(m, i)}; a mask holds bool or 0/1 integers")
        return np.ascontiguousarray(m, dtype=np.uint8)
    kind = " (Python objects, not a bool or integer array)" if m.dtype == object else ""
    raise MaskError(f"{name}[0] = {_entry(m, 0)}: a mask holds bool or 0/1 integers, got dtype {m.dtype}{kind}")


def _entry(a: np.ndarray, i: int) -> str:
    """``repr`` of ``a[i]`` as a Python value (an object array holds Python objects already), at most 60 chars."""
    v = a[i]
    text = repr(v.item() if isinstance(v, np.generic) else v)
    return text if len(text) <= 60 else text[:57] + "..."


def need_eps(eps, name: str = "eps") -> float:
    """``eps`` as a float: a real number, finite and ``>= 0`` (the gate's RMS-norm epsilon, SPEC §7)."""
    if isinstance(eps, bool) or not isinstance(eps, Real) or not math.isfinite(float(eps)) or float(eps) < 0:
        raise ArgumentError(f"{name} must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _whole(v) -> Optional[int]:
    """``v`` as an int when it is a whole number (an int or a numpy integer; not a bool, a float or a string),
    else None: the rule of :func:`need_int` and :func:`setting_int`."""
    if isinstance(v, (bool, np.bool_)):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def need_int(name: str, v, lo: Optional[int] = None, hi: Optional[int] = None,
             error: Type[EngramError] = ArgumentError) -> int:
    """``v`` as an int (bool refused) within ``[lo, hi]`` (either bound optional)."""
    x = _whole(v)
    if x is None:
        raise error(f"{name} must be an integer, got {v!r:.100}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        rng = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise error(f"{name} must be an integer {rng}, got {x}")
    return x


def need_layer(layer_id, layer_ids, name: str = "layer") -> int:
    """``layer_id`` as an int (bool refused) that is one of ``layer_ids`` (the model's Engram layers);
    :class:`ArgumentError` otherwise."""
    lid = need_int(name, layer_id)
    if lid not in tuple(layer_ids):
        raise ArgumentError(f"{name} {lid} has no Engram table (layers: {list(layer_ids)})")
    return lid


def need_int_array(name: str, value, shape: Tuple[int, ...], dtype, error: Type[EngramError] = ArgumentError
                   ) -> np.ndarray:
    """``value`` as a read-only array of ``dtype`` and ``shape``, every entry in ``dtype``'s range."""
    try:
        arr = np.asarray(value)
    except Exception as exc:  # pragma: no cover - numpy raises many kinds
        raise error(f"{name}: cannot be read as an integer array ({exc})") from None
    if arr.dtype.kind not in "iu":
        raise error(f"{name}: expected integers, got dtype {arr.dtype}")
    if arr.shape != tuple(shape):
        raise error(f"{name}: expected shape {tuple(shape)}, got {arr.shape}")
    info = np.iinfo(dtype)
    if arr.size:
        lo = int(arr.min())
        hi = int(arr.max())
        if lo < info.min or hi > info.max:
            i = int(np.argmax(arr.reshape(-1) < info.min) if lo < info.min else np.argmax(arr.reshape(-1) > info.max))
            raise error(f"{name}: entry [{i}] = {int(arr.reshape(-1)[i])}; values must lie in "
                        f"[{info.min}, {info.max}]")
    out = arr.astype(dtype)
    out.setflags(write=False)
    return out


def need_finite(name: str, a: np.ndarray, axes: Tuple[str, ...], mask: Optional[np.ndarray] = None,
                what: str = "") -> None:
    """Every value of float array ``a`` is finite (tokens ``mask`` turns off are not looked at).

    ``a`` is ``[T, ...]`` with one name a dimension in ``axes`` (``("token", "stream",
    "column")``); ``mask`` a uint8 ``[T]`` from :func:`as_mask`.  Raises
    :class:`~engram.errors.ArgumentError` naming ``name``, the index of the first
    non-finite value in C order along ``axes`` and the value, and ``what`` (what is
    left untouched).  Cost: one ``numpy.isfinite`` pass over ``a`` and one
    ``all``; the index is looked for only on failure.
    """
    ok = np.isfinite(a)
    if ok.all():
        return
    bad = ~ok
    if mask is not None:
        bad &= mask.astype(bool).reshape((-1,) + (1,) * (a.ndim - 1))
    flat = np.flatnonzero(bad)
    if flat.size == 0:
        return
    idx = np.unravel_index(int(flat[0]), a.shape)
    where = ", ".join(f"{ax} {int(i)}" for ax, i in zip(axes, idx))
    raise ArgumentError(f"{name}[{', '.join(str(int(i)) for i in idx)}] = {float(a[idx])} ({where}): "
                        f"{name} must be finite{what}")


# ------------------------------------------------------------------ fields of settings objects
# One wording for every settings dataclass of the engine and the simulator: ``Class.field = value: expected
# ...``, so a bad field is named with the class it belongs to and the value given.

def _shown(value) -> str:
    """``repr(value)`` as a message shows it: at most 60 characters."""
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def setting_int(where: str, value, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """``value`` as an int when it is a whole number -- an int or a numpy integer, not a bool, a float or a
    string -- in ``[lo, hi]`` (either bound optional); ``where`` names the field (``"EngineRun.drives"``).

    Raises
    ------
    ArgumentError
        ``"EngineRun.drives = 'x': expected a whole number >= 1"``.
    """
    rng = "" if lo is None and hi is None else \
        f" >= {lo}" if hi is None else f" <= {hi}" if lo is None else f" in [{lo}, {hi}]"
    x = _whole(value)
    if x is None or (lo is not None and x < lo) or (hi is not None and x > hi):
        raise ArgumentError(f"{where} = {_shown(value)}: expected a whole number{rng}")
    return x


def setting_number(where: str, value, lo: Optional[float] = None, hi: Optional[float] = None, *,
                   above: bool = False, below: bool = False, finite: bool = True) -> float:
    """``value`` as a float when it is a real number (an int or a float, numpy's too; not a bool or a string),
    not NaN, finite unless ``finite=False``, ``>= lo`` (``> lo`` with ``above``) and ``<= hi`` (``< hi`` with
    ``below``), either bound optional.

    Raises
    ------
    ArgumentError
        ``"SearchRun.connect_timeout = 0.0: expected a finite number > 0"``.
    """
    kind = "a finite number" if finite else "a number"
    if lo is not None and hi is not None:
        want = f"{kind} in {'(' if above else '['}{lo:g}, {hi:g}{')' if below else ']'}"
    elif lo is not None:
        want = f"{kind} {'>' if above else '>='} {lo:g}"
    elif hi is not None:
        want = f"{kind} {'<' if below else '<='} {hi:g}"
    else:
        want = kind
    ok = not isinstance(value, (bool, np.bool_)) and isinstance(value, Real)
    try:
        x = float(value) if ok else math.nan
    except OverflowError:  # an integer past a float's range: infinite
        x = math.inf if value > 0 else -math.inf
    ok = ok and not math.isnan(x) and (math.isfinite(x) or not finite)
    ok = ok and (lo is None or (x > lo if above else x >= lo)) and (hi is None or (x < hi if below else x <= hi))
    if not ok:
        raise ArgumentError(f"{where} = {_shown(value)}: expected {want}")
    return x


def setting_bool(where: str, value) -> bool:
    """``value`` when it is True or False (a numpy bool too), not a number or a string.

    Raises
    ------
    ArgumentError
        ``"Writing.sync = 'yes': expected True or False"``.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{where} = {_shown(value)}: expected True or False")
    return bool(value)


def setting_str(where: str, value, *, empty: bool = True) -> str:
    """``value`` when it is a string (a non-empty one unless ``empty``).

    Raises
    ------
    ArgumentError
        ``"SearchRun.desc = 3: expected a string"``.
    """
    if not isinstance(value, str) or (not empty and not value):
        raise ArgumentError(f"{where} = {_shown(value)}: expected a {'' if empty else 'non-empty '}string")
    return value


def setting_choice(where: str, value, choices) -> str:
    """``value`` when it is one of the strings ``choices``.

    Raises
    ------
    ArgumentError
        ``"CounterpartReads.backend = 'aio': expected one of 'auto', 'io_uring', 'pread', 'serial'"``.
    """
    if not isinstance(value, str) or value not in tuple(choices):
        raise ArgumentError(f"{where} = {_shown(value)}: expected one of {', '.join(map(repr, choices))}")
    return value


def settings_from(cls: type, values: Mapping[str, Any], where: str = ""):
    """``cls(**values)`` for a settings dataclass ``cls``, built from a mapping (a study's table, a document,
    keyword overrides): a key that is not a field of ``cls`` is refused naming it and the fields there are,
    instead of the constructor's plain ``TypeError``; ``where`` (the file, the table) leads the message.

    Raises
    ------
    ArgumentError
        ``values`` is not a mapping, or holds an unknown key; whatever ``cls`` raises for a bad value.
    """
    lead = f"{where}: " if where else ""
    if not isinstance(values, Mapping):
        raise ArgumentError(f"{lead}{cls.__name__} settings must be a mapping of its fields, got {_shown(values)}")
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    bad = sorted(str(k) for k in values if k not in known)
    if bad:
        raise ArgumentError(f"{lead}{cls.__name__} has no field {bad[0]!r} (its fields: {', '.join(known)})")
    return cls(**values)
