"""Report for scripts/e2e/agents.sh: joins each client run with the requests the logging proxy saw during it.

A turn passes when the launcher exited 0 and the client printed the model's answer (most words of the last text the
server streamed appear on the client's stdout). The tool turn is reported (file written or not;
"stopped" when agents.sh ended it once the round trip was done), not required.
Prints a table, then "N passed, M failed"; exits 1 on any failure.

Usage: python3 agents_report.py WORK_DIR MODEL
"""

import json
import os
import re
import sys

work, model = sys.argv[1], sys.argv[2]
results = [json.loads(l) for l in open(os.path.join(work, "results.jsonl"))]
req_path = os.path.join(work, "requests.jsonl")
requests = [json.loads(l) for l in open(req_path)] if os.path.exists(req_path) else []
words = lambda s: re.findall(r"[a-z0-9]+", s.lower())

passed = failed = 0
for r in results:
    if "check" in r:
        passed += r["ok"]
        failed += not r["ok"]

rows = {}
for r in (r for r in results if "run" in r and r.get("skipped")):
    rows.setdefault(r["run"], {})[r["turn"]] = {"skipped": True}
    if r["turn"] != "tool":
        failed += 1
    print(f"skipped {r['run']} {r['turn']} (deadline)", file=sys.stderr)
for r in (r for r in results if "run" in r and not r.get("skipped")):
    window = [q for q in requests if r["t0"] <= q["t"] <= r["t1"] and q["method"] == "POST"]
    gen = [q for q in window if "/v1/" in q["path"] and "count_tokens" not in q["path"]]
    main = max(gen, key=lambda q: q["request_bytes"], default=None)
    first_main = next((q for q in gen if q["request_bytes"] >= 0.5 * main["request_bytes"]), None) if main else None
    texts = [q["text"] for q in gen if q.get("text", "").strip()]
    answer = texts[-1].strip() if texts else ""
    stdout = open(os.path.join(r["dir"], "stdout"), errors="replace").read()
    out_words = set(words(stdout))
    aw = words(answer)
    shown = sum(w in out_words for w in aw) / len(aw) if aw else 0.0
    row = rows.setdefault(r["run"], {})
    row[r["turn"]] = {
        "rc": r["rc"],
        "secs": r["t1"] - r["t0"],
        "requests": len(gen),
        "ttft": first_main["ttft_s"] if first_main else None,
        "prompt": first_main.get("prompt_tokens") if first_main else None,
        "cached": first_main.get("cached_tokens") if first_main else None,
        "answer": answer,
        "printed": r["rc"] == 0 and bool(aw) and shown >= 0.6,
        "tool_calls": sum(bool(q.get("tool_call")) for q in gen),
        "stopped": r.get("stopped", False),
    }
    if r["turn"] == "tool":
        # In the run's directory, or anywhere in the client's throwaway HOME (Hermes gives the model no working
        # directory, so it picks a path: its HOME, or a profile folder); the latter reported as "hi (home)".
        home = os.path.join(os.path.dirname(r["dir"]), "home-" + r["run"])
        in_home = sorted(os.path.join(d, "hello.txt") for d, _, files in os.walk(home) if "hello.txt" in files)
        for where, f in [("", os.path.join(r["dir"], "hello.txt"))] + [(" (home)", f) for f in in_home]:
            if os.path.exists(f):
                row["tool"]["path"] = f
                row["tool"]["file"] = open(f, errors="replace").read()
                row["tool"]["where"] = where
                break
        else:
            row["tool"]["file"] = None
    else:
        ok = row[r["turn"]]["printed"]
        passed += ok
        failed += not ok
        if not ok:
            print(f"FAIL  {r['run']} {r['turn']} turn: rc={r['rc']} answer={answer[:120]!r} stdout={stdout[:200]!r}",
                  file=sys.stderr)

fmt = lambda x: "-" if x is None else (f"{x:.1f}" if isinstance(x, float) else str(x))
print(f"\nagents on {model} (TTFT = time to the first generated token of the turn's main request, seconds)")
print(f"{'client':9} {'cold':>5} {'warm':>5} {'TTFT cold':>9} {'TTFT warm':>9} {'prompt':>7} {'cached':>7} "
      f"{'restart':>7} {'TTFT rst':>8} {'cached':>7} {'turn s':>7} {'tool calls':>10} {'hello.txt':>20}  answer (cold)")
for c, row in rows.items():
    cold, warm, tool, rst = row.get("cold", {}), row.get("warm", {}), row.get("tool", {}), row.get("restart", {})
    file = tool.get("file")
    # The word asked for, alone (a file holding a command that mentions it, as the 0.5B once wrote, is not it).
    is_hi = file is not None and file.strip().strip(".!'\"").lower() == "hi"
    wrote = "-" if not tool or tool.get("skipped") else ("no" if file is None else ("hi" if is_hi else f"{file[:8]!r}"))
    wrote += tool.get("where", "") + (" (stopped)" if tool.get("stopped") else "")
    state = lambda t: "-" if not t else ("skip" if t.get("skipped") else ("ok" if t.get("printed") else "FAIL"))
    print(f"{c:9} {state(cold):>5} {state(warm):>5} "
          f"{fmt(cold.get('ttft')):>9} {fmt(warm.get('ttft')):>9} {fmt(cold.get('prompt')):>7} "
          f"{fmt(warm.get('cached')):>7} {state(rst) if rst else '-':>7} {fmt(rst.get('ttft')):>8} "
          f"{fmt(rst.get('cached')):>7} {fmt(cold.get('secs')):>7} {fmt(tool.get('tool_calls')):>10} {wrote:>20}  "
          f"{cold.get('answer', '')[:60]!r}")
summary = {c: {t: {k: v for k, v in d.items() if k != "answer"} for t, d in row.items()} for c, row in rows.items()}
json.dump(summary, open(os.path.join(work, "summary.json"), "w"), indent=1)
print(f"details: {work} (summary.json, requests.jsonl, <client>-<turn>/stdout|stderr)")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
