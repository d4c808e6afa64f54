"""Runs the checks of sdk_openai.py, sdk_anthropic.py and sdk_extras.py against one server and prints one
"N passed, M failed". Arguments: only run checks whose "module.name" contains one of them."""

import sys
import time
import traceback

import sdk_anthropic
import sdk_extras
import sdk_openai


def main():
    passed = failed = skipped = 0
    only = sys.argv[1:]
    for module in (sdk_openai, sdk_anthropic, sdk_extras):
        for fn in module.CHECKS:
            name = f"{module.__name__}.{fn.__name__}"
            if only and not any(o in name for o in only):
                continue
            t0 = time.time()
            try:
                fn()
            except sdk_openai.Skip as e:
                skipped += 1
                print(f"skip {name}: {e}", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {name} ({time.time() - t0:.1f} s)", flush=True)
                traceback.print_exc()
            else:
                passed += 1
                print(f"ok   {name} ({time.time() - t0:.1f} s)", flush=True)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
