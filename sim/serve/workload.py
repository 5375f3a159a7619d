"""The serving workload: requests arriving open-loop, each with a prompt and an output length (issue 16.1).

A :class:`Workload` says how requests arrive and how long they are; :func:`make_requests` draws them
(:class:`Requests`, arrays), reproducibly from one seed.

Arrivals (``arrivals``)
    ``poisson`` -- exponential gaps of mean ``1 / rate``; ``gamma`` -- gamma gaps of mean ``1 / rate``
    and coefficient of variation ``cv`` (burstiness: cv 1 is Poisson, larger is burstier; Vidur's
    gamma interval generator); ``constant`` -- one request every ``1 / rate`` seconds; ``replay`` --
    the ``arrival_s`` timestamps of a requests file, scaled so that their mean rate is ``rate``
    (``rate = 0`` keeps them as recorded).

Lengths (``prompt_tokens``, ``output_tokens``; :class:`Lengths`)
    ``fixed:n=512`` (or just ``512``), ``uniform:min=16,max=2048``,
    ``lognormal:mean=512,cv=1,min=16,max=16384``, ``exponential:mean=256,min=1``, or ``file``: the
    lengths of a requests file (a prompt's tokens through the real DeepSeek V4 tokenizer; an
    output's ``output_tokens`` field).  Every length, drawn or read, is at most
    :data:`sim.core.limits.MAX_REQUEST_TOKENS` (2^20 tokens, a 1M-token context window): a spelling or a
    file past it is refused before anything is drawn.

Requests file (``requests``)
    JSON lines in the shape of the packaged ``sim/data/prompts.jsonl`` (``shared:prompts.jsonl``) -- ``{"id": ..., "prompt": "..."}`` --
    with optional ``arrival_s`` (seconds, for ``replay``), ``output_tokens`` and ``prompt_tokens``
    (a length without a text: the prompt is then a stretch of the row-source text).  Without
    ``replay`` the requests cycle through the file in order.  A requests file is read only for
    ``replay`` or ``file`` lengths: naming one that nothing reads is refused (it would be ignored).

Common random numbers: every draw of request ``i`` (its gap at unit rate, its lengths, where its
text starts) comes from its own stream in fixed blocks of :data:`BLOCK` requests, so request ``i``
is the same whatever the rate and the duration; the rate only scales the arrival times.  A
capacity search over the rate therefore compares the same requests at every load.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from sim.core.io import read_jsonl
from sim.core.limits import MAX_REQUEST_TOKENS, check_memory, check_seed
from ..trace.tokens import encode_text

__all__ = ["ARRIVALS", "BLOCK", "LENGTH_KINDS", "Lengths", "RequestFile", "Requests", "Workload", "make_requests",
           "read_request_file"]

#: Arrival processes.
ARRIVALS = ("poisson", "gamma", "constant", "replay")
#: Length distributions.
LENGTH_KINDS = ("fixed", "uniform", "lognormal", "exponential", "file")
#: Requests drawn per block of every random stream (request ``i``'s draws do not depend on how many are drawn).
BLOCK = 4096
#: Bytes one request takes in a serving run, planned before the requests are drawn (its drawn figures and
#: gaps, and its state and records in the simulation): ``rate x duration x BYTES_PER_REQUEST`` must pass
#: :func:`sim.core.limits.check_memory`.
BYTES_PER_REQUEST = 1024
#: The default prompt lengths: a chat/RAG mix (lognormal, mean 512 tokens).
DEFAULT_PROMPT_TOKENS = "lognormal:mean=512,cv=1,min=16,max=16384"
#: The default output lengths (lognormal, mean 256 tokens).
DEFAULT_OUTPUT_TOKENS = "lognormal:mean=256,cv=1,min=2,max=4096"


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts (see the module docstring for the spellings).

    Attributes
    ----------
    kind : str
        One of :data:`LENGTH_KINDS`.
    mean, cv : float
        Mean and coefficient of variation (lognormal; exponential has cv 1; fixed uses ``mean``).
    lo, hi : int
        Draws are clipped to ``[lo, hi]`` (uniform draws between them).

    Raises
    ------
    ArgumentError
        An unknown kind or key, a mean below 1, ``lo > hi``, ``lo < 1``.
    """

    kind: str
    mean: float = 0.0
    cv: float = 1.0
    lo: int = 1
    hi: int = MAX_REQUEST_TOKENS

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ArgumentError(f"lengths: unknown kind {self.kind!r} ({', '.join(LENGTH_KINDS)})")
        if not 1 <= self.lo <= self.hi:
            raise ArgumentError(f"lengths {self.spec()!r}: need 1 <= min <= max, got {self.lo}, {self.hi}")
        if self.kind in ("fixed", "lognormal", "exponential") and not (self.mean >= 1 and math.isfinite(self.mean)):
            raise ArgumentError(f"lengths {self.spec()!r}: the mean must be >= 1 token")
        if max(self.hi, self.mean) > MAX_REQUEST_TOKENS:
            raise ArgumentError(f"lengths {self.spec()!r}: {max(self.hi, int(self.mean))} tokens is past the longest "
                                f"request, {MAX_REQUEST_TOKENS} tokens (sim.core.limits.MAX_REQUEST_TOKENS: a 1M-token "
                                "context window)")
        if self.kind == "lognormal" and not (self.cv >= 0 and math.isfinite(self.cv)):
            raise ArgumentError(f"lengths {self.spec()!r}: cv must be >= 0")

    @classmethod
    def parse(cls, spec: Union[str, int, "Lengths"]) -> "Lengths":
        """From ``"fixed:n=512"``, ``"512"``, ``"uniform:min=..,max=.."``, ``"lognormal:mean=..,cv=..[,min,max]"``,
        ``"exponential:mean=..[,min,max]"`` or ``"file"``.

        Raises
        ------
        ArgumentError
            Another spelling (names it and the accepted ones).
        """
        if isinstance(spec, Lengths):
            return spec
        s = str(spec).strip()
        if s.isdigit():
            return cls("fixed", float(s), 0.0, int(s), int(s))
        kind, _, rest = s.partition(":")
        if kind == "file":
            return cls("file")
        vals: Dict[str, float] = {}
        for part in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, v = part.partition("=")
            try:
                if not eq:
                    raise ValueError
                val = float(v)
            except ValueError:
                raise ArgumentError(f"lengths {s!r}: expected key=value items, got {part!r}") from None
            if key.strip() in vals:
                raise ArgumentError(f"lengths {s!r}: key {key.strip()!r} given twice")
            vals[key.strip()] = val
        allowed = {"fixed": {"n"}, "uniform": {"min", "max"}, "lognormal": {"mean", "cv", "min", "max"},
                   "exponential": {"mean", "min", "max"}}.get(kind)
        if allowed is None:
            raise ArgumentError(f"lengths {s!r}: unknown kind {kind!r} (fixed:n=N, uniform:min=A,max=B, "
                                "lognormal:mean=M,cv=C[,min=A,max=B], exponential:mean=M[,min,max], file)")
        bad = set(vals) - allowed
        if bad:
            raise ArgumentError(f"lengths {s!r}: unknown key {sorted(bad)[0]!r} for {kind} ({', '.join(sorted(allowed))})")
        if kind == "fixed":
            if "n" not in vals:
                raise ArgumentError(f"lengths {s!r}: fixed needs n=N")
            n = int(vals["n"])
            return cls("fixed", float(n), 0.0, max(n, 1), max(n, 1))
        if kind == "uniform":
            if "min" not in vals or "max" not in vals:
                raise ArgumentError(f"lengths {s!r}: uniform needs min= and max=")
            lo, hi = int(vals["min"]), int(vals["max"])
            return cls("uniform", (lo + hi) / 2, 0.0, lo, hi)
        if "mean" not in vals:
            raise ArgumentError(f"lengths {s!r}: {kind} needs mean=M")
        return cls(kind, vals["mean"], vals.get("cv", 1.0), int(vals.get("min", 1)),
                   int(vals.get("max", MAX_REQUEST_TOKENS)))

    def spec(self) -> str:
        """The spelling :meth:`parse` reads back."""
        if self.kind == "file":
            return "file"
        if self.kind == "fixed":
            return f"fixed:n={int(self.mean)}"
        if self.kind == "uniform":
            return f"uniform:min={self.lo},max={self.hi}"
        cv = f",cv={self.cv:g}" if self.kind == "lognormal" else ""
        return f"{self.kind}:mean={self.mean:g}{cv},min={self.lo},max={self.hi}"

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """int64 ``[size]`` token counts in ``[lo, hi]`` (not for ``file``)."""
        if self.kind == "fixed":
            x = np.full(size, self.mean)
        elif self.kind == "uniform":
            x = rng.integers(self.lo, self.hi + 1, size).astype(np.float64)
        elif self.kind == "exponential":
            x = rng.exponential(self.mean, size)
        elif self.cv == 0:
            x = np.full(size, self.mean)
        else:
            s2 = math.log1p(self.cv * self.cv)
            x = rng.lognormal(math.log(self.mean) - s2 / 2, math.sqrt(s2), size)
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)


