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
-- Pinned messages (system messages, and the session's task when small enough) are never
-- compacted: a context holds them first, then the latest summary, then the active messages.
-- Timestamps are UTC text in ISO 8601 (2026-11-30T12:00:00.000Z), so they sort and read as is.
--
-- Read it freely while the daemon runs (sqlite3, Python, .backup, VACUUM INTO, .dump): that is
-- what it is for. Change nothing by hand: the triggers at the end refuse every write that does
-- not come from compactd, since a row added, changed or deleted by hand slips past the
-- counters compactd keeps in step with every write (use the API or CLI instead).
-- Nullable JSON columns are checked as `col IS NULL OR json_valid(col)`, so every sqlite3
-- from 3.37 on checks, dumps and restores the file alike.

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
    active_tokens       INTEGER NOT NULL DEFAULT 0,     -- estimated tokens of those that are not pinned, as the context shows them
    summary_tokens      INTEGER NOT NULL DEFAULT 0,     -- estimated tokens of the latest summary message
    compaction_count    INTEGER NOT NULL DEFAULT 0,     -- successful compactions (= the latest compaction num)
    reported_tokens     INTEGER,                        -- usage.input_tokens the agent last reported, if any
    tokens_since_report INTEGER NOT NULL DEFAULT 0,     -- estimated tokens appended after that report
    turn_start_seq      INTEGER NOT NULL DEFAULT 0,     -- seq of the user message that opened the current turn
    turn_attempts       INTEGER NOT NULL DEFAULT 0,     -- automatic compaction attempts in this turn (circuit breaker)
    pinned_tokens       INTEGER NOT NULL DEFAULT 0,     -- estimated tokens of the pinned messages, which every context holds
    task_seq            INTEGER,                        -- seq of the session's first user instruction (its task), once there is one
    masked_through_seq  INTEGER NOT NULL DEFAULT 0,     -- tool outputs of active messages below this seq are masked in the context
    owner               TEXT,                           -- sessions the proxy made: SHA-256 of the client's API key (never the key); NULL otherwise
    step_calls          INTEGER NOT NULL DEFAULT 0,     -- tool calls of the newest assistant message (its results share the step's room)
    -- A session's counters above describe one branch, the one ending at head_seq (sessions made
    -- through the socket API have one; a proxied conversation branches where its client edits
    -- or rewrites what it sends, see the branch_messages view).
    head_seq            INTEGER NOT NULL DEFAULT 0,     -- the newest message of the current branch
    branch_points       INTEGER NOT NULL DEFAULT 0,     -- messages that start a branch (their parent is not the seq before them)
    summary_num         INTEGER NOT NULL DEFAULT 0,     -- the compaction the current branch's context starts from (0: none)
    kind                TEXT NOT NULL DEFAULT 'api'     -- api: made through the socket API; proxy: a conversation the proxy
                        CHECK (kind IN ('api', 'proxy', 'side')),    -- records; side: a proxied client's one-off calls (titles, commit messages)
    conversation        TEXT,                           -- proxy: SHA-256 of the client's conversation header (never the header itself)
    root_hash           INTEGER,                        -- proxy: fingerprint of the conversation's first message
    task_hash           INTEGER,                        -- proxy: fingerprint of its task (the last user message of its first call)
    static_seq          INTEGER NOT NULL DEFAULT 0,     -- proxy: the client's own prefix (system prompt, examples) ends here; pinned
    overhead_tokens     INTEGER NOT NULL DEFAULT 0,     -- proxy: estimated tokens of the last call's tools, system and instructions
    limit_source        TEXT,                           -- why context_limit is what it is (model table, [proxy.models], header, default)
    token_rate          REAL,                           -- model tokens per estimated token at the last believed usage report (NULL: none yet);
                                                        -- kept across compactions: what a context holds is planned and counted at it
    completion_tokens   INTEGER NOT NULL DEFAULT 0,     -- the completion the client asks room for beside each prompt (a proxied call's max_tokens), in the model's tokens
    limit_taught_at     TEXT                            -- when a refusal of the model's taught context_limit (limit_source 'upstream refusal'), this session's or
                                                        -- the one it started from; the caller's next sessions of the model start from it until the config reloads
);
CREATE INDEX sessions_by_owner ON sessions (owner, root_hash) WHERE owner IS NOT NULL;
CREATE INDEX sessions_taught ON sessions (owner, model, limit_taught_at) WHERE limit_taught_at IS NOT NULL;
CREATE INDEX sessions_by_conversation ON sessions (conversation) WHERE conversation IS NOT NULL;

-- Every message ever appended, in order. Append-only.
CREATE TABLE messages (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES sessions(id),
    seq         INTEGER NOT NULL,                       -- 1, 2, 3, ... within the session
    -- (checked with OR, not IN (...): for a list of three or more, SQLite fills a temporary index on every insert)
    role        TEXT NOT NULL CHECK (role = 'user' OR role = 'assistant' OR role = 'system' OR role = 'tool'),
    parts       TEXT NOT NULL CHECK (json_valid(parts)),-- JSON array: text, reasoning, tool_call, tool_result parts
    tokens      INTEGER NOT NULL,                       -- estimated tokens (about 4 characters each)
    created_at  TEXT NOT NULL,
    pinned      INTEGER NOT NULL DEFAULT 0              -- 1: a system message or the session's task, never compacted
                CHECK (pinned IN (0, 1)),
    tool_results  INTEGER NOT NULL DEFAULT 0,           -- how many tool_result parts the message has
    masked_parts  TEXT                                  -- the parts with each tool output replaced by a placeholder (NULL: no outputs)
                  CHECK (masked_parts IS NULL OR json_valid(masked_parts)),
    masked_tokens INTEGER,                              -- estimated tokens of masked_parts
    shortened_parts TEXT                                -- the parts as a context shows them when too large for it: long outputs
                    CHECK (shortened_parts IS NULL OR json_valid(shortened_parts)), -- keep head and tail (NULL: shown whole)
    shortened_tokens INTEGER,                           -- estimated tokens of shortened_parts
    parent_seq  INTEGER,                                -- the message before it on its branch (NULL: the first); seq - 1 but where a branch starts
    hash        INTEGER,                                -- proxied messages: fingerprint of what the client sends, to match its next call
    media       TEXT                                    -- proxied messages with images or documents: their tokens (in `tokens`), outside tool
                CHECK (media IS NULL OR json_valid(media)), -- results and in each: {"outside": 1399, "results": [["toolu_1", 2347]]}
    UNIQUE (session_id, seq)
);
CREATE INDEX messages_pinned ON messages (session_id, seq) WHERE pinned = 1;
-- The proxy's tree of messages: a node's children by fingerprint (a step down the tree), and
-- each proxied message's fingerprint by seq (a call matched along its branch). Both hold every
-- column those lookups read, so matching a resent conversation never reads a message's row
-- (its parts may run to overflow pages: a call resending 2,000 outputs of 9 KB read 18 MB).
CREATE INDEX messages_by_parent ON messages (session_id, parent_seq, hash, seq) WHERE hash IS NOT NULL;
CREATE INDEX messages_hash_by_seq ON messages (session_id, seq, hash) WHERE hash IS NOT NULL;
CREATE INDEX messages_branch_points ON messages (session_id, seq) WHERE parent_seq IS NOT seq - 1;
-- Messages holding tool results: whether an append leaves outputs worth masking is answered
-- from these alone, not by reading every message of the session.
CREATE INDEX messages_with_results ON messages (session_id, seq, tool_results) WHERE tool_results > 0;
-- Full-text index of every message as appended: its text, tool calls and tool outputs (never
-- the masked or shortened forms), for GET /session/{id}/search. Contentless: the text lives in
-- messages.parts only; rowid = messages.id, session = a token of the session's id.
--   SELECT m.seq FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
--   WHERE messages_fts MATCH 'text : "cargo test"' ORDER BY bm25(messages_fts, 0, 1);
CREATE VIRTUAL TABLE messages_fts USING fts5(session, text, content = '', tokenize = 'unicode61');

-- The tool calls of each session, so a tool_result can be checked against its call.
CREATE TABLE tool_calls (
    session_id  TEXT NOT NULL REFERENCES sessions(id),
    call_id     TEXT NOT NULL,                          -- the id the agent gave the call
    seq         INTEGER NOT NULL,                       -- the message that made the call (latest, if reused)
    name        TEXT NOT NULL,                          -- the tool's name
    PRIMARY KEY (session_id, call_id)
) WITHOUT ROWID;

-- Appends made with an Idempotency-Key: a retry with the same key gets the first answer and
-- appends nothing again (a client that lost the answer to a crash or timeout may retry safely).
CREATE TABLE idempotency_keys (
    session_id   TEXT NOT NULL REFERENCES sessions(id),
    key          TEXT NOT NULL,                         -- the client's Idempotency-Key
    request_hash INTEGER NOT NULL,                      -- fingerprint of the request, to refuse a key reused for another
    first_seq    INTEGER NOT NULL,                      -- the seqs the append was given
    last_seq     INTEGER NOT NULL,
    created_at   TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
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
    modified_files  TEXT NOT NULL CHECK (json_valid(modified_files)), -- JSON array of paths that existed and were changed
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
    created_files   TEXT NOT NULL DEFAULT '[]'          -- JSON array of paths the session made (first touched by a whole-file write)
                    CHECK (json_valid(created_files)),
    deleted_files   TEXT NOT NULL DEFAULT '[]'          -- JSON array of paths the session removed
                    CHECK (json_valid(deleted_files)),
    summary_tokens  INTEGER,                            -- estimated tokens of the summary message (NULL: made before they were kept)
    UNIQUE (session_id, num)
);

-- Every masking of old tool outputs (microcompaction): outputs of active messages before
-- through_seq read as placeholders in the context from then on; nothing stored changes.
CREATE TABLE maskings (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES sessions(id),
    through_seq INTEGER NOT NULL,                       -- outputs of messages below this seq are masked
    outputs     INTEGER NOT NULL,                       -- tool outputs this masking hid
    pre_tokens  INTEGER NOT NULL,                       -- estimated context tokens before
    post_tokens INTEGER NOT NULL,                       -- and after
    created_at  TEXT NOT NULL,
    head_seq    INTEGER                                 -- the newest message of the branch it masked (NULL: made before v17, masks every branch)
);
CREATE INDEX maskings_by_session ON maskings (session_id, id);

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

-- Compactions (summaries and maskings of old outputs), newest first, with what they saved.
CREATE VIEW compaction_history AS
SELECT c.session_id,
       'summary'                                  AS kind,
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
       json_array_length(c.created_files)         AS created_files,
       json_array_length(c.deleted_files)         AS deleted_files,
       c.summarizer,
       c.chunks,
       c.fallback_reason,
       c.duration_ms,
       c.focus
FROM compactions c
UNION ALL
SELECT m.session_id, 'masking', NULL, 'tokens', m.created_at, m.pre_tokens, m.post_tokens,
       m.pre_tokens - m.post_tokens, NULL, m.through_seq, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL
FROM maskings m
ORDER BY compacted_at DESC;

-- Each branch of each session, its messages in order (a session made through the socket
-- API has one; a proxied conversation one per place its client changed what it sends).
-- branch is the seq of the branch's newest message.
CREATE VIEW branch_messages AS
WITH RECURSIVE branch (session_id, branch, seq, parent_seq) AS (
    SELECT m.session_id, m.seq, m.seq, m.parent_seq FROM messages m
    WHERE NOT EXISTS (SELECT 1 FROM messages c WHERE c.session_id = m.session_id AND c.seq = m.seq + 1 AND c.parent_seq = m.seq)
      AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.session_id = m.session_id AND c.parent_seq = m.seq AND c.parent_seq IS NOT c.seq - 1)
    UNION ALL
    SELECT b.session_id, b.branch, p.seq, p.parent_seq FROM branch b
    JOIN messages p ON p.session_id = b.session_id AND p.seq = b.parent_seq
)
SELECT b.session_id, b.branch, b.seq, m.role, m.parts, m.created_at
FROM branch b JOIN messages m ON m.session_id = b.session_id AND m.seq = b.seq
ORDER BY b.session_id, b.branch, b.seq;

