// Types of compactd-client (index.js): compactd's v1 API. Every endpoint: docs/API.md.

export type Role = "user" | "assistant" | "system" | "tool";

export type Part =
  | { type: "text"; text: string }
  | { type: "reasoning"; text: string }
  | { type: "tool_call"; id: string; name: string; args?: unknown }
  | { type: "tool_result"; call_id: string; output: string; name?: string; is_error?: boolean };

/** A message: parts, or `content` as a shorthand for one text part. */
export type Message = { role: Role; parts: Part[] } | { role: Role; content: string };

export type Trigger = "tokens" | "messages" | "manual";

export interface Session {
  id: string;
  model: string | null;
  context_limit: number;
  config: Record<string, unknown>;
  created_at: string;
  updated_at: string;
  message_count: number;
  active_messages: number;
  compaction_count: number;
  tokens: number;
  token_source: "estimated" | "reported";
  /** Once the model has reported usage: tokens it counted per token compactd estimated (1 to 4), kept across compactions. */
  report_rate?: number;
  /** Why context_limit is what it is (proxied sessions), e.g. "upstream refusal". */
  limit_source?: string;
  /** The completion the client asks room for beside each prompt (a proxied call's max_tokens): token_threshold leaves it free. */
  completion_tokens?: number;
  token_threshold: number;
  max_messages: number;
  compacting: boolean;
  breaker: { attempts: number; threshold: number; open: boolean };
}

export interface Compaction {
  compaction_num: number;
  summary: string;
  read_files: string[];
  modified_files: string[];
  created_files: string[];
  deleted_files: string[];
  pre_tokens: number;
  post_tokens: number;
  session_id: string;
  trigger: Trigger;
  focus: string | null;
  first_seq: number;
  boundary_seq: number;
  summarizer: string;
  chunks: number;
  fallback_reason: string | null;
  started_at: string;
  finished_at: string;
  duration_ms: number;
}

export interface AppendResult {
  session_id: string;
  first_seq: number;
  last_seq: number;
  message_count: number;
  tokens: number;
  token_source: "estimated" | "reported";
  created: boolean;
  replayed?: boolean;
  compaction: {
    trigger: Trigger | null;
    status: "started" | "in_progress" | "completed" | "failed" | "breaker_open" | "not_needed";
    reason?: string;
    result?: Compaction;
  } | null;
}

export interface StoredMessage {
  seq: number;
  role: Role;
  parts: Part[];
  tokens: number;
  created_at: string;
  pinned?: boolean;
  masked?: boolean;
}

export interface HistoryPage {
  messages: (StoredMessage & { compacted: boolean })[];
  next_after?: number;
}

export interface ContextView {
  session_id: string;
  messages: (StoredMessage | { role: "user"; parts: Part[]; summary: true; compaction_num: number })[];
  tokens: number;
  context_limit: number;
  compaction_num: number;
}

/** Chat Completions messages (format "openai") or Messages API system and messages ("anthropic"). */
export interface ProviderContext {
  session_id: string;
  format: "openai" | "anthropic";
  system?: string;
  messages: Record<string, unknown>[];
  tokens: number;
  context_limit: number;
  compaction_num: number;
}

export type SummarizeOutcome = ({ compacted: true } & Compaction) | { compacted: false; reason: string };

export interface CompactionHistory {
  compactions: Compaction[];
  next_after?: number;
  failures: { id: number; trigger: Trigger; focus: string | null; summarizer: string; reason: string; started_at: string; finished_at: string; duration_ms: number }[];
  failures_next_after?: number;
  maskings: { id: number; through_seq: number; outputs: number; pre_tokens: number; post_tokens: number; created_at: string }[];
  maskings_next_after?: number;
}

export interface OverflowOutcome {
  /** False when a compaction landed since the refused call was sent: the next context is that one. */
  noted: boolean;
  tokens?: number;
  context_limit?: number;
  session: Session;
  compaction: { trigger: Trigger | null; status: string; reason?: string } | null;
}

export type Event =
  | { event: "compaction_started"; session_id: string; trigger: Trigger }
  | { event: "compaction_finished"; session_id: string; trigger: Trigger; compaction_num: number; pre_tokens: number; post_tokens: number; boundary_seq: number; summarizer: string; chunks: number; fallback_reason: string | null; duration_ms: number }
  | { event: "compaction_failed"; session_id: string; trigger: Trigger; reason: string }
  | { event: "outputs_masked"; session_id: string; through_seq: number; outputs: number; pre_tokens: number; post_tokens: number }
  | { event: "breaker_open"; session_id: string; attempts: number; threshold: number }
  | { event: "config_reloaded"; path: string }
  | { event: "config_rejected"; path: string; error: string }
  | { event: "lagged" };

export declare class CompactdError extends Error {
  status: number;
  code: string;
  detail: string;
  constructor(status: number, code: string, message: string);
}

export declare class NotRunning extends CompactdError {
  socketPath: string;
}

export declare function defaultSocket(): string;

export declare class EventStream implements AsyncIterable<Event> {
  [Symbol.asyncIterator](): AsyncIterator<Event>;
  close(): void;
}

export declare class Client {
  socketPath: string;
  appendRetryMs: number;
  constructor(socketPath?: string);
  request(method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<any>;
  health(): Promise<{ status: "ok" | "refusing_writes"; writes_refused?: string; version: string; uptime_s: number; pid: number; summarizer: string; database: string; config: { path: string | null; exists: boolean; error: string | null; reloads: number } }>;
  createSession(options?: { id?: string; model?: string; context_limit?: number; config?: Record<string, unknown> }): Promise<Session>;
  sessions(): Promise<Session[]>;
  session(id: string): Promise<Session>;
  updateSession(id: string, changes: { model?: string; context_limit?: number; config?: Record<string, unknown> }): Promise<Session>;
  deleteSession(id: string): Promise<{ deleted: true; id: string }>;
  append(id: string, messages: Message | Message[], options?: { wait?: boolean; inputTokens?: number; compactionNum?: number }): Promise<AppendResult>;
  messages(id: string, options?: { after?: number; limit?: number }): Promise<HistoryPage>;
  context(id: string, options?: { format?: "compactd"; wait?: boolean }): Promise<ContextView>;
  context(id: string, options: { format: "openai" | "anthropic"; wait?: boolean }): Promise<ProviderContext>;
  summarize(id: string, focus?: string): Promise<SummarizeOutcome>;
  overflow(id: string, error?: unknown, options?: { compactionNum?: number; tokens?: number; contextLimit?: number }): Promise<OverflowOutcome>;
  compactions(id: string, options?: { after?: number; limit?: number }): Promise<CompactionHistory>;
  events(): Promise<EventStream>;
}