@dataclass(frozen=True)
class Workload:
    """How requests arrive and how long they are (see the module docstring).

    Attributes
    ----------
    rate : float
        Requests per second (> 0; for ``replay`` the mean rate the timestamps are scaled to, 0: as recorded).
    duration : float
        Seconds of arrivals (> 0): requests arrive in ``[0, duration)``.
    arrivals : str
        One of :data:`ARRIVALS`.
    cv : float
        Coefficient of variation of the gaps of ``gamma`` arrivals (> 0).
    prompt_tokens, output_tokens : str or Lengths
        Length distributions (:class:`Lengths`).
    requests : str
        A requests file (JSONL), or ``""``.

    Raises
    ------
    ArgumentError
        An unknown arrival process, a rate, duration or cv out of range, ``file`` lengths or ``replay``
        without a requests file.
    """

    rate: float
    duration: float = 60.0
    arrivals: str = "poisson"
    cv: float = 1.0
    prompt_tokens: Union[str, Lengths] = DEFAULT_PROMPT_TOKENS
    output_tokens: Union[str, Lengths] = DEFAULT_OUTPUT_TOKENS
    requests: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_tokens", Lengths.parse(self.prompt_tokens))
        object.__setattr__(self, "output_tokens", Lengths.parse(self.output_tokens))
        if self.arrivals not in ARRIVALS:
            raise ArgumentError(f"arrivals: unknown process {self.arrivals!r} ({', '.join(ARRIVALS)})")
        if not (math.isfinite(self.rate) and (self.rate > 0 or (self.arrivals == "replay" and self.rate == 0))):
            raise ArgumentError(f"rate = {self.rate!r} must be > 0 requests/s (0 only for replay: as recorded)")
        if not (math.isfinite(self.duration) and self.duration > 0):
            raise ArgumentError(f"duration = {self.duration!r} must be > 0 seconds")
        if self.arrivals == "gamma" and not (math.isfinite(self.cv) and self.cv > 0):
            raise ArgumentError(f"cv = {self.cv!r}: gamma arrivals need a coefficient of variation > 0")
        uses_file = self.arrivals == "replay" or "file" in (self.prompt_tokens.kind, self.output_tokens.kind)
        if uses_file and not self.requests:
            raise ArgumentError("replay arrivals and 'file' lengths need a requests file (requests = FILE.jsonl)")
        if self.requests and not uses_file:
            raise ArgumentError(f"requests file {self.requests}: nothing would be read from it (the lengths are "
                                f"{self.prompt_tokens.spec()!r} and {self.output_tokens.spec()!r}, arrivals "
                                f"{self.arrivals!r}): give prompt_tokens = \"file\" and/or output_tokens = \"file\" "
                                "(--prompt-tokens file --output-tokens file), or arrivals = \"replay\"; or drop it")

    def with_rate(self, rate: float) -> "Workload":
        return Workload(float(rate), self.duration, self.arrivals, self.cv, self.prompt_tokens, self.output_tokens,
                        self.requests)

    def to_dict(self) -> dict:
        return {"rate": self.rate, "duration_s": self.duration, "arrivals": self.arrivals, "cv": self.cv,
                "prompt_tokens": self.prompt_tokens.spec(), "output_tokens": self.output_tokens.spec(),
                "requests": self.requests}