-- Sessions at a glance.
CREATE VIEW session_overview AS
SELECT s.id,
       s.kind,
       s.model,
       s.context_limit,
       s.message_count,
       s.active_messages,
       s.pinned_tokens + s.summary_tokens + s.active_tokens + s.overhead_tokens AS context_tokens,
       round(s.token_rate, 2)                     AS token_rate,  -- model tokens per estimated one (NULL: no usage reported)
       s.branch_points + 1                        AS branches,
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
       m.seq < s.active_from_seq AND NOT m.pinned AS compacted,
       m.pinned,
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

-- Only compactd writes to its tables: these triggers refuse every write, naming what to use
-- instead, and compactd's writer connection runs with triggers off (SQLITE_DBCONFIG_ENABLE_TRIGGER,
-- a setting of that one connection, not of the file), so its own writes pay nothing for them
-- (and a trigger of your own on these tables would not fire for them either). Reads, .backup,
-- VACUUM INTO and .dump are never refused; a dump restores (its rows come before its triggers).
CREATE TRIGGER sessions_insert_by_hand BEFORE INSERT ON sessions
BEGIN SELECT RAISE(ABORT, 'compactd: create sessions with `compactd session create` or POST /v1/session'); END;
CREATE TRIGGER sessions_update_by_hand BEFORE UPDATE ON sessions
BEGIN SELECT RAISE(ABORT, 'compactd: change sessions with `compactd session update` or PATCH /v1/session/{id}; its counters are compactd''s'); END;
CREATE TRIGGER sessions_delete_by_hand BEFORE DELETE ON sessions
BEGIN SELECT RAISE(ABORT, 'compactd: sessions are never deleted; `compactd session delete ID` hides one and keeps its rows'); END;
CREATE TRIGGER messages_insert_by_hand BEFORE INSERT ON messages
BEGIN SELECT RAISE(ABORT, 'compactd: append messages with `compactd append` or POST /v1/session/{id}/message'); END;
CREATE TRIGGER messages_update_by_hand BEFORE UPDATE ON messages
BEGIN SELECT RAISE(ABORT, 'compactd: messages are append-only; they are never changed'); END;
CREATE TRIGGER messages_delete_by_hand BEFORE DELETE ON messages
BEGIN SELECT RAISE(ABORT, 'compactd: messages are append-only; they are never deleted'); END;
CREATE TRIGGER tool_calls_insert_by_hand BEFORE INSERT ON tool_calls
BEGIN SELECT RAISE(ABORT, 'compactd: tool_calls is written by compactd only'); END;
CREATE TRIGGER tool_calls_update_by_hand BEFORE UPDATE ON tool_calls
BEGIN SELECT RAISE(ABORT, 'compactd: tool_calls is written by compactd only'); END;
CREATE TRIGGER tool_calls_delete_by_hand BEFORE DELETE ON tool_calls
BEGIN SELECT RAISE(ABORT, 'compactd: tool_calls is written by compactd only'); END;
CREATE TRIGGER idempotency_keys_insert_by_hand BEFORE INSERT ON idempotency_keys
BEGIN SELECT RAISE(ABORT, 'compactd: idempotency_keys is written by compactd only'); END;
CREATE TRIGGER idempotency_keys_update_by_hand BEFORE UPDATE ON idempotency_keys
BEGIN SELECT RAISE(ABORT, 'compactd: idempotency_keys is written by compactd only'); END;
CREATE TRIGGER idempotency_keys_delete_by_hand BEFORE DELETE ON idempotency_keys
BEGIN SELECT RAISE(ABORT, 'compactd: idempotency_keys is written by compactd only'); END;
CREATE TRIGGER compactions_insert_by_hand BEFORE INSERT ON compactions
BEGIN SELECT RAISE(ABORT, 'compactd: compact with `compactd compact ID` or POST /v1/session/{id}/summarize'); END;
CREATE TRIGGER compactions_update_by_hand BEFORE UPDATE ON compactions
BEGIN SELECT RAISE(ABORT, 'compactd: compactions are history; they are never changed'); END;
CREATE TRIGGER compactions_delete_by_hand BEFORE DELETE ON compactions
BEGIN SELECT RAISE(ABORT, 'compactd: compactions are history; they are never deleted'); END;
CREATE TRIGGER maskings_insert_by_hand BEFORE INSERT ON maskings
BEGIN SELECT RAISE(ABORT, 'compactd: maskings is written by compactd only'); END;
CREATE TRIGGER maskings_update_by_hand BEFORE UPDATE ON maskings
BEGIN SELECT RAISE(ABORT, 'compactd: maskings are history; they are never changed'); END;
CREATE TRIGGER maskings_delete_by_hand BEFORE DELETE ON maskings
BEGIN SELECT RAISE(ABORT, 'compactd: maskings are history; they are never deleted'); END;
CREATE TRIGGER compaction_failures_insert_by_hand BEFORE INSERT ON compaction_failures
BEGIN SELECT RAISE(ABORT, 'compactd: compaction_failures is written by compactd only'); END;
CREATE TRIGGER compaction_failures_update_by_hand BEFORE UPDATE ON compaction_failures
BEGIN SELECT RAISE(ABORT, 'compactd: compaction failures are history; they are never changed'); END;
CREATE TRIGGER compaction_failures_delete_by_hand BEFORE DELETE ON compaction_failures
BEGIN SELECT RAISE(ABORT, 'compactd: compaction failures are history; they are never deleted'); END;
