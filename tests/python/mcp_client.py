"""Drive `doorbell mcp` with the official Python MCP SDK, as an agent's harness would.

Usage: python mcp_client.py DOORBELL MODE   (MODE: auto, the SDK's default, or legacy;
       or reads: web's `read` called until nothing is unread, each result's size and ids)
The bridge comes from DOORBELL_DIR and XDG_CONFIG_HOME in the environment. Prints one JSON
document of what it saw; exits non-zero on the first surprise.
"""

import json
import os
import sys
import time

import anyio
from mcp import Client, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

DOORBELL, MODE = sys.argv[1], sys.argv[2]
ENV = {k: v for k, v in os.environ.items() if k.startswith(("DOORBELL_", "XDG_")) or k == "HOME"}


def server(agent):
    return StdioServerParameters(command=DOORBELL, args=["mcp", "--agent", agent], env=ENV)


def connect(agent):
    if MODE == "legacy":
        return Client(stdio_client(server(agent)), mode="legacy")
    return Client(stdio_client(server(agent)))


def expect(condition, what):
    if not condition:
        raise SystemExit(f"unexpected: {what}")


async def reads():
    """Call web's `read` until nothing is left: per call, its ids, `more`, the UTF-16 length
    of its text, and which messages came cut."""
    calls = []
    async with connect("web") as web:
        while True:
            read = await web.call_tool("read", {})
            expect(not read.is_error, f"read: {read.content}")
            messages = read.structured_content["messages"]
            if not messages:
                break
            calls.append({
                "ids": [m["id"] for m in messages],
                "more": read.structured_content["more"],
                "units": sum(len(m["text"].encode("utf-16-le")) // 2 for m in messages),
                "truncated": [m["id"] for m in messages if m.get("truncated")],
            })
    print(json.dumps(calls))


async def main():
    if MODE == "reads":
        return await reads()
    seen = {"mode": MODE}
    started = time.perf_counter()
    async with connect("design") as design:
        seen["connect_secs"] = time.perf_counter() - started
        seen["protocol"] = design.protocol_version
        tools = await design.list_tools()
        seen["tools"] = sorted(t.name for t in tools.tools)
        seen["tools_list_chars"] = len(json.dumps([t.model_dump(mode="json", exclude_none=True) for t in tools.tools]))
        schema = {t.name: t.input_schema.get("properties", {}) for t in tools.tools}
        seen["bounds"] = {
            "read.max": [schema["read"]["max"].get("minimum"), schema["read"]["max"].get("maximum")],
            "wait.timeout_secs": schema["wait"]["timeout_secs"].get("maximum"),
        }
        sent = await design.call_tool("send", {"to": ["web"], "text": "ETA for the footer?", "request": True})
        expect(not sent.is_error, f"send: {sent.content}")
        request = sent.structured_content["ids"][0]
        seen["request"] = request
        # Bad calls: a tool error or a protocol error, nothing appended.
        big = await design.call_tool("send", {"to": ["web"], "text": "x" * 70000})
        expect(big.is_error, "oversized text accepted")
        seen["oversized"] = big.content[0].text
        wrong = await design.call_tool("send", {"to": "web"})
        expect(wrong.is_error, "bad arguments accepted")
        nobody = await design.call_tool("send", {"to": [], "text": "to no one"})
        expect(nobody.is_error, "a send to no one accepted")
        no_ids = await design.call_tool("wait", {"ids": []})
        expect(no_ids.is_error, "a wait for nothing answered")
        try:
            await design.call_tool("delete_everything", {})
            raise SystemExit("unknown tool accepted")
        except MCPError as e:
            seen["unknown_tool_code"] = e.code
        async with connect("web") as web:
            read = await web.call_tool("read", {})
            expect(not read.is_error, f"read: {read.content}")
            messages = read.structured_content["messages"]
            expect([m["id"] for m in messages] == [request], f"read: {messages}")
            seen["read_note"] = read.structured_content["note"]
            debts = await web.call_tool("debts", {})
            expect([d["id"] for d in debts.structured_content["owes"]] == [request], "debts")
            working = await web.call_tool("reply", {"id": request, "state": "working", "text": "on it"})
            expect(not working.is_error, f"reply: {working.content}")
            await web.call_tool("reply", {"id": request, "state": "completed", "text": "Friday"})
            again = await web.call_tool("read", {})
            expect(again.structured_content["messages"] == [], "read twice")
        waited = await design.call_tool("wait", {"ids": [request], "timeout_secs": 30})
        expect(not waited.is_error, f"wait: {waited.content}")
        seen["waited"] = waited.structured_content["answered"]
        shown = await design.call_tool("show", {"id": request})
        seen["thread"] = [m["text"] for m in shown.structured_content["thread"]]
        status = await design.call_tool("status", {})
        expect(not status.is_error, f"status: {status.content}")
    print(json.dumps(seen))


anyio.run(main)
