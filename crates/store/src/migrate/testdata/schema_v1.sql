-- compactd's database: sessions, their messages, and the history of compactions.
--
-- This file is the one schema; the daemon applies it through `PRAGMA user_version` migrations
-- (src/store/migrate.rs). It is meant to be read cold:
--
--   sqlite3 ~/.local/share/compactd/compactd.db 'select * from compaction_history'
--   sqlite3 compactd.db 'select * from session_overview'
--   sqlite3 compactd.db "select seq, role, text from message_text where session_id = 'demo'"
--
-- Nothing is ever deleted. A compaction does not remove messages: it records a boundary, and
-- "compacted" means "seq below the session's latest boundary". Deleting a session only marks it.
-- Timestamps are UTC text in ISO 8601 (2026-11-30T12:00:00.000Z), so they sort and read as is.

-- One agent conversation.
CREATE TABLE sessions (
    id                  TEXT PRIMARY KEY,               -- [A-Za-z0-9._:-]{1,128}, chosen by the client or generated
    model               TEXT,                           -- the agent's model, as the client named it (informational)
    context_limit       INTEGER NOT NULL,               -- the model's context window, in tokens
    overrides           TEXT NOT NULL DEFAULT '{}'      -- per-session [compaction] settings, a JSON object
                        CHECK (json_valid(overrides)),
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL,                  -- last append, compaction or change
    deleted_at          TEXT,                           -- set by DELETE /session/{id}; the rows stay
    -- Counters kept in step with every write, so deciding whether to compact reads one row:
    message_count       INTEGER NOT NULL DEFAULT 0,     -- messages ever appended (= the highest seq)
    active_from_seq     INTEGER NOT NULL DEFAULT 1,     -- first message not compacted (the latest boundary)
    active_messages     INTEGER NOT NULL DEFAULT 0,     -- messages with seq >= active_from_seq
    active_tokens       INTEGER NOT NULL DEFAULT 0,     -- their estimated tokens
    summary_tokens      INTEGER NOT NULL DEFAULT 0,     -- estimated tokens of the latest summary message
    compaction_count    INTEGER NOT NULL DEFAULT 0,     -- successful compactions (= the latest compaction num)
    reported_tokens     INTEGER,                        -- usage.input_tokens the agent last reported, if any
    tokens_since_report INTEGER NOT NULL DEFAULT 0,     -- estimated tokens appended after that report
    turn_start_seq      INTEGER NOT NULL DEFAULT 0,     -- seq of the user message that opened the current turn
    turn_attempts       INTEGER NOT NULL DEFAULT 0      -- automatic compaction attempts in this turn (circuit breaker)
);

-- Every message ever appended, in order. Append-only.
CREATE TABLE messages (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES sessions(id),
    seq         INTEGER NOT NULL,                       -- 1, 2, 3, ... within the session
    role        TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    parts       TEXT NOT NULL CHECK (json_valid(parts)),-- JSON array: text, reasoning, tool_call, tool_result parts
    tokens      INTEGER NOT NULL,                       -- estimated tokens (about 4 characters each)
    created_at  TEXT NOT NULL,
    UNIQUE (session_id, seq)
);

-- The tool calls of each session, so a tool_result can be checked against its call.
CREATE TABLE tool_calls (
    session_id  TEXT NOT NULL REFERENCES sessions(id),
    call_id     TEXT NOT NULL,                          -- the id the agent gave the call
    seq         INTEGER NOT NULL,                       -- the message that made the call (latest, if reused)
    name        TEXT NOT NULL,                          -- the tool's name
    PRIMARY KEY (session_id, call_id)
) WITHOUT ROWID;

