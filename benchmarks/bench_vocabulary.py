"""What the vocabulary a model file carries costs, side by side with its peers in one run.

- the check of a tokenizer against the file (``engram.check_tokenizer``): the first one in a
  process (the file's token array read and digested, the tokenizer's vocabulary collected and
  digested) against its peer for files without a vocabulary (the token map built from the
  tokenizer, SPEC §3); a repeated check against encoding the text it guards (a 2,000-character
  prompt of real text);
- ``read_model`` of a header with the vocabulary (129,280 tokens and 127,741 merges walked,
  not kept) against the same header without it;
- packing the vocabulary and the token map into a header: ``engram.gguf.write.ArrayWriter``
  against ``gguf.GGUFWriter`` (one ``struct.pack`` per element), the same bytes.

Best of ``--repeat`` runs each.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from gguf import GGUFValueType, GGUFWriter

from engram import build_token_map, check_tokenizer, load_tokenizer, read_model, synth
from engram import vocabulary as vocab_mod
from engram.gguf.write import ArrayWriter

from .common import real_text, time_best


def _fresh_check(path: Path) -> None:
    vocab_mod._vocabulary_cached.cache_clear()
    vocab_mod._load_cached.cache_clear()
    check_tokenizer(read_model(path))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="bench_vocabulary")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    tm = build_token_map()
    with tempfile.TemporaryDirectory() as d:
        with_v, = synth.write_model(synth.plan_model(synth.ModelShape(scale=0.0005, token_map=tm)), Path(d) / "v.gguf",
                                    synth.Fill(tables="none", projections=False), progress=False)
        without, = synth.write_model(synth.plan_model(synth.ModelShape(scale=0.0005, token_map=tm,
                                                                       vocabulary=False)), Path(d) / "n.gguf",
                                     synth.Fill(tables="none", projections=False), progress=False)
        first = time_best(lambda: _fresh_check(with_v), args.repeat)
        token_map = time_best(lambda: build_token_map(), max(1, args.repeat // 2))
        info = read_model(with_v)
        check_tokenizer(info)
        again = time_best(lambda: check_tokenizer(info), args.repeat, number=1000)
        tok, text = load_tokenizer(), real_text(2000)
        encode = time_best(lambda: tok.encode(text, add_special_tokens=False), args.repeat, number=20)
        read_v = time_best(lambda: read_model(with_v), args.repeat, number=5)
        read_n = time_best(lambda: read_model(without), args.repeat, number=5)
    v = vocab_mod.tokenizer_vocabulary()
    md = vocab_mod.vocabulary_metadata(v)
    arrays = [(k, val, sub) for k, (val, t, sub) in md.items() if t == GGUFValueType.ARRAY] + \
             [("token_map", tm.astype(int).tolist(), GGUFValueType.UINT32)]

    def pack(cls) -> int:
        w = cls("unused.gguf", "a")
        return sum(len(w._pack_val(val, GGUFValueType.ARRAY, True, sub)) for _, val, sub in arrays)

    assert pack(ArrayWriter) == pack(GGUFWriter)
    ours = time_best(lambda: pack(ArrayWriter), args.repeat)
    theirs = time_best(lambda: pack(GGUFWriter), max(1, args.repeat // 2))
    rec = {
        "check_first_s": first, "token_map_build_s": token_map, "first_check_vs_token_map": first / token_map,
        "check_again_us": again * 1e6, "encode_2000_chars_us": encode * 1e6, "check_again_vs_encode": again / encode,
        "read_model_with_vocabulary_ms": read_v * 1e3, "read_model_without_ms": read_n * 1e3,
        "pack_array_writer_s": ours, "pack_gguf_writer_s": theirs, "pack_speedup": theirs / ours,
    }
    print(f"   first check {first * 1e3:.0f} ms vs token map build {token_map * 1e3:.0f} ms "
          f"({rec['first_check_vs_token_map']:.2f}x)")
    print(f"   repeated check {rec['check_again_us']:.1f} us vs encoding 2,000 chars {rec['encode_2000_chars_us']:.0f} us "
          f"({rec['check_again_vs_encode']:.4f}x)")
    print(f"   read_model {rec['read_model_with_vocabulary_ms']:.1f} ms with the vocabulary, "
          f"{rec['read_model_without_ms']:.1f} ms without")
    print(f"   packing the vocabulary + token map: ArrayWriter {ours * 1e3:.0f} ms, GGUFWriter {theirs * 1e3:.0f} ms "
          f"({rec['pack_speedup']:.1f}x)")
    return rec
