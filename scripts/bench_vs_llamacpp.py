#!/usr/bin/env python3
"""Side-by-side prefill/decode speed: `splash bench` against llama.cpp (llama-cpp-python) on the same GGUF.

Each round runs both engines once, one after the other (the order flips every round), each in its own process,
so machine noise (a shared VM varies by about +-10 %) hits both alike. Prints per-round figures, medians and
splash/llama.cpp ratios; --json-out writes everything.

    scripts/bench_vs_llamacpp.py --model ~/.cache/splash/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --threads 2 --prompt-tokens 512 --gen-tokens 128 --rounds 3 --splash target/release/splash

Each engine's peak resident set (its process's, from wait4: the memory-mapped model's touched pages included) is
reported beside its speeds. The MoE comparison of issue 27 (the synthetic Qwen3-30B-A3B, 18.6 GB, memory-mapped):

    target/release/splash synth --like qwen3-30b-a3b --quant q4_k_m -o ~/.cache/splash/synth/qwen3-30b-a3b-q4_k_m.gguf
    scripts/bench_vs_llamacpp.py --model ~/.cache/splash/synth/qwen3-30b-a3b-q4_k_m.gguf \
        --threads 2 --prompt-tokens 512 --gen-tokens 64 --rounds 3 --splash target/release/splash

With --splash-before OLD_BINARY an older build runs in every round too (engine "before"), for before/after figures
under the same load; the summary adds its column, the after/before ratio and each engine's prefill seconds.

Splash side: `splash bench --model PATH --threads N --prompt-tokens P --gen-tokens G --json`, whose stdout's last
line is one JSON object with keys prefill_tok_s, decode_tok_s, prompt_tokens, gen_tokens, threads, model.

llama.cpp side (mimics llama-bench pp/tg): llama-cpp-python 0.3.36 (by default the interpreter of
~/.cache/splash/refvenv) loads the same file with n_threads = n_threads_batch = N, n_batch = n_ubatch = 512,
n_ctx = P + G + 16, no GPU, flash_attn off (llama-cpp-python's default; --flash-attn turns it on), mmap on.
After one untimed warm-up (32-token prefill + 2 decode steps, then the KV cache is cleared):
  prefill = llama_decode of a P-token prompt (in 512-token calls when longer) of real text tokens (English prose and code, tokenized by the
            model's own tokenizer without BOS), timed wall-clock; prefill_tok_s = P / seconds.
  decode  = G single-token llama_decode calls continuing greedily (argmax) after that prompt, each timed alone,
            summed (the argmax itself is not timed); decode_tok_s = G / seconds.
Unlike llama-bench's tg (which decodes from an empty context), decode here runs at depth P..P+G, as a real
request would; splash bench is expected to do the same.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

DEFAULT_REF_PYTHON = os.path.expanduser("~/.cache/splash/refvenv/bin/python")

PROMPT_TEXT = """The printing press changed how knowledge moved through Europe. Before it, a book was copied by hand,
letter by letter, and a single copy could take a scribe many months. Gutenberg's movable type, combined with oil-based
inks and a screw press adapted from wine making, made it possible to print hundreds of identical pages a day. Within
fifty years, presses operated in more than two hundred cities, and millions of volumes had been produced. Prices fell,
literacy rose, and scholars could compare the same text across distant libraries, which made errors easier to find
and arguments easier to check.

def merge_sorted(left, right):
    \"\"\"Merge two sorted lists into one sorted list in linear time.\"\"\"
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result

A hash map stores key-value pairs in an array of buckets. A hash function turns each key into an index, and
collisions are resolved either by chaining entries in a list or by probing for the next free slot. When the table
grows too full, it is resized and every entry is inserted again, which keeps lookups close to constant time on
average. Good hash functions spread keys evenly; poor ones cluster them and slow everything down.