# =====================================================================================
# requests files
# =====================================================================================
@dataclass
class RequestFile:
    """A requests file read and tokenized (see the module docstring).

    Attributes
    ----------
    path : str
    ids : list of str
    tokens : list of numpy.ndarray or None
        Per request, int64 token ids of its prompt (real tokenizer), or None (a length without a text).
    prompt_tokens : numpy.ndarray
        int64 ``[n]``: prompt lengths (tokens), 0 where neither a prompt nor ``prompt_tokens`` is given.
    output_tokens : numpy.ndarray
        int64 ``[n]``: ``output_tokens``, 0 where not given.
    arrival_s : numpy.ndarray or None
        float64 ``[n]``: timestamps (seconds), when every line has one.
    """

    path: str
    ids: List[str]
    tokens: List[Optional[np.ndarray]]
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.ids)


def _nonneg_int(obj: dict, key: str, where: str) -> int:
    """A token count of a requests file's line: a whole number in ``[0, MAX_REQUEST_TOKENS]``."""
    v = obj.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_REQUEST_TOKENS:
        raise FormatError(f"{where}: {key} = {v!r} must be an integer in [0, {MAX_REQUEST_TOKENS}] "
                          "(sim.core.limits.MAX_REQUEST_TOKENS: a 1M-token context window)")
    return v


