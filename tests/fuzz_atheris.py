"""Coverage-guided fuzzing of the GGUF header reader and the hash/decode entry points (atheris).

Run by ``tests/engram/test_fuzz.py`` for a bounded time (``python -m tests.fuzz_atheris CORPUS
-max_total_time=S ...``, libFuzzer options).  The first input byte picks the target:

- 0: the rest is a GGUF file: ``read_kv`` and ``read_model`` may only raise FormatError;
- 1: the rest is rows of 264 bytes: ``decode_rows`` equals the NumPy twin, or raises
  DecodeError exactly when the twin marks a value bad;
- 2: the rest drives ``Hasher.hash`` (tokens, mask, history): the result equals the
  NumPy twin, or TokenError/HistoryError is raised for an input that is invalid.

Any other exception, a crash, a hang (``-timeout``) or memory past ``-rss_limit_mb``
is a finding: libFuzzer stops and the test fails with its report.
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["engram"]):
    import numpy as np

    from engram import DecodeError, FormatError, Hasher, History, HistoryError, Layout, TokenError, decode_rows
    from engram.gguf import read_kv, read_model

from tests.reference import decode_rows_reference, hash_reference  # noqa: E402

#: Where fuzzed GGUF files are written (the test passes its temporary directory).
_DIR = os.environ.get("ENGRAM_FUZZ_DIR") or tempfile.mkdtemp(prefix="engram-atheris-")
_PATH = os.path.join(_DIR, "fuzz.gguf")
#: Apparent size of fuzzed files (sparse): room for the tensors a mutated header declares.
_FILE_SIZE = 1 << 31
_LAYOUT = Layout.derive(50, (1, 14), compressed_vocab_size=1000, pad_id=2)
_HASHER = Hasher(_LAYOUT)


def _gguf(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(data)
        f.truncate(max(len(data), _FILE_SIZE))
    for fn in (read_kv, read_model):
        try:
            fn(_PATH)
        except FormatError:
            pass


def _decode(data: bytes) -> None:
    n = len(data) // 264
    raw = np.frombuffer(data[: n * 264], np.uint8).reshape(n, 264)
    ref, bad = decode_rows_reference(raw)
    out = np.full((n, 256), 7.0, np.float32)
    try:
        decode_rows(raw, out=out)
    except DecodeError as exc:
        assert bad.any() and bad[exc.row, exc.column] and not bad[: exc.row].any(), exc
        assert np.all(out == 7.0)
        return
    assert not bad.any()
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


def _hash(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    T = fdp.ConsumeIntInRange(0, 40)
    tokens = [fdp.ConsumeIntInRange(-5, 1100) for _ in range(T)]
    mask = None
    if fdp.ConsumeBool():
        mask = [fdp.ConsumeIntInRange(0, 2) for _ in range(fdp.ConsumeIntInRange(0, T + 1))]
    hist_ids = [fdp.ConsumeIntInRange(-2, 1100) for _ in range(fdp.ConsumeIntInRange(1, 4))]
    try:
        hist = History(hist_ids)
    except HistoryError:
        assert len(hist_ids) < 1 or min(hist_ids) < -1
        return
    before = hist.ids
    try:
        rows = _HASHER.hash(np.array(tokens, np.int64), mask=mask, history=hist)
    except (TokenError, HistoryError):
        assert hist.ids == before
        valid = (all(0 <= t < 1000 for t in tokens) and len(hist_ids) == 3
                 and all(-1 <= i < 1000 for i in hist_ids)
                 and (mask is None or (len(mask) == T and all(m in (0, 1) for m in mask))))
        assert not valid, (tokens, mask, hist_ids)
        return
    ref, tail = hash_reference(_LAYOUT, tokens, None if mask is None else [bool(m) for m in mask],
                               tail=tuple(before))
    assert np.array_equal(rows, ref)
    assert hist.ids == tail


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    kind, body = data[0] % 3, data[1:]
    if kind == 0:
        _gguf(body)
    elif kind == 1:
        _decode(body)
    else:
        _hash(body)


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
