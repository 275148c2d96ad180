// The whole loop of an agent using compactd: create a session, append a call and its result,
// get the context ready to send, compact, follow events. `node examples/loop.js [SOCKET]`.
// Type-checked against index.d.ts (`npm run typecheck`).
import { Client } from "../index.js";

const c = new Client(process.argv[2]);
const events = await c.events();
await c.createSession({ id: "example", context_limit: 32000 });
await c.append("example", { role: "user", content: "List the files, then summarize." });
for (let i = 0; i < 8; i++) {                     // eight steps of a call and its result
  await c.append("example", [
    { role: "assistant", parts: [{ type: "tool_call", id: `c${i}`, name: "bash", args: { command: "ls" } }] },
    { role: "tool", parts: [{ type: "tool_result", call_id: `c${i}`, output: "README.md\nsrc\n" }] },
  ]);
}
const body = await c.context("example", { format: "openai" });
console.log(`${body.messages.length} messages ready for the model`);
// Were the model to refuse it as longer than its window, pass its answer on and ask again:
//   await c.overflow("example", error.error, { compactionNum: body.compaction_num });
//   body = await c.context("example", { format: "openai" });  // compacted to the window it named
// The model's answer, with the usage its call reported and the context it was sent with (a
// compaction that lands while the call is out makes that usage stale: it is then not counted).
await c.append(
  "example",
  { role: "assistant", content: "README.md and src." },
  { inputTokens: 1200, compactionNum: body.compaction_num },
);
if (!(await c.summarize("example")).compacted) throw new Error("nothing was compacted");
for await (const event of events) {
  console.log(event.event);
  if (event.event === "compaction_finished" || event.event === "compaction_failed") break;
}
events.close();
await c.deleteSession("example");