def read_request_file(path: Union[str, os.PathLike], encode=None) -> RequestFile:
    """Read a requests file; prompts go through ``encode`` (text -> token ids; default the real tokenizer).

    Raises
    ------
    FormatError
        A line that is not an object with a string ``prompt`` or an integer ``prompt_tokens``, a negative
        count, a timestamp that is not a finite number >= 0, timestamps on only some lines, no requests
        (names the file and line).
    """
    encode = encode_text if encode is None else encode
    ids, toks, plen, olen, arr = [], [], [], [], []
    for lineno, obj in read_jsonl(path, "requests file"):
        where = f"{path}: line {lineno}"
        prompt = obj.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise FormatError(f"{where}: prompt must be a string")
        n_given = _nonneg_int(obj, "prompt_tokens", where)
        if prompt is None and not n_given:
            raise FormatError(f"{where}: a request needs a string 'prompt' or an integer 'prompt_tokens'")
        t = np.asarray(encode(prompt), dtype=np.int64) if prompt is not None else None
        ids.append(str(obj.get("id", f"line{lineno}")))
        toks.append(t)
        if t is not None and t.size > MAX_REQUEST_TOKENS:
            raise FormatError(f"{where}: the prompt is {t.size} tokens, past the longest request, "
                              f"{MAX_REQUEST_TOKENS} tokens (sim.core.limits.MAX_REQUEST_TOKENS)")
        plen.append(int(t.size) if t is not None else n_given)
        olen.append(_nonneg_int(obj, "output_tokens", where))
        a = obj.get("arrival_s")
        if a is not None and (isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0):
            raise FormatError(f"{where}: arrival_s = {a!r} must be a number of seconds >= 0")
        arr.append(a)
    if not ids:
        raise FormatError(f"{path}: no requests")
    have = [a is not None for a in arr]
    if any(have) and not all(have):
        raise FormatError(f"{path}: line {have.index(False) + 1 if have[0] else have.index(True) + 1}: arrival_s on "
                          "some lines only; give every request a timestamp or none")
    arrival = np.asarray(arr, dtype=np.float64) if all(have) else None
    if arrival is not None and np.any(np.diff(arrival) < 0):
        order = np.argsort(arrival, kind="stable")
        ids = [ids[i] for i in order]
        toks = [toks[i] for i in order]
        plen = [plen[i] for i in order]
        olen = [olen[i] for i in order]
        arrival = arrival[order]
    return RequestFile(str(path), ids, toks, np.asarray(plen, dtype=np.int64), np.asarray(olen, dtype=np.int64),
                       arrival)


# =====================================================================================
# requests
# =====================================================================================
@dataclass
class Requests:
    """The requests of a run, in arrival order.

    Attributes
    ----------
    arrival : numpy.ndarray
        float64 ``[n]``: arrival times, seconds, non-decreasing, in ``[0, duration)``.
    prompt, output : numpy.ndarray
        int64 ``[n]``: prompt and output lengths, tokens (output >= 1).
    source : numpy.ndarray
        int64 ``[n]``: index into the requests file (its own prompt text), or -1 (a stretch of the text).
    draw : numpy.ndarray
        float64 ``[n]``: a uniform draw in ``[0, 1)`` per request, where its text starts
        (:class:`sim.serve.rows.RowSource` turns it into positions).
    index : numpy.ndarray
        int64 ``[n]``: the request's index in the workload's sequence (common random numbers).
    """

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    source: np.ndarray
    draw: np.ndarray
    index: np.ndarray = field(default=None)

    def __len__(self) -> int:
        return int(self.arrival.size)

    @property
    def tokens(self) -> int:
        """Prompt plus output tokens of every request."""
        return int(self.prompt.sum() + self.output.sum())