-- One row per successful compaction (the spec's CompactionResult and how it came about).
CREATE TABLE compactions (
    id              INTEGER PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES sessions(id),
    num             INTEGER NOT NULL,                   -- compaction_num: 1, 2, 3, ... per session
    trigger         TEXT NOT NULL CHECK (trigger IN ('messages', 'tokens', 'manual')),
    focus           TEXT,                               -- instructions of a manual compaction, if any
    summary         TEXT NOT NULL,                      -- the 9-section summary that replaced seq first_seq .. boundary_seq-1
    read_files      TEXT NOT NULL CHECK (json_valid(read_files)),     -- JSON array of paths read in the session
    modified_files  TEXT NOT NULL CHECK (json_valid(modified_files)), -- JSON array of paths modified
    pre_tokens      INTEGER NOT NULL,                   -- estimated context tokens before
    post_tokens     INTEGER NOT NULL,                   -- estimated context tokens after (summary + tail)
    first_seq       INTEGER NOT NULL,                   -- first message this compaction summarized
    boundary_seq    INTEGER NOT NULL,                   -- first message kept verbatim
    summarizer      TEXT NOT NULL,                      -- e.g. 'extractive', 'openai:gpt-4o-mini'
    chunks          INTEGER NOT NULL DEFAULT 1,         -- summarizer calls (more than 1 when chunked)
    fallback_reason TEXT,                               -- set when the fallback summarizer wrote it: why the model failed
    started_at      TEXT NOT NULL,
    finished_at     TEXT NOT NULL,
    duration_ms     INTEGER NOT NULL,
    UNIQUE (session_id, num)
);

-- Every compaction attempt that failed. The session was left exactly as it was.
CREATE TABLE compaction_failures (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES sessions(id),
    trigger     TEXT NOT NULL CHECK (trigger IN ('messages', 'tokens', 'manual')),
    focus       TEXT,
    summarizer  TEXT NOT NULL,
    reason      TEXT NOT NULL,                          -- why: timeout, HTTP status, blank summary, ...
    started_at  TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    duration_ms INTEGER NOT NULL
);
CREATE INDEX compaction_failures_by_session ON compaction_failures (session_id, id);

-- Compactions, newest first, with what they saved.
CREATE VIEW compaction_history AS
SELECT c.session_id,
       c.num,
       c.trigger,
       c.finished_at                              AS compacted_at,
       c.pre_tokens,
       c.post_tokens,
       c.pre_tokens - c.post_tokens               AS saved_tokens,
       c.first_seq,
       c.boundary_seq,
       json_array_length(c.read_files)            AS read_files,
       json_array_length(c.modified_files)        AS modified_files,
       c.summarizer,
       c.chunks,
       c.fallback_reason,
       c.duration_ms,
       c.focus
FROM compactions c
ORDER BY c.finished_at DESC, c.id DESC;

-- Sessions at a glance.
CREATE VIEW session_overview AS
SELECT s.id,
       s.model,
       s.context_limit,
       s.message_count,
       s.active_messages,
       s.summary_tokens + s.active_tokens         AS context_tokens,
       s.compaction_count,
       (SELECT count(*) FROM compaction_failures f WHERE f.session_id = s.id) AS failed_compactions,
       s.created_at,
       s.updated_at,
       s.deleted_at
FROM sessions s
ORDER BY s.updated_at DESC;

-- Every message with its text parts joined, and whether it has been compacted.
CREATE VIEW message_text AS
SELECT m.session_id,
       m.seq,
       m.role,
       m.seq < s.active_from_seq                  AS compacted,
       (SELECT group_concat(
                   CASE json_extract(p.value, '$.type')
                       WHEN 'text'        THEN json_extract(p.value, '$.text')
                       WHEN 'reasoning'   THEN '[reasoning] ' || json_extract(p.value, '$.text')
                       WHEN 'tool_call'   THEN '[tool_call ' || json_extract(p.value, '$.name') || '] ' || json_extract(p.value, '$.args')
                       WHEN 'tool_result' THEN '[tool_result ' || json_extract(p.value, '$.call_id') || '] ' || json_extract(p.value, '$.output')
                   END, char(10))
        FROM json_each(m.parts) p)                AS text,
       m.tokens,
       m.created_at
FROM messages m JOIN sessions s ON s.id = m.session_id;
