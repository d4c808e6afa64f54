"""A logging HTTP/1.1 pass-through between the coding agents and `splash serve`, for scripts/e2e/agents.sh.

Listens on 127.0.0.1:LISTEN, forwards each request to 127.0.0.1:UPSTREAM (one request per connection: it asks for
`Connection: close`), streams the reply back unchanged, and appends one JSON line per request to LOG: method, path,
request size, whether tools were sent, time to the first generated token (first SSE event carrying text or a tool
call, in any of the three protocols), total time, the text and tool calls the model produced, and the usage numbers
(prompt / cached tokens) found in the stream. Stdlib only.

With AGENTS_PROXY_BODIES=DIR set, each request body is also written to DIR/NNNN.json (in arrival order), so two
turns' prompts can be diffed (scripts/e2e/prompt_diff.py) to see where they stop sharing a prefix.

Usage: python3 agents_proxy.py LISTEN UPSTREAM LOG
"""

import asyncio
import itertools
import json
import os
import sys
import time

LISTEN, UPSTREAM, LOG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
BODIES = os.environ.get("AGENTS_PROXY_BODIES")
SEQ = itertools.count()


def token_event(obj):
    """Text and tool-call pieces a stream event carries (chat, responses, anthropic): (text, is_tool, tool_text)."""
    text, tool, tool_text = "", False, ""
    t = obj.get("type", "")
    if t == "content_block_delta":
        d = obj.get("delta", {})
        text = d.get("text", "") if d.get("type") == "text_delta" else ""
        if d.get("type") == "input_json_delta":
            tool, tool_text = True, d.get("partial_json", "")
    elif t == "content_block_start":
        b = obj.get("content_block", {})
        if b.get("type") == "tool_use":
            tool, tool_text = True, b.get("name", "") + " "
    elif t == "response.output_text.delta":
        text = obj.get("delta", "")
    elif t == "response.function_call_arguments.delta":
        tool, tool_text = True, obj.get("delta", "")
    elif t == "response.output_item.added":
        item = obj.get("item", {})
        if item.get("type") == "function_call":
            tool, tool_text = True, item.get("name", "") + " "
    for c in obj.get("choices") or []:
        d = c.get("delta") or c.get("message") or {}
        text += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            tool = True
            f = tc.get("function") or {}
            tool_text += (f.get("name") or "") + (" " if f.get("name") else "") + (f.get("arguments") or "")
    return text, tool, tool_text


def usage_of(obj, acc):
    for u in (obj.get("usage"), (obj.get("message") or {}).get("usage"), (obj.get("response") or {}).get("usage")):
        if not isinstance(u, dict):
            continue
        for k in ("prompt_tokens", "input_tokens"):
            if u.get(k):
                acc["prompt_tokens"] = u[k]
        for k in ("completion_tokens", "output_tokens"):
            if u.get(k):
                acc["output_tokens"] = u[k]
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or (u.get("input_tokens_details") or {}).get(
            "cached_tokens"
        ) or u.get("cache_read_input_tokens")
        if cached:
            acc["cached_tokens"] = cached


async def read_request(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for l in lines[1:]:
        if ":" in l:
            k, v = l.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif "chunked" in headers.get("transfer-encoding", ""):
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
        headers.pop("transfer-encoding")
    return lines[0], headers, body


# Handler tasks, held here: asyncio drops its own reference when a client hangs up (a killed client), and a task
# nobody holds can be collected mid-request, losing the request's log line.
TASKS = set()


async def handle(creader, cwriter):
    task = asyncio.current_task()
    TASKS.add(task)
    try:
        await relay(creader, cwriter)
    finally:
        TASKS.discard(task)


async def relay(creader, cwriter):
    try:
        request_line, headers, body = await read_request(creader)
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        cwriter.close()
        return
    t0 = time.monotonic()
    method, path = request_line.split(" ")[:2]
    rec = {"t": time.time(), "method": method, "path": path, "request_bytes": len(body), "tools": False}
    if BODIES and body:
        os.makedirs(BODIES, exist_ok=True)
        name = os.path.join(BODIES, f"{next(SEQ):04d}.json")
        with open(name, "wb") as f:
            f.write(json.dumps({"path": path, "headers": headers}).encode() + b"\n" + body)
        rec["body_file"] = name
    try:
        j = json.loads(body) if body else {}
        rec["tools"] = bool(j.get("tools"))
        rec["stream"] = bool(j.get("stream"))
        last = (j.get("messages") or j.get("input") or [None])[-1] if isinstance(j.get("messages") or j.get("input"), list) else None
        rec["last_input"] = json.dumps(last)[:400] if last is not None else None
    except ValueError:
        pass
    headers["connection"] = "close"
    headers["content-length"] = str(len(body))
    headers.pop("accept-encoding", None)
    out = request_line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    ureader, uwriter = await asyncio.open_connection("127.0.0.1", UPSTREAM)
    uwriter.write(out.encode("latin-1") + body)
    await uwriter.drain()
    buf, text, tool, tool_text, first, usage, status = b"", "", False, "", None, {}, None
    while True:
        data = await ureader.read(65536)
        if not data:
            break
        try:
            cwriter.write(data)
            await cwriter.drain()
        except ConnectionError:
            rec["client_gone"] = True
            break
        buf += data
        if status is None and b"\r\n" in buf:
            status = int(buf.split(b"\r\n", 1)[0].split()[1])
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                if line.startswith(b"{"):
                    try:
                        obj = json.loads(line)
                        usage_of(obj, usage)
                        for c in obj.get("choices") or []:
                            text += (c.get("message") or {}).get("content") or ""
                        for item in obj.get("content") or []:
                            text += item.get("text", "") if isinstance(item, dict) else ""
                    except ValueError:
                        pass
                continue
            try:
                obj = json.loads(line[5:])
            except ValueError:
                continue
            piece, is_tool, tool_piece = token_event(obj)
            if (piece or is_tool) and first is None:
                first = time.monotonic() - t0
            text += piece
            tool = tool or is_tool
            tool_text += tool_piece
            usage_of(obj, usage)
    uwriter.close()
    cwriter.close()
    rec.update(status=status, ttft_s=first, total_s=round(time.monotonic() - t0, 3), text=text[-2000:],
               tool_call=tool, tool_text=tool_text[:600], **usage)
    with open(LOG, "a") as f:
        f.write(json.dumps(rec) + "\n")


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", LISTEN)
    async with server:
        await server.serve_forever()


asyncio.run(main())