def _blocks(ss: np.random.SeedSequence, n: int, fn) -> np.ndarray:
    """``fn(rng, BLOCK)`` for the blocks covering requests ``0 .. n-1``: block ``b`` uses its own child seed."""
    nb = max(1, -(-n // BLOCK))
    parts = [fn(np.random.default_rng(np.random.SeedSequence(ss.entropy, spawn_key=ss.spawn_key + (b,))), BLOCK)
             for b in range(nb)]
    return np.concatenate(parts)[:n]


def _unit_gaps(w: Workload, ss: np.random.SeedSequence, need: float) -> np.ndarray:
    """Arrival times at rate 1 (cumulative gaps of mean 1) until they pass ``need``."""
    if w.arrivals == "constant":
        return np.arange(int(math.ceil(need)) + 1, dtype=np.float64)
    shape = 1.0 / (w.cv * w.cv) if w.arrivals == "gamma" else 1.0
    gaps = (lambda r, m: r.gamma(shape, 1.0 / shape, m)) if w.arrivals == "gamma" else (lambda r, m: r.exponential(1.0, m))
    n = int(need + 6 * math.sqrt(need * max(1.0, 1.0 / shape)) + 64)
    while True:
        t = np.cumsum(_blocks(ss, n, gaps))
        if t[-1] >= need:
            return t  # the first request arrives after its gap
        n *= 2


def make_requests(w: Workload, seed: int, file: Optional[RequestFile] = None) -> Requests:
    """Draw the requests of ``w`` (see the module docstring): reproducible from ``seed``.

    ``file`` is the workload's requests file, read (:func:`read_request_file`); needed when ``w.requests``
    is set.

    Raises
    ------
    ArgumentError
        A requests file needed and not given, a file without timestamps for ``replay``, a ``file`` length
        the file does not give, no request in ``[0, duration)``, a negative seed, or more requests
        (``rate x duration``) than memory allows (:data:`BYTES_PER_REQUEST` each).
    """
    seed = check_seed(seed)
    if w.arrivals != "replay":
        check_memory(w.rate * w.duration * BYTES_PER_REQUEST,
                     f"rate {w.rate:g} requests/s x duration {w.duration:g} s = {w.rate * w.duration:g} requests "
                     f"(~{BYTES_PER_REQUEST} bytes a request)")
    if w.requests and file is None:
        raise ArgumentError(f"workload names the requests file {w.requests!r}: read it with read_request_file")
    ss_arr, ss_pl, ss_ol, ss_pos = np.random.SeedSequence(seed).spawn(4)
    if w.arrivals == "replay":
        if file.arrival_s is None:
            raise ArgumentError(f"{file.path}: replay needs arrival_s on every line")
        t = file.arrival_s - file.arrival_s[0]
        span = float(t[-1]) if t.size > 1 else 0.0
        if w.rate > 0 and t.size > 1 and span > 0:
            t = t * ((t.size - 1) / span) / w.rate   # mean rate of the recorded gaps -> w.rate
        keep = t < w.duration
        arrival = t[keep]
        idx = np.flatnonzero(keep)
    else:
        unit = _unit_gaps(w, ss_arr, w.rate * w.duration)
        arrival = unit / w.rate
        keep = arrival < w.duration
        arrival = arrival[keep]
        idx = np.flatnonzero(keep)
    n = int(arrival.size)
    if n == 0:
        raise ArgumentError(f"no request arrives in {w.duration:g} s at {w.rate:g} requests/s: "
                            "raise the rate or the duration")
    if file is not None:
        source = idx % len(file)
    else:
        source = np.full(n, -1, dtype=np.int64)
    prompt = _lengths(w.prompt_tokens, ss_pl, idx, file, source, "prompt")
    output = np.maximum(_lengths(w.output_tokens, ss_ol, idx, file, source, "output"), 1)
    draws = _blocks(ss_pos, int(idx.max()) + 1, lambda r, m: r.random(m))[idx]
    if file is not None:
        # a request whose line has no prompt text takes a stretch of the text; so does a drawn prompt length
        own = np.asarray([file.tokens[s] is not None for s in source]) & (w.prompt_tokens.kind == "file")
        source = np.where(own, source, -1)
    return Requests(arrival.astype(np.float64), prompt, output, source.astype(np.int64), draws, idx.astype(np.int64))


def _lengths(spec: Lengths, ss: np.random.SeedSequence, idx: np.ndarray, file: Optional[RequestFile],
             source: np.ndarray, what: str) -> np.ndarray:
    if spec.kind != "file":
        return _blocks(ss, int(idx.max()) + 1, spec.draw)[idx]
    got = (file.prompt_tokens if what == "prompt" else file.output_tokens)[source]
    if np.any(got < 1):
        bad = int(source[np.flatnonzero(got < 1)[0]])
        raise ArgumentError(f"{file.path}: request {file.ids[bad]!r} has no {what} length ({what}_tokens); "
                            f"give one, or draw {what} lengths from a distribution")
    return got.astype(np.int64)
