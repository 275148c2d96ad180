//! One typed method per endpoint of the v1 API, answering the protocol's types.

use super::{Client, ClientError, EventStream};
use crate::{
    AppendResponse, CompactionHistory, CompactionQuery, ContextFormat, ContextView,
    CreateSessionRequest, Deleted, Health, HistoryPage, ProviderContext, SearchResults, SessionId,
    SessionList, SessionView, SummarizeOutcome, SummarizeRequest, UpdateSessionRequest,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

impl Client {
    /// A JSON answer as `T`; one that does not parse is a transport error (a daemon of
    /// another version, say).
    fn typed<T: DeserializeOwned>(&self, value: Value) -> Result<T, ClientError> {
        serde_json::from_value(value)
            .map_err(|e| self.transport(format!("unexpected answer from the daemon: {e}")))
    }

    pub async fn health(&self) -> Result<Health, ClientError> {
        let v = self.get("/v1/health").await?;
        self.typed(v)
    }

    pub async fn create_session(
        &self,
        request: &CreateSessionRequest,
    ) -> Result<SessionView, ClientError> {
        let v = self
            .post(
                "/v1/session",
                &serde_json::to_value(request).unwrap_or_default(),
            )
            .await?;
        self.typed(v)
    }

    /// Every session, in id order, page after page.
    pub async fn sessions(&self) -> Result<Vec<SessionView>, ClientError> {
        let mut sessions = Vec::new();
        let mut after = String::new();
        loop {
            let v = self.get(&format!("/v1/session?after={after}")).await?;
            let page = self.typed::<SessionList>(v)?;
            sessions.extend(page.sessions);
            match page.next_after {
                Some(next) => after = next,
                None => return Ok(sessions),
            }
        }
    }

    /// How many sessions the daemon holds, without listing them.
    pub async fn session_count(&self) -> Result<u64, ClientError> {
        let v = self.get("/v1/session?limit=1").await?;
        Ok(self.typed::<SessionList>(v)?.total)
    }

    pub async fn session(&self, id: &SessionId) -> Result<SessionView, ClientError> {
        let v = self.get(&format!("/v1/session/{id}")).await?;
        self.typed(v)
    }

    pub async fn update_session(
        &self,
        id: &SessionId,
        request: &UpdateSessionRequest,
    ) -> Result<SessionView, ClientError> {
        let body = serde_json::to_value(request).unwrap_or_default();
        let v = self.patch(&format!("/v1/session/{id}"), &body).await?;
        self.typed(v)
    }

    pub async fn delete_session(&self, id: &SessionId) -> Result<Deleted, ClientError> {
        let v = self.delete(&format!("/v1/session/{id}")).await?;
        self.typed(v)
    }

    /// Appends `body` (a message, an array, or `{"messages": [...], "wait": ...}`) at most
    /// once, retrying through a restart with one Idempotency-Key ([`Client::append_json`]).
    pub async fn append(
        &self,
        id: &SessionId,
        body: &Value,
    ) -> Result<AppendResponse, ClientError> {
        let v = self.append_json(id, body).await?;
        self.typed(v)
    }

    /// Messages after seq `after`, at most `limit`.
    pub async fn history(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<HistoryPage, ClientError> {
        let v = self
            .get(&format!(
                "/v1/session/{id}/message?after={after}&limit={limit}"
            ))
            .await?;
        self.typed(v)
    }

    /// The session's messages that best match `query` (plain words), at most `limit`.
    pub async fn search(
        &self,
        id: &SessionId,
        query: &str,
        limit: usize,
    ) -> Result<SearchResults, ClientError> {
        let q = percent_encoded(query);
        let v = self
            .get(&format!("/v1/session/{id}/search?q={q}&limit={limit}"))
            .await?;
        self.typed(v)
    }

    pub async fn context(&self, id: &SessionId) -> Result<ContextView, ClientError> {
        let v = self.get(&format!("/v1/session/{id}/context")).await?;
        self.typed(v)
    }

    /// The context ready to send in a provider's shape (not [`ContextFormat::Compactd`]).
    pub async fn provider_context(
        &self,
        id: &SessionId,
        format: ContextFormat,
    ) -> Result<ProviderContext, ClientError> {
        let format = serde_json::to_value(format).unwrap_or_default();
        let format = format.as_str().unwrap_or("openai");
        let v = self
            .get(&format!("/v1/session/{id}/context?format={format}"))
            .await?;
        self.typed(v)
    }

    pub async fn summarize(
        &self,
        id: &SessionId,
        request: &SummarizeRequest,
    ) -> Result<SummarizeOutcome, ClientError> {
        let body = serde_json::to_value(request).unwrap_or_default();
        let v = self
            .post(&format!("/v1/session/{id}/summarize"), &body)
            .await?;
        self.typed(v)
    }

    pub async fn compactions(
        &self,
        id: &SessionId,
        page: &CompactionQuery,
    ) -> Result<CompactionHistory, ClientError> {
        let mut path = format!(
            "/v1/session/{id}/compaction?after={}&failures_after={}&maskings_after={}",
            page.after, page.failures_after, page.maskings_after
        );
        if let Some(limit) = page.limit {
            path.push_str(&format!("&limit={limit}"));
        }
        let v = self.get(&path).await?;
        self.typed(v)
    }

    /// The event stream (see [`EventStream::next_event`]).
    pub async fn subscribe(&self) -> Result<EventStream, ClientError> {
        self.events().await
    }
}

/// `text` for a URL's query: every byte but unreserved ones (RFC 3986) as `%XX`.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
