"""A thin, typed client for compactd's v1 API over its Unix socket. Standard library only.

    from compactd import Client
    c = Client()                                   # the daemon's default socket
    c.append("demo", {"role": "user", "content": "Fix the parser"})
    body = c.context("demo", format="openai")      # {"messages": [...], ...}: ready to send

docs/API.md in the compactd repository describes every endpoint; the answers are plain dicts
shaped as the TypedDicts below say.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import uuid
from typing import Any, Dict, List, Optional, Union

try:  # 3.11+
    from typing import NotRequired, TypedDict
except ImportError:  # pragma: no cover - 3.9, 3.10
    from typing import TypedDict

    NotRequired = Optional  # type: ignore[misc,assignment]

__all__ = [
    "Client",
    "CompactdError",
    "NotRunning",
    "default_socket",
    "Event",
    "EventStream",
    "Message",
    "Session",
    "AppendResult",
    "Context",
]

Message = Dict[str, Any]
"""`{"role": "user"|"assistant"|"system"|"tool", "parts": [...]}` or `{"role", "content"}`."""


class Breaker(TypedDict):
    attempts: int
    threshold: int
    open: bool


class Session(TypedDict):
    id: str
    model: Optional[str]
    context_limit: int
    config: Dict[str, Any]
    created_at: str
    updated_at: str
    message_count: int
    active_messages: int
    compaction_count: int
    tokens: int
    token_source: str
    # Once the model has reported usage: tokens it counted per token compactd estimated
    # (1 to 4), kept across compactions.
    report_rate: NotRequired[float]
    token_threshold: int
    max_messages: int
    compacting: bool
    breaker: Breaker
    # Why context_limit is what it is (proxied sessions): the model table, [proxy.models],
    # a header, the default, or "upstream refusal" (the window a refusal named).
    limit_source: NotRequired[str]
    # The completion the client asks room for beside each prompt (a proxied call's
    # max_tokens): token_threshold leaves it free.
    completion_tokens: NotRequired[int]


class CompactionStatus(TypedDict):
    trigger: Optional[str]
    status: str
    reason: NotRequired[str]
    result: NotRequired[Dict[str, Any]]


class AppendResult(TypedDict):
    session_id: str
    first_seq: int
    last_seq: int
    message_count: int
    tokens: int
    token_source: str
    created: bool
    replayed: NotRequired[bool]
    compaction: Optional[CompactionStatus]


class Context(TypedDict):
    session_id: str
    messages: List[Dict[str, Any]]
    tokens: int
    context_limit: int
    compaction_num: int
    format: NotRequired[str]
    system: NotRequired[str]


class Event(TypedDict):
    event: str
    session_id: NotRequired[str]


class CompactdError(Exception):
    """The daemon refused a request: `status`, `code` (e.g. "unknown_call"), `message`."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{message} (HTTP {status}, {code})")
        self.status = status
        self.code = code
        self.message = message


class NotRunning(CompactdError):
    """No daemon answers on the socket."""

    def __init__(self, path: str, reason: str):
        super().__init__(0, "not_running", f"no compactd is answering on {path} ({reason})")
        self.path = path