fn word_counts(text: &str) -> std::collections::HashMap<String, usize> {
    let mut counts = std::collections::HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word.to_lowercase()).or_insert(0) += 1;
    }
    counts
}
"""


# --------------------------------------------------------------------------------------------------------------
# llama.cpp worker (runs inside the reference venv, in its own process)
# --------------------------------------------------------------------------------------------------------------

def llamacpp_worker(args):
    import ctypes

    import numpy as np
    import llama_cpp
    import llama_cpp.llama_cpp as lib
    from llama_cpp import Llama

    if args.no_extra_bufts:
        default_params = lib.llama_model_default_params

        def without_extra_bufts():
            mp = default_params()
            mp.use_extra_bufts = False
            return mp

        lib.llama_model_default_params = without_extra_bufts
    p, g, n = args.prompt_tokens, args.gen_tokens, args.threads
    t0 = time.perf_counter()
    llm = Llama(
        model_path=args.model,
        n_ctx=p + g + 16,
        n_batch=512,
        n_ubatch=512,
        n_threads=n,
        n_threads_batch=n,
        n_gpu_layers=0,
        flash_attn=args.flash_attn,
        logits_all=False,
        use_mmap=True,
        verbose=False,
    )
    load_s = time.perf_counter() - t0
    n_vocab = llm.n_vocab()

    text_ids = llm.tokenize(PROMPT_TEXT.encode("utf-8"), add_bos=False, special=False)
    prompt = (text_ids * (p // len(text_ids) + 1))[:p]
    # A prompt longer than n_batch is fed as several 512-token llama_decode calls (Llama.eval splits it), as
    # llama-server does; splash bench likewise prefills in 512-token batches.

    def last_argmax():
        ptr = llm._ctx.get_logits()
        return int(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).argmax())

    # Warm-up, as llama-bench does; then clear the KV cache (eval() drops cells from n_tokens on).
    llm.reset()
    llm.eval(prompt[:32])
    for _ in range(2):
        llm.eval([last_argmax()])
    llm.reset()

    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t0

    decode_s = 0.0
    generated = []
    for _ in range(g):
        tok = last_argmax()
        generated.append(tok)
        t0 = time.perf_counter()
        llm.eval([tok])
        decode_s += time.perf_counter() - t0

    print(json.dumps({
        "prefill_tok_s": p / prefill_s,
        "decode_tok_s": g / decode_s,
        "prompt_tokens": p,
        "gen_tokens": g,
        "threads": n,
        "model": args.model,
        "load_s": load_s,
        "llama_cpp_python": llama_cpp.__version__,
        "flash_attn": args.flash_attn,
        "first_generated_ids": generated[:8],
    }), flush=True)


# --------------------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------------------

def run_json(cmd, label):
    """Runs one engine's process; its JSON line, plus wall_s and peak_rss_gib (the process's peak resident set, the
    memory-mapped model's pages it touched included, from wait4's rusage)."""
    import tempfile

    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    wall_s = time.perf_counter() - t0
    if child.returncode != 0:
        raise SystemExit(f"{label} failed ({child.returncode}): {' '.join(cmd)}\n{stdout[-2000:]}{stderr[-4000:]}")
    lines = [l for l in stdout.splitlines() if l.strip()]
    if not lines:
        raise SystemExit(f"{label} printed nothing on stdout: {' '.join(cmd)}\n{stderr[-4000:]}")
    try:
        out = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise SystemExit(f"{label}: last stdout line is not JSON ({e}): {lines[-1][:500]}")
    for key in ("prefill_tok_s", "decode_tok_s"):
        if not isinstance(out.get(key), (int, float)):
            raise SystemExit(f"{label}: missing numeric {key} in {out}")
    out["wall_s"] = wall_s
    out["peak_rss_gib"] = usage.ru_maxrss * 1024 / 2**30
    return out


def splash_cmd(args, binary=None):
    return [binary or args.splash, "bench", "--model", args.model, "--threads", str(args.threads),
            "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens), "--json"]


def llamacpp_cmd(args):
    cmd = [args.python, os.path.abspath(__file__), "--llamacpp-worker", "--model", args.model,
           "--threads", str(args.threads), "--prompt-tokens", str(args.prompt_tokens),
           "--gen-tokens", str(args.gen_tokens)]
    return cmd + (["--flash-attn"] if args.flash_attn else []) + (["--no-extra-bufts"] if args.no_extra_bufts else [])


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def host_info():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu, "num_cpus": os.cpu_count(), "platform": platform.platform(),
            "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="path to a .gguf file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--splash", default="target/release/splash", help="the splash binary")
    ap.add_argument("--python", default=DEFAULT_REF_PYTHON if os.path.exists(DEFAULT_REF_PYTHON) else sys.executable,
                    help="interpreter with llama-cpp-python 0.3.36 (default: ~/.cache/splash/refvenv)")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp with flash attention")
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="llama.cpp without its extra CPU buffer types (weight repacking, AMX): 0.3.36's AMX matmul "
                         "segfaults on the synthetic Qwen3-30B-A3B on a CPU with AMX")
    ap.add_argument("--only", choices=["splash", "llamacpp"], help="run one engine only")
    ap.add_argument("--splash-before", metavar="BINARY",
                    help="also run this (older) splash binary in every round, as engine 'before', for before/after "
                         "figures under the same machine load")
    ap.add_argument("--json-out", help="write all rounds, medians and ratios here")
    ap.add_argument("--llamacpp-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.llamacpp_worker:
        return llamacpp_worker(args)

    args.model = os.path.abspath(os.path.expanduser(args.model))
    if not os.path.isfile(args.model):
        raise SystemExit(f"no such model file: {args.model}")
    engines = ["splash", "llamacpp"] if args.only is None else [args.only]
    if "splash" in engines and not os.path.isfile(args.splash):
        raise SystemExit(f"no splash binary at {args.splash} (build it with `cargo build --release -p splash-cli`, "
                         f"or pass --only llamacpp)")

    if args.splash_before:
        if not os.path.isfile(args.splash_before):
            raise SystemExit(f"no splash binary at {args.splash_before}")
        engines.append("before")
    results = {e: [] for e in engines}
    for r in range(args.rounds):
        order = engines if r % 2 == 0 else engines[::-1]
        for engine in order:
            cmd = {"splash": lambda: splash_cmd(args), "before": lambda: splash_cmd(args, args.splash_before),
                   "llamacpp": lambda: llamacpp_cmd(args)}[engine]()
            out = run_json(cmd, engine)
            out["round"] = r + 1
            for key, want in (("prompt_tokens", args.prompt_tokens), ("gen_tokens", args.gen_tokens),
                              ("threads", args.threads)):
                if out.get(key) != want:
                    print(f"warning: {engine} reports {key}={out.get(key)}, asked for {want}", file=sys.stderr)
            results[engine].append(out)
            print(f"round {r + 1} {engine:9s} prefill {out['prefill_tok_s']:8.1f} tok/s   "
                  f"decode {out['decode_tok_s']:7.2f} tok/s   peak RSS {out['peak_rss_gib']:.2f} GiB",
                  file=sys.stderr, flush=True)

    keys = ("prefill_tok_s", "decode_tok_s", "peak_rss_gib")
    medians = {e: {k: median([o[k] for o in results[e]]) for k in keys} for e in engines}
    ratios = {}
    if "splash" in engines and "llamacpp" in engines:
        for k in ("prefill_tok_s", "decode_tok_s"):
            ratios[k] = medians["splash"][k] / medians["llamacpp"][k]

    name = os.path.basename(args.model)
    print(f"\n{name}: threads {args.threads}, prompt {args.prompt_tokens} tokens, {args.gen_tokens} generated, "
          f"{args.rounds} rounds (medians)")
    before = "before" in engines
    header = f"{'metric':14s} {'splash':>10s} {'llama.cpp':>10s} {'splash/llama':>13s}" + (
        f" {'before':>10s} {'after/before':>13s}" if before else "")
    print(header)
    print("-" * len(header))
    for k, label in (("prefill_tok_s", "prefill tok/s"), ("decode_tok_s", "decode tok/s")):
        s = medians.get("splash", {}).get(k)
        l = medians.get("llamacpp", {}).get(k)
        b = medians.get("before", {}).get(k)
        extra = f" {fmt(b):>10s} {fmt(s / b if s and b else None, 3):>13s}" if before else ""
        print(f"{label:14s} {fmt(s):>10s} {fmt(l):>10s} {fmt(ratios.get(k), 3):>13s}{extra}")
    print(f"{'peak RSS GiB':14s} " + " ".join(f"{e}={medians[e]['peak_rss_gib']:.2f}" for e in engines))
    # Prefill time = the time to the first token of a prompt that long, no cache.
    secs = {e: args.prompt_tokens / medians[e]["prefill_tok_s"] for e in engines if medians[e]["prefill_tok_s"]}
    print(f"{'prefill s':14s} " + " ".join(f"{e}={secs[e]:.1f}" for e in engines if e in secs))
    for e in engines:
        for k in ("prefill_tok_s", "decode_tok_s"):
            xs = [o[k] for o in results[e]]
            print(f"  {e} {k}: " + ", ".join(f"{x:.1f}" for x in xs))
    sys.stdout.flush()

    if args.json_out:
        doc = {
            "model": args.model,
            "threads": args.threads,
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "rounds": args.rounds,
            "host": host_info(),
            "llamacpp_settings": {"n_batch": 512, "n_ubatch": 512, "flash_attn": args.flash_attn,
                                  "extra_bufts": not args.no_extra_bufts,
                                  "n_ctx": args.prompt_tokens + args.gen_tokens + 16},
            "runs": results,
            "medians": medians,
            "ratios_splash_over_llamacpp": ratios,
            "splash_before": args.splash_before,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        with open(args.json_out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
