//! [`SessionId`]: a session's name, checked once where it enters (a path, a body, a CLI
//! argument) and trusted everywhere after.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A session id: 1 to 128 of `A-Z a-z 0-9 . _ : -`, not `.` or `..`, so it is safe in URLs,
/// paths, logs and shells without escaping.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(try_from = "String", into = "String")]
#[cfg_attr(
    feature = "schema",
    schema(value_type = String, pattern = r"^[A-Za-z0-9._:-]{1,128}$", example = "demo")
)]
pub struct SessionId(String);

/// Why a string is not a session id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid session id {shown:?}: use 1 to 128 of A-Z a-z 0-9 . _ : - (not . or ..)")]
pub struct InvalidSessionId {
    /// The rejected text, shortened for the message.
    pub shown: String,
}

impl SessionId {
    /// The longest id.
    pub const MAX_LEN: usize = 128;

    pub fn parse(id: impl Into<String>) -> Result<SessionId, InvalidSessionId> {
        let id = id.into();
        let ok = !id.is_empty()
            && id != "."
            && id != ".."
            && id.len() <= Self::MAX_LEN
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
        if ok {
            Ok(SessionId(id))
        } else {
            Err(InvalidSessionId {
                shown: crate::compaction::truncate::truncate_chars(&id, 80).into_owned(),
            })
        }
    }

    /// An id the caller knows to be valid: one read back from the store, which checked it
    /// when it was written, or one made of valid characters (a generated id).
    pub fn unchecked(id: String) -> SessionId {
        SessionId(id)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SessionId {
    type Error = InvalidSessionId;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        SessionId::parse(s)
    }
}

impl std::str::FromStr for SessionId {
    type Err = InvalidSessionId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SessionId::parse(s)
    }
}

impl From<SessionId> for String {
    fn from(id: SessionId) -> String {
        id.0
    }
}

impl AsRef<str> for SessionId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_checked() {
        for ok in ["a", "demo-1", "proj:feature.x_2", &"x".repeat(128)] {
            assert_eq!(SessionId::parse(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            ".",
            "..",
            "a b",
            "../etc",
            "x/y",
            "prod?x",
            "é",
            &"x".repeat(129),
            "a\0",
        ] {
            assert!(SessionId::parse(bad).is_err(), "{bad:?}");
        }
        let e = serde_json::from_str::<SessionId>("\"a b\"").unwrap_err();
        assert!(e.to_string().contains("invalid session id"), "{e}");
    }
}