def default_socket() -> str:
    """The socket rule: $COMPACTD_SOCKET, else $XDG_RUNTIME_DIR/compactd/compactd.sock, else
    $TMPDIR/compactd-$UID/compactd.sock."""
    if os.environ.get("COMPACTD_SOCKET"):
        return os.environ["COMPACTD_SOCKET"]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "compactd", "compactd.sock")
    tmp = os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(tmp, f"compactd-{os.getuid()}", "compactd.sock")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]):
        super().__init__("compactd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if self.timeout is not None:
                sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class Client:
    """One daemon, at `socket_path` (default: `default_socket()`)."""

    #: How long `append` keeps retrying a refused or dropped connection (a restart).
    append_retry_seconds = 10.0

    def __init__(self, socket_path: Optional[str] = None, timeout: Optional[float] = 120.0):
        self.socket_path = socket_path or default_socket()
        self.timeout = timeout

    # -- transport ----------------------------------------------------------------------

    def _open(self, method: str, path: str, body: Any = None,
              headers: Optional[Dict[str, str]] = None,
              timeout: Optional[float] = -1.0) -> "tuple[_UnixConnection, http.client.HTTPResponse]":
        conn = _UnixConnection(self.socket_path, self.timeout if timeout == -1.0 else timeout)
        data = None if body is None else json.dumps(body).encode()
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        try:
            conn.request(method, path, body=data, headers=all_headers)
            return conn, conn.getresponse()
        except (FileNotFoundError, ConnectionRefusedError) as e:
            conn.close()
            raise NotRunning(self.socket_path, e.strerror or str(e)) from e
        except BaseException:
            conn.close()
            raise

    def request(self, method: str, path: str, body: Any = None,
                headers: Optional[Dict[str, str]] = None) -> Any:
        """Any endpoint: the JSON answer, or `CompactdError` for an error status."""
        conn, response = self._open(method, path, body, headers)
        try:
            raw = response.read()
        finally:
            response.close()
            conn.close()
        try:
            value = json.loads(raw) if raw else None
        except ValueError:
            value = None
        if 200 <= response.status < 300:
            return value
        error = (value or {}).get("error", {}) if isinstance(value, dict) else {}
        raise CompactdError(response.status, error.get("code", "unknown"),
                            error.get("message", raw.decode(errors="replace")))

    # -- endpoints ----------------------------------------------------------------------

    def health(self) -> Dict[str, Any]:
        return self.request("GET", "/v1/health")

    def create_session(self, id: Optional[str] = None, *, context_limit: Optional[int] = None,
                       model: Optional[str] = None,
                       config: Optional[Dict[str, Any]] = None) -> Session:
        body = {k: v for k, v in {"id": id, "context_limit": context_limit, "model": model,
                                  "config": config}.items() if v is not None}
        return self.request("POST", "/v1/session", body)

    def sessions(self) -> List[Session]:
        """Every session, in id order (the daemon answers in pages; this follows them)."""
        sessions: List[Session] = []
        after = ""
        while True:
            page = self.request("GET", f"/v1/session?after={after}")
            sessions.extend(page["sessions"])
            if not page.get("next_after"):
                return sessions
            after = page["next_after"]

    def session(self, id: str) -> Session:
        return self.request("GET", f"/v1/session/{id}")

    def update_session(self, id: str, *, context_limit: Optional[int] = None,
                       model: Optional[str] = None,
                       config: Optional[Dict[str, Any]] = None) -> Session:
        body = {k: v for k, v in {"context_limit": context_limit, "model": model,
                                  "config": config}.items() if v is not None}
        return self.request("PATCH", f"/v1/session/{id}", body)

    def delete_session(self, id: str) -> Dict[str, Any]:
        return self.request("DELETE", f"/v1/session/{id}")

    def append(self, id: str, messages: Union[Message, List[Message]], *,
               input_tokens: Optional[int] = None, compaction_num: Optional[int] = None,
               wait: bool = False) -> AppendResult:
        """Appends one message or a list, at most once: the request carries an Idempotency-Key
        and a refused or dropped connection (a daemon restarting) is retried with it.
        `input_tokens` is the model call's usage; `compaction_num` that of the context the call
        was sent with (a report of a context compacted since is then not counted)."""
        body: Dict[str, Any] = {"messages": messages if isinstance(messages, list) else [messages],
                                "wait": wait}
        if input_tokens is not None:
            body["usage"] = {"input_tokens": input_tokens}
            if compaction_num is not None:
                body["usage"]["compaction_num"] = compaction_num
        headers = {"Idempotency-Key": f"py-{uuid.uuid4()}"}
        deadline = time.monotonic() + self.append_retry_seconds
        pause = 0.05
        while True:
            try:
                return self.request("POST", f"/v1/session/{id}/message", body, headers)
            except NotRunning:
                if not os.path.exists(self.socket_path) or time.monotonic() + pause > deadline:
                    raise
            except CompactdError as e:
                if e.code not in ("busy", "shutting_down") or time.monotonic() + pause > deadline:
                    raise
            except (ConnectionError, http.client.HTTPException):
                if time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def messages(self, id: str, *, after: int = 0, limit: int = 100) -> Dict[str, Any]:
        """One page of the stored history: `{"messages": [...], "next_after"?: seq}`."""
        return self.request("GET", f"/v1/session/{id}/message?after={after}&limit={limit}")

    def context(self, id: str, *, format: str = "compactd", wait: bool = True) -> Context:
        """What to send to the model now. `format="openai"` or `"anthropic"`: ready to send
        (`messages`, and `system` for Anthropic)."""
        return self.request("GET", f"/v1/session/{id}/context?format={format}"
                                   f"&wait={'true' if wait else 'false'}")

    def summarize(self, id: str, focus: Optional[str] = None) -> Dict[str, Any]:
        """Compacts now: `{"compacted": true, "summary": ..., ...}` or
        `{"compacted": false, "reason": ...}`."""
        return self.request("POST", f"/v1/session/{id}/summarize",
                            {"focus": focus} if focus else {})

    def overflow(self, id: str, error: Any = None, *, compaction_num: Optional[int] = None,
                 tokens: Optional[int] = None, context_limit: Optional[int] = None) -> Dict[str, Any]:
        """The model refused the context as longer than its window: pass its error answer on
        (the body, its text, or the SDK's exception body) and `compaction_num` of the context
        sent; the next `context(id)` fits the window it named. `{"noted": ..., "session": ...}`."""
        body: Dict[str, Any] = {}
        for key, value in (("error", error), ("compaction_num", compaction_num),
                           ("tokens", tokens), ("context_limit", context_limit)):
            if value is not None:
                body[key] = value
        return self.request("POST", f"/v1/session/{id}/overflow", body)

    def compactions(self, id: str, *, after: int = 0, limit: int = 100) -> Dict[str, Any]:
        return self.request("GET", f"/v1/session/{id}/compaction?after={after}&limit={limit}")

    def events(self, timeout: Optional[float] = None) -> "EventStream":
        """Subscribes now; iterate for every event from this moment on, as dicts
        (`event["event"]` is the kind), until the daemon stops. Close it when done."""
        conn, response = self._open("GET", "/v1/events", timeout=timeout)
        if response.status != 200:
            response.close()
            conn.close()
            raise CompactdError(response.status, "events", "cannot subscribe to events")
        return EventStream(conn, response)


class EventStream:
    """Server-sent events as dicts; keep-alive comments skipped. Ends when the daemon stops."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse):
        self._conn = conn
        self._response = response

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> Event:
        data: List[str] = []
        while True:
            line = self._response.readline()
            if not line:
                self.close()
                raise StopIteration
            text = line.decode().rstrip("\r\n")
            if text.startswith("data:"):
                data.append(text[5:].lstrip())
            elif text == "" and data:
                return json.loads("\n".join(data))

    def close(self) -> None:
        self._response.close()
        self._conn.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
