// A thin client for compactd's v1 API over its Unix socket. Node 18+, no dependencies.
// Types: index.d.ts. Every endpoint: docs/API.md in the compactd repository.

import http from "node:http";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { randomUUID } from "node:crypto";

/** The daemon refused a request: `status`, `code` (e.g. "unknown_call"), `message`. */
export class CompactdError extends Error {
  constructor(status, code, message) {
    super(`${message} (HTTP ${status}, ${code})`);
    this.name = "CompactdError";
    this.status = status;
    this.code = code;
    this.detail = message;
  }
}

/** No daemon answers on the socket. */
export class NotRunning extends CompactdError {
  constructor(socketPath, reason) {
    super(0, "not_running", `no compactd is answering on ${socketPath} (${reason})`);
    this.name = "NotRunning";
    this.socketPath = socketPath;
  }
}

/** $COMPACTD_SOCKET, else $XDG_RUNTIME_DIR/compactd/compactd.sock, else $TMPDIR/compactd-$UID/compactd.sock. */
export function defaultSocket() {
  if (process.env.COMPACTD_SOCKET) return process.env.COMPACTD_SOCKET;
  const runtime = process.env.XDG_RUNTIME_DIR;
  if (runtime && path.isAbsolute(runtime)) return path.join(runtime, "compactd", "compactd.sock");
  const uid = typeof process.getuid === "function" ? process.getuid() : 0;
  return path.join(process.env.TMPDIR || os.tmpdir(), `compactd-${uid}`, "compactd.sock");
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class Client {
  /** @param {string} [socketPath] the daemon's socket (default: defaultSocket()) */
  constructor(socketPath) {
    this.socketPath = socketPath || defaultSocket();
    /** How long append() keeps retrying a refused or dropped connection (a restart), in ms. */
    this.appendRetryMs = 10_000;
  }

  /** Any endpoint: the JSON answer, or a CompactdError for an error status. */
  request(method, urlPath, body, headers = {}) {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          socketPath: this.socketPath,
          path: urlPath,
          method,
          headers: {
            host: "compactd",
            "content-type": "application/json",
            ...(data ? { "content-length": data.length } : {}),
            ...headers,
          },
        },
        (res) => {
          const chunks = [];
          res.on("data", (c) => chunks.push(c));
          res.on("error", reject);
          res.on("end", () => {
            const raw = Buffer.concat(chunks).toString();
            let value = null;
            try {
              value = raw ? JSON.parse(raw) : null;
            } catch {
              value = null;
            }
            if (res.statusCode >= 200 && res.statusCode < 300) return resolve(value);
            const error = (value && value.error) || {};
            reject(new CompactdError(res.statusCode, error.code || "unknown", error.message || raw));
          });
        },
      );
      req.on("error", (e) => {
        if (e.code === "ENOENT" || e.code === "ECONNREFUSED") reject(new NotRunning(this.socketPath, e.code));
        else reject(e);
      });
      if (data) req.write(data);
      req.end();
    });
  }

  health() {
    return this.request("GET", "/v1/health");
  }

  createSession(options = {}) {
    return this.request("POST", "/v1/session", options);
  }

  /** Every session, in id order (the daemon answers in pages; this follows them). */
  async sessions() {
    const sessions = [];
    let after = "";
    for (;;) {
      const page = await this.request("GET", `/v1/session?after=${encodeURIComponent(after)}`);
      sessions.push(...page.sessions);
      if (!page.next_after) return sessions;
      after = page.next_after;
    }
  }

  session(id) {
    return this.request("GET", `/v1/session/${id}`);
  }

  updateSession(id, changes) {
    return this.request("PATCH", `/v1/session/${id}`, changes);
  }

  deleteSession(id) {
    return this.request("DELETE", `/v1/session/${id}`);
  }

  /**
   * Appends one message or a list, at most once: the request carries an Idempotency-Key, and a
   * refused or dropped connection (a daemon restarting) is retried with it.
   */
  async append(id, messages, options = {}) {
    const body = { messages: Array.isArray(messages) ? messages : [messages], wait: !!options.wait };
    if (options.inputTokens !== undefined) {
      body.usage = { input_tokens: options.inputTokens };
      if (options.compactionNum !== undefined) body.usage.compaction_num = options.compactionNum;
    }
    const headers = { "idempotency-key": `ts-${randomUUID()}` };
    const deadline = Date.now() + this.appendRetryMs;
    let pause = 50;
    for (;;) {
      try {
        return await this.request("POST", `/v1/session/${id}/message`, body, headers);
      } catch (e) {
        const retry =
          e instanceof NotRunning
            ? fs.existsSync(this.socketPath)
            : e instanceof CompactdError
              ? e.code === "busy" || e.code === "shutting_down"
              : true;
        if (!retry || Date.now() + pause > deadline) throw e;
      }
      await sleep(pause);
      pause = Math.min(pause * 2, 1000);
    }
  }

  /** One page of the stored history: {messages, next_after?}. */
  messages(id, options = {}) {
    return this.request("GET", `/v1/session/${id}/message?after=${options.after ?? 0}&limit=${options.limit ?? 100}`);
  }

  /** What to send to the model now; format "openai" or "anthropic" gives it ready to send. */
  context(id, options = {}) {
    const format = options.format ?? "compactd";
    const wait = options.wait === false ? "false" : "true";
    return this.request("GET", `/v1/session/${id}/context?format=${format}&wait=${wait}`);
  }

  /** Compacts now: {compacted: true, summary, ...} or {compacted: false, reason}. */
  summarize(id, focus) {
    return this.request("POST", `/v1/session/${id}/summarize`, focus ? { focus } : {});
  }

  /**
   * The model refused the context as longer than its window: pass its error answer on (the
   * body, its text, or the SDK's error body) and the compactionNum of the context sent; the
   * next context(id) fits the window it named.
   */
  overflow(id, error, options = {}) {
    const body = {};
    if (error !== undefined && error !== null) body.error = error;
    if (options.compactionNum !== undefined) body.compaction_num = options.compactionNum;
    if (options.tokens !== undefined) body.tokens = options.tokens;
    if (options.contextLimit !== undefined) body.context_limit = options.contextLimit;
    return this.request("POST", `/v1/session/${id}/overflow`, body);
  }

  compactions(id, options = {}) {
    return this.request("GET", `/v1/session/${id}/compaction?after=${options.after ?? 0}&limit=${options.limit ?? 100}`);
  }

  /**
   * Subscribes to the event stream; resolves once subscribed. Iterate with `for await`; the
   * iteration ends when the daemon stops. Call close() when done.
   */
  events() {
    return new Promise((resolve, reject) => {
      const req = http.request(
        { socketPath: this.socketPath, path: "/v1/events", method: "GET", headers: { host: "compactd" } },
        (res) => {
          if (res.statusCode !== 200) {
            res.resume();
            return reject(new CompactdError(res.statusCode, "events", "cannot subscribe to events"));
          }
          resolve(new EventStream(req, res));
        },
      );
      req.on("error", (e) => {
        if (e.code === "ENOENT" || e.code === "ECONNREFUSED") reject(new NotRunning(this.socketPath, e.code));
        else reject(e);
      });
      req.end();
    });
  }
}

/** Server-sent events as objects (`event.event` is the kind); keep-alive comments skipped. */
export class EventStream {
  constructor(req, res) {
    this._req = req;
    this._res = res;
    res.setEncoding("utf8");
  }

  async *[Symbol.asyncIterator]() {
    let buffer = "";
    let data = [];
    for await (const chunk of this._res) {
      buffer += chunk;
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, end).replace(/\r$/, "");
        buffer = buffer.slice(end + 1);
        if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
        else if (line === "" && data.length) {
          const event = JSON.parse(data.join("\n"));
          data = [];
          yield event;
        }
      }
    }
  }

  close() {
    this._req.destroy();
  }
}
