#!/usr/bin/env python3
"""Ranks a tokenizer's tokens by how often they occur in source code and technical prose, for the draft model's
narrowed output head (`crates/models/src/draft_head.rs`).

A draft model only proposes tokens; the target checks every one. Its output head is the largest single matrix of a
small draft (the 0.5B's is 145 MB of its 392 MB read per token), so Splash computes it for a subset of the
vocabulary. The ids below 32768 (the BPE merge order) cover only ~94% of the tokens of real code: ` OSError`, `?;\n`,
` &[` and `(Debug` are all above it, and each one ends a draft. This script counts the tokens of a corpus and writes
them ranked, so the head can hold the tokens that code actually uses.

Corpus: only files that come from package registries and Debian packages on the build machine (the Python standard
library, crates in ~/.cargo/registry, npm packages' TypeScript sources, C headers, Markdown documentation), so the
ranking can be produced again. Tokenization is llama.cpp's (llama-cpp-python), an implementation independent of ours.

Output (little-endian): b"SPLDRAFT", u32 version (1), u64 tokenizer fingerprint (FNV-1a 64 over each token string
of `tokenizer.ggml.tokens` followed by a 0 byte), u32 number of tokens in the tokenizer, u32 n, then n u32 ids,
most frequent first (ties: lower id first), every id seen at least --min-count times.

Usage: scripts/draft_vocab.py --model qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --out crates/models/data/qwen2-draft-ranking.bin
"""
import argparse
import collections
import glob
import os
import struct
import sys

SOURCES = [
    ("python", ["/usr/lib/python3.11/**/*.py"]),
    ("rust", [os.path.expanduser("~/.cargo/registry/src/*/*/src/**/*.rs")]),
    ("typescript", [os.path.expanduser("~/.cache/splash/agents/*/node_modules/**/src/**/*.ts")]),
    ("c", ["/usr/include/**/*.h"]),
    ("markdown", [os.path.expanduser("~/.cargo/registry/src/*/*/*.md"), "/usr/share/doc/**/*.md"]),
]


def fingerprint(tokens):
    h = 0xCBF29CE484222325
    for t in tokens:
        for b in t.encode("utf-8", errors="surrogatepass") + b"\0":
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF with the tokenizer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--files-per-source", type=int, default=1500)
    ap.add_argument("--bytes-per-file", type=int, default=32768)
    ap.add_argument("--min-count", type=int, default=2)
    args = ap.parse_args()

    from gguf import GGUFReader
    from llama_cpp import Llama

    reader = GGUFReader(args.model)
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
    fp = fingerprint(tokens)
    llm = Llama(model_path=args.model, vocab_only=True, verbose=False)

    counts = collections.Counter()
    for name, patterns in SOURCES:
        files = sorted({f for p in patterns for f in glob.glob(p, recursive=True) if os.path.isfile(f)})
        # An even sample over the sorted list, so one large package does not dominate.
        step = max(1, len(files) // args.files_per_source)
        picked = files[::step][: args.files_per_source]
        n_tok = 0
        for f in picked:
            try:
                with open(f, "rb") as fh:
                    text = fh.read(args.bytes_per_file)
                text.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            ids = llm.tokenize(text, add_bos=False, special=False)
            counts.update(ids)
            n_tok += len(ids)
        print(f"{name}: {len(picked)} of {len(files)} files, {n_tok} tokens", file=sys.stderr)

    ranked = sorted((i for i, c in counts.items() if c >= args.min_count), key=lambda i: (-counts[i], i))
    total = sum(counts.values())
    for n in (8192, 16384, 24576, 32768):
        top = set(ranked[:n])
        cov = sum(c for i, c in counts.items() if i in top) / total
        low = sum(c for i, c in counts.items() if i < n) / total
        print(f"top {n}: {100 * cov:.2f}% of corpus tokens (ids below {n}: {100 * low:.2f}%)", file=sys.stderr)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "wb") as out:
        out.write(b"SPLDRAFT" + struct.pack("<IQII", 1, fp, len(tokens), len(ranked)))
        out.write(struct.pack(f"<{len(ranked)}I", *ranked))
    print(f"wrote {len(ranked)} ranked ids, fingerprint {fp:016x}, to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
