"""The whole loop of an agent using compactd: create a session, append a call and its result,
get the context in a provider's format, compact, and follow events. Run it against a running
daemon: `python3 examples/loop.py [SOCKET]`."""

import sys

import compactd

c = compactd.Client(sys.argv[1] if len(sys.argv) > 1 else None)
events = c.events(timeout=30)
c.create_session("example", context_limit=32000)
c.append("example", {"role": "user", "content": "List the files, then summarize."})
for i in range(8):                                  # eight steps of a call and its result
    c.append("example", [
        {"role": "assistant", "parts": [{"type": "tool_call", "id": f"c{i}", "name": "bash", "args": {"command": "ls"}}]},
        {"role": "tool", "parts": [{"type": "tool_result", "call_id": f"c{i}", "output": "README.md\nsrc\n"}]},
    ])
body = c.context("example", format="openai")        # {"messages": [...]}: send it to the model
print(f"{len(body['messages'])} messages ready for the model")
# Were the model to refuse it as longer than its window, pass its answer on and ask again:
#   c.overflow("example", error.body, compaction_num=body["compaction_num"])
#   body = c.context("example", format="openai")    # compacted to the window it named
# The model's answer, with the usage its call reported and the context it was sent with (a
# compaction that lands while the call is out makes that usage stale: it is then not counted).
c.append("example", {"role": "assistant", "content": "README.md and src."},
         input_tokens=1200, compaction_num=body["compaction_num"])
if not c.summarize("example")["compacted"]:
    sys.exit("nothing was compacted")
for event in events:                                # compaction_started, compaction_finished
    print(event["event"])
    if event["event"] in ("compaction_finished", "compaction_failed"):
        break
events.close()
c.delete_session("example")
