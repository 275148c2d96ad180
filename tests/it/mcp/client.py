"""Drives `compactd mcp` with the official MCP Python SDK's stdio client, as an agent's host
does: initialize, list the tools, call both (on every query given), and the failures a model
can cause. Prints one JSON object with what it saw; the Rust test asserts on it.

usage: client.py COMPACTD_BINARY SOCKET PLAN.json
  PLAN: {"session": ID, "queries": [TEXT, ...], "read": SEQ}
"""
import asyncio
import json
import re
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def text_of(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def main():
    binary, socket, plan_path = sys.argv[1:4]
    plan = json.load(open(plan_path))
    session = plan["session"]
    server = StdioServerParameters(command=binary, args=["--socket", socket, "mcp"])
    seen = {}
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as client:
            init = await client.initialize()
            seen["protocol"] = init.protocolVersion
            seen["server"] = init.serverInfo.name
            tools = await client.list_tools()
            seen["tools"] = {t.name: t.inputSchema for t in tools.tools}
            seen["found"] = []
            for query in plan["queries"]:
                found = await client.call_tool("search_history", {"session": session, "query": query, "limit": 3})
                seqs = [int(s) for s in re.findall(r"^- seq (\d+)", text_of(found), re.M)]
                seen["found"].append({"error": found.isError, "seqs": seqs})
            read_back = await client.call_tool("read_messages", {"session": session, "from_seq": plan["read"]})
            seen["read"] = {"error": read_back.isError, "text": text_of(read_back)}
            missing = await client.call_tool("read_messages", {"session": "no-such-session", "from_seq": 1})
            seen["missing"] = {"error": missing.isError, "text": text_of(missing)}
            hostile = await client.call_tool("search_history", {"session": session, "query": '" NEAR( * -- OR AND ('})
            seen["hostile"] = {"error": hostile.isError, "text": text_of(hostile)}
            bad_args = await client.call_tool("read_messages", {"session": session})
            seen["bad_args"] = {"error": bad_args.isError, "text": text_of(bad_args)}
            try:
                await client.call_tool("no_such_tool", {})
                seen["unknown_tool"] = "answered"
            except Exception as e:  # a JSON-RPC error, which the SDK raises
                seen["unknown_tool"] = "error: " + str(e)
            await client.send_ping()
            seen["alive"] = True
    print(json.dumps(seen))


asyncio.run(main())
