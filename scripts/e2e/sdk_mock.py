"""The official SDKs over replies the router's tests wrote to a folder (a mock HTTP transport serves each request
the body saved for it: NAME.json, or NAME.sse when the request streams), and the checks' runner. Shared by
sdk_reasoning.py and sdk_xml_tools.py."""

import json
import os
import subprocess
import sys
import tempfile
import traceback

import anthropic
import openai

try:  # The pinned SDKs use httpx2; older ones httpx.
    import httpx2 as httpx
except ImportError:
    import httpx


class Bodies:
    def __init__(self, test, name_filter, env_var):
        """The folder named on the command line, else a temporary one filled by running `cargo test -p splash-api
        --test TEST NAME_FILTER` with ENV_VAR set to it."""
        if len(sys.argv) > 1:
            self.dir = sys.argv[1]
            return
        self.dir = tempfile.mkdtemp(prefix=f"splash-{test}-")
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        subprocess.run(
            ["cargo", "test", "--release", "-q", "-p", "splash-api", "--test", test, name_filter],
            cwd=root, check=True, env={**os.environ, env_var: self.dir}, stdout=subprocess.DEVNULL,
        )

    def http(self, name):
        def handler(request):
            stream = json.loads(request.content).get("stream")
            with open(os.path.join(self.dir, name + (".sse" if stream else ".json")), "rb") as f:
                body = f.read()
            kind = "text/event-stream" if stream else "application/json"
            return httpx.Response(200, content=body, headers={"content-type": kind})

        return httpx.Client(transport=httpx.MockTransport(handler))

    def oai(self, name):
        return openai.OpenAI(api_key="x", base_url="http://splash.test/v1", http_client=self.http(name), max_retries=0)

    def ant(self, name):
        return anthropic.Anthropic(api_key="x", base_url="http://splash.test", http_client=self.http(name),
                                   max_retries=0)


def run_checks(scope):
    """Runs every `check_*` function of `scope` (a module's globals); prints one line each and "N passed, M failed";
    exits 1 if any failed."""
    checks = [(n, f) for n, f in scope.items() if n.startswith("check_")]
    failed = 0
    for name, f in checks:
        try:
            f()
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
    print(f"{len(checks) - failed} passed, {failed} failed (openai {openai.__version__}, anthropic {anthropic.__version__})")
    sys.exit(1 if failed else 0)
