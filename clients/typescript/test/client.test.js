// The TypeScript/JavaScript client against a real daemon: every endpoint, errors, events, a
// restart during an append. COMPACTD_BIN names the binary (else the repository's target/).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Client, CompactdError, NotRunning } from "../index.js";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const bin =
  process.env.COMPACTD_BIN ||
  ["release", "debug"].map((p) => path.join(repo, "target", p, "compactd")).find((p) => fs.existsSync(p));

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "compactd-ts-"));
const socket = path.join(dir, "compactd.sock");
fs.writeFileSync(path.join(dir, "config.toml"), "[compaction]\nmax_messages = 8\n");
let daemon;
const c = new Client(socket);

async function start() {
  daemon = spawn(bin, ["--socket", socket, "serve", "--db", path.join(dir, "compactd.db"), "--config", path.join(dir, "config.toml")], { stdio: "ignore" });
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      await c.health();
      return;
    } catch (e) {
      if (!(e instanceof NotRunning) || Date.now() > deadline) throw e;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

const stopped = () => new Promise((resolve) => daemon.once("exit", resolve));

before(start);
after(async () => {
  const exit = stopped();
  daemon.kill("SIGTERM");
  await exit;
  fs.rmSync(dir, { recursive: true, force: true });
});

const round = (i, output) => [
  { role: "assistant", parts: [{ type: "tool_call", id: `c${i}`, name: "bash", args: { command: `cat m${i}.py` } }] },
  { role: "tool", parts: [{ type: "tool_result", call_id: `c${i}`, output }] },
];

test("sessions, messages, contexts, compaction", async () => {
  const created = await c.createSession({ id: "ts", context_limit: 32000, model: "m" });
  assert.equal(created.context_limit, 32000);
  const first = await c.append("ts", { role: "user", content: "Fix the parser" });
  assert.deepEqual([first.first_seq, first.last_seq], [1, 1]);
  const statuses = [];
  for (let i = 0; i < 5; i++) {
    const answer = await c.append("ts", round(i, "x".repeat(400)), { wait: true });
    if (answer.compaction) statuses.push(answer.compaction.status);
  }
  assert.deepEqual(statuses, ["completed"]);
  assert.equal((await c.session("ts")).compaction_count, 1);
  assert.deepEqual((await c.sessions()).map((s) => s.id), ["ts"]);

  const ctx = await c.context("ts");
  assert.ok(ctx.messages.some((m) => "summary" in m && m.summary));
  const openai = await c.context("ts", { format: "openai" });
  assert.equal(openai.messages[0].role, "user");
  assert.ok(openai.messages.some((m) => m.role === "tool"));
  const anthropic = await c.context("ts", { format: "anthropic" });
  assert.equal(anthropic.messages[0].role, "user");

  const page = await c.messages("ts", { limit: 2 });
  assert.deepEqual(page.messages.map((m) => m.seq), [1, 2]);
  assert.equal(page.next_after, 2);
  const history = await c.compactions("ts");
  assert.match(history.compactions[0].summary, /## 9\. Optional Next Step/);
  const manual = await c.summarize("ts", "the parser");
  assert.equal(typeof manual.compacted, "boolean");
  // The usage of a call sent with the context before that compaction is not counted.
  const ok = { role: "assistant", content: "ok" };
  const late = await c.append("ts", ok, { inputTokens: 9000, compactionNum: ctx.compaction_num });
  assert.equal(late.token_source, manual.compacted ? "estimated" : "reported");
  const sent = (await c.context("ts")).compaction_num;
  const now = await c.append("ts", ok, { inputTokens: 9000, compactionNum: sent });
  // 9,000 and the answer ("ok", one token) at the report's rate (at most 4 a token).
  assert.equal(now.token_source, "reported");
  assert.ok(now.tokens >= 9001 && now.tokens <= 9004, JSON.stringify(now));
  // The model refused the context as too long: passed on, the window it named is the
  // session's limit and what it counted the session's tokens.
  const refusal = { type: "error", error: { type: "invalid_request_error",
    message: "prompt is too long: 30000 tokens > 20000 maximum" } };
  const told = await c.overflow("ts", refusal, { compactionNum: (await c.context("ts")).compaction_num });
  assert.deepEqual([told.noted, told.tokens, told.context_limit], [true, 30000, 20000]);
  assert.equal((await c.session("ts")).context_limit, 20000);
  assert.ok((await c.context("ts")).tokens <= 20000);
  await assert.rejects(c.overflow("ts", { error: { type: "rate_limit_error", message: "slow down" } }),
    (e) => e.status === 400 && e.code === "bad_request");
  const rate = (await c.session("ts")).report_rate;
  assert.ok(rate >= 1 && rate <= 4, String(rate));
  assert.equal((await c.updateSession("ts", { model: "m2" })).model, "m2");
  assert.equal((await c.deleteSession("ts")).deleted, true);
});

test("errors are typed", async () => {
  await assert.rejects(c.session("ghost"), (e) => e instanceof CompactdError && e.status === 404 && e.code === "not_found");
  await assert.rejects(
    c.append("ts2", { role: "tool", parts: [{ type: "tool_result", call_id: "nope", output: "" }] }),
    (e) => e instanceof CompactdError && e.code === "unknown_call",
  );
  await assert.rejects(new Client(path.join(dir, "nobody.sock")).health(), (e) => e instanceof NotRunning);
});

test("events arrive in order", async () => {
  const events = await c.events();
  const messages = [{ role: "user", content: "go" }, ...round(0, "y"), ...round(1, "y"), ...round(2, "y"), ...round(3, "y")];
  await c.append("ev", messages, { wait: true });
  const kinds = [];
  for await (const event of events) {
    kinds.push(event.event);
    if (event.event === "compaction_finished") {
      assert.equal(event.session_id, "ev");
      break;
    }
  }
  events.close();
  assert.deepEqual(kinds, ["compaction_started", "compaction_finished"]);
});

test("an append during a restart lands once", async () => {
  await c.append("r", { role: "user", content: "before" });
  const exit = stopped();
  daemon.kill("SIGKILL");
  await exit;
  const during = c.append("r", { role: "user", content: "during" });
  await start();
  assert.equal((await during).last_seq, 2);
  const texts = (await c.messages("r")).messages.map((m) => m.parts[0].text);
  assert.deepEqual(texts, ["before", "during"]);
});
