#!/usr/bin/env python3
"""Speculative decoding side by side: `splash bench --spec` (plain, n-gram, draft model, both) against llama.cpp's
plain greedy decode of the very same prompt tokens, in one run on one machine.

    scripts/bench_spec.py --model qwen2.5-coder-1.5b --gen-tokens 256 [--splash target/release/splash] [--json-out F]

Splash side: `splash bench --spec --json` renders each prompt with the model's chat template, generates greedily and
prints one JSON line per (mode, prompt) with decode_tok_s (tokens after the first / time after the first), tokens per
target pass, acceptance and whether the output equals the plain run. llama.cpp side (llama-cpp-python 0.3.36 from
~/.cache/splash/refvenv, n_threads 2, flash_attn off, n_batch 512, n_ctx just above the longest
prompt plus output): evaluates the same prompt ids, then decodes the
same number of tokens one llama_decode at a time (greedy argmax; each call timed), stopping at an end-of-generation
token like splash. Ratios are splash mode / llama.cpp per workload (code-writing, file editing), over total tokens /
total decode time.

Cost-model comparison (no llama.cpp; run on a quiet machine), issue 25's acceptance in one command:

    scripts/bench_spec.py --compare /work/main/.dev/base/splash [--splash target/release/splash] [--gen-tokens 512]
        [--rounds 2] [--inflate-calibration 4] [--json-out F]

runs `bench --spec` (every mode, code and edit workloads) with the other binary (main before the cost model), with
this one, and with this one started from an inflated calibration: the calibration this one's run just measured and
cached, with every multi-row target cost and the draft cost times --inflate-calibration (default 4), written to a
file and given with --pass-costs. The three alternate for --rounds rounds (tokens and time summed over rounds). It
prints tok/s, the ratio to `off` of the same run and tokens per pass of every mode side by side, then the issue's
gates: auto from the inflated calibration >= 1.4x off on the code workload, and no loss of this binary against the
other on code and edit (each mode within --tolerance, default 3%, of the other's tok/s); exit status 1 when one fails.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

DEFAULT_REF_PYTHON = os.path.expanduser("~/.cache/splash/refvenv/bin/python")


def llamacpp_worker(args):
    import ctypes

    import numpy as np
    from llama_cpp import Llama

    jobs = json.load(sys.stdin)
    # A context just big enough (as bench_vs_llamacpp.py does), rounded up to llama.cpp's 256-cell padding.
    need = max(len(j["prompt_ids"]) + j["tokens"] for j in jobs) + 16
    llm = Llama(model_path=args.model_file, n_ctx=(need + 255) // 256 * 256, n_batch=512, n_ubatch=512, n_threads=args.threads,
                n_threads_batch=args.threads, n_gpu_layers=0, flash_attn=False, logits_all=False, use_mmap=True,
                verbose=False)
    n_vocab = llm.n_vocab()

    def argmax():
        ptr = llm._ctx.get_logits()
        return int(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).argmax())

    import llama_cpp
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    is_eog = lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, t))
    out = []
    for job in jobs:
        llm.reset()
        ids = job["prompt_ids"]
        for i in range(0, len(ids), 512):
            llm.eval(ids[i:i + 512])
        tok = argmax()
        tokens, decode_s = [tok], 0.0
        while len(tokens) < job["tokens"] and not is_eog(tok):
            t0 = time.perf_counter()
            llm.eval([tok])
            decode_s += time.perf_counter() - t0
            tok = argmax()
            tokens.append(tok)
        out.append({"workload": job["workload"], "prompt": job["prompt"], "tokens": len(tokens),
                    "decode_s": decode_s, "decode_tok_s": (len(tokens) - 1) / max(decode_s, 1e-9)})
    print(json.dumps(out), flush=True)


def bench_rows(splash, args, extra=()):
    cmd = [splash, "bench", "--spec", "--json", "--model", args.model, "--threads", str(args.threads),
           "--gen-tokens", str(args.gen_tokens), "--workload", args.workload, *extra]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def speed_of(items):
    tokens = sum(r["tokens"] - 1 for r in items)
    return tokens / max(sum(r["decode_ms"] for r in items) / 1000, 1e-9)


def inflated_calibration(home, factor, since):
    """The calibration file in $SPLASH_HOME/calibration that a run started at `since` wrote (the newest of those, an
    error if none), with multi-row target costs and the draft cost times `factor`, written to a temporary file."""
    import glob
    import tempfile
    files = [f for f in glob.glob(os.path.join(home, "calibration", "*.txt")) if os.path.getmtime(f) >= since]
    if not files:
        sys.exit(f"no calibration file in {home}/calibration was written by the run started at {time.ctime(since)}")
    newest = max(files, key=os.path.getmtime)
    lines = []
    for line in open(newest).read().splitlines():
        f = line.split()
        if f[0] == "target" and int(f[1]) > 1:
            f[2] = repr(float(f[2]) * factor)
        elif f[0] == "draft":
            f[1] = repr(float(f[1]) * factor)
        lines.append(" ".join(f))
    tmp = tempfile.NamedTemporaryFile("w", prefix="splash-inflated-", suffix=".txt", delete=False)
    tmp.write("\n".join(lines) + "\n")
    tmp.close()
    print(f"inflated calibration (x{factor:g} from {newest}): {tmp.name}", file=sys.stderr, flush=True)
    return tmp.name


def compare(args):
    home = os.environ.get("SPLASH_HOME", os.path.expanduser("~/.cache/splash"))
    base, branch, inflated = "main before", "this branch", f"branch, calibration x{args.inflate:g}"
    runs = {base: [], branch: [], inflated: []}
    costs_file = None
    for _ in range(args.rounds):
        runs[base] += bench_rows(args.compare, args)
        started = time.time() - 1  # file times may be rounded down to the second
        runs[branch] += bench_rows(args.splash, args)
        # Inflated from the first round's fresh measurement (`bench --spec` always measures, then caches).
        costs_file = costs_file or inflated_calibration(home, args.inflate, started)
        runs[inflated] += bench_rows(args.splash, args, ["--pass-costs", costs_file])
    names = list(runs)
    print(f"\n{args.model}, {args.gen_tokens} tokens, greedy, {args.threads} threads, {args.rounds} round(s): tok/s "
          "(x vs off of the same run)")
    print(f"{'workload':<8} {'mode':<6} " + " ".join(f"{n:>26}" for n in names))
    summary = {}
    for wl in ("code", "edit"):
        for mode in ("off", "ngram", "draft", "auto"):
            cells = []
            for n in names:
                items = [r for r in runs[n] if r["workload"] == wl and r["mode"] == mode]
                off = [r for r in runs[n] if r["workload"] == wl and r["mode"] == "off"]
                if not items or not off:
                    cells.append(f"{'-':>26}")
                    continue
                sp, ratio = speed_of(items), speed_of(items) / speed_of(off)
                tpp = sum(r["tokens_per_pass"] * r["tokens"] for r in items) / sum(r["tokens"] for r in items)
                same = all(r["identical_to_off"] for r in items)
                summary.setdefault(n, {}).setdefault(wl, {})[mode] = {
                    "tok_s": round(sp, 2), "x_off": round(ratio, 3), "tokens_per_pass": round(tpp, 3),
                    "identical_to_off": same}
                cells.append(f"{sp:7.1f} (x{ratio:4.2f}, {tpp:4.2f}/pass){'' if same else ' DIFF'}".rjust(26))
            if any(c.strip() != "-" for c in cells):
                print(f"{wl:<8} {mode:<6} " + " ".join(cells))
    failures = gates(summary, base, branch, inflated, args.tolerance)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"summary": summary, "runs": runs, "failures": failures}, f, indent=1)
    return 1 if failures else 0


def gates(summary, base, branch, inflated, tolerance):
    """Issue 25's acceptance over a --compare summary; prints each gate and returns the failed ones."""
    failures = []

    def gate(ok, text):
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")
        if not ok:
            failures.append(text)

    print("\ngates:")
    code = summary.get(inflated, {}).get("code", {}).get("auto")
    gate(code is not None and code["x_off"] >= 1.4,
         f"code, auto from the inflated calibration >= 1.4x off: x{code['x_off'] if code else '-'}")
    for wl in ("code", "edit"):
        for mode in ("ngram", "draft", "auto"):
            old, new = (summary.get(n, {}).get(wl, {}).get(mode) for n in (base, branch))
            if old and new:
                r = new["tok_s"] / max(old["tok_s"], 1e-9)
                gate(r >= 1 - tolerance, f"{wl} {mode}: this branch / main before = x{r:.3f} (>= x{1 - tolerance:.2f})")
    diffs = [f"{n} {wl} {mode}" for n, wls in summary.items() for wl, modes in wls.items()
             for mode, v in modes.items() if not v["identical_to_off"]]
    gate(not diffs, "greedy output identical to off in every run and mode" + (f" (not: {', '.join(diffs)})" if diffs
                                                                             else ""))
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--splash", default="target/release/splash")
    ap.add_argument("--ref-python", default=DEFAULT_REF_PYTHON)
    ap.add_argument("--json-out")
    ap.add_argument("--compare", metavar="BASE_SPLASH", help="compare the cost model against this binary (see above)")
    ap.add_argument("--inflate-calibration", "--inflate", dest="inflate", type=float, default=4.0, metavar="F",
                    help="with --compare: start the third run from the fresh calibration times F (see above)")
    ap.add_argument("--rounds", type=int, default=1, help="with --compare: alternated rounds")
    ap.add_argument("--tolerance", type=float, default=0.03, help="with --compare: the no-loss gate's margin")
    ap.add_argument("--workload", default="all")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return llamacpp_worker(args)
    if args.compare:
        sys.exit(compare(args))

    home = os.environ.get("SPLASH_HOME", os.path.expanduser("~/.cache/splash"))
    files = {"qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
             "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
    model_file = os.path.join(home, "models", files.get(args.model, args.model))

    cmd = [args.splash, "bench", "--spec", "--json", "--model", args.model, "--threads", str(args.threads),
           "--gen-tokens", str(args.gen_tokens)]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    rows = [json.loads(l) for l in subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
            if l.startswith("{")]
    jobs = [r for r in rows if r["mode"] == "off"]
    ref_cmd = [args.ref_python, __file__, "--worker", "--model-file", model_file, "--threads", str(args.threads)]
    print("+", " ".join(ref_cmd), file=sys.stderr, flush=True)
    # llama.cpp's threads spin between operations by default (OMP_WAIT_POLICY=PASSIVE would cost it a third of
    # its decode speed); the environment is left as it is, as in bench_vs_llamacpp.py.
    ref = json.loads(subprocess.run(ref_cmd, check=True, capture_output=True, text=True,
                                    input=json.dumps(jobs)).stdout.splitlines()[-1])

    def speed(items):
        tokens = sum(r["tokens"] - 1 for r in items)
        secs = sum(r["decode_ms"] / 1000 if "decode_ms" in r else r["decode_s"] for r in items)
        return tokens / max(secs, 1e-9)

    summary = {"machine": platform.node(), "cpu": platform.processor(), "model": args.model,
               "gen_tokens": args.gen_tokens, "threads": args.threads, "workloads": {}}
    for wl in ("code", "edit"):
        base = [r for r in ref if r["workload"] == wl]
        if not base:
            continue
        ref_speed = speed(base)
        entry = {"llama.cpp": round(ref_speed, 2)}
        print(f"\n{wl}: llama.cpp plain decode {ref_speed:.1f} tok/s")
        for mode in ("off", "ngram", "draft", "auto"):
            items = [r for r in rows if r["mode"] == mode and r["workload"] == wl]
            if not items:
                continue
            sp = speed(items)
            proposed = sum(r["proposed"] for r in items)
            accepted = sum(r["accepted"] for r in items)
            tpp = sum(r["tokens_per_pass"] * r["tokens"] for r in items) / sum(r["tokens"] for r in items)
            same = all(r["identical_to_off"] for r in items)
            print(f"  splash {mode:<6} {sp:7.1f} tok/s  x{sp / ref_speed:4.2f} vs llama.cpp   "
                  f"{tpp:4.2f} tokens/pass  acceptance {accepted}/{proposed}  identical {same}")
            entry[mode] = {"tok_s": round(sp, 2), "ratio": round(sp / ref_speed, 3), "tokens_per_pass": round(tpp, 3),
                           "proposed": proposed, "accepted": accepted, "identical_to_off": same}
        summary["workloads"][wl] = entry
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"summary": summary, "splash": rows, "llama.cpp": ref}, f, indent=1)


if __name__ == "__main__":
    main()
