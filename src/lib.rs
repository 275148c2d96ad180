//! compactd keeps long-running LLM agent sessions inside their context window: agents append
//! every message over a Unix socket, and when a session nears its model's limit the older part
//! becomes one structured summary while a recent tail stays verbatim.
//!
//! The library holds the daemon; `main.rs` only parses arguments. Eight modules are public,
//! one per thing the crate offers: the engine ([`compaction`], with the messages it reads),
//! the summarizers ([`summarize`]), the socket API's wire types ([`protocol`]) and a typed
//! client of it ([`client`]), the daemon ([`daemon`], with the few handles of its layers an
//! embedder or a test needs), the commands ([`cli`]), the agents' session files
//! ([`transcript`]) and what measures the daemon ([`measure`]).
//!
//! The lower layers are crates of the workspace (`crates/`), re-exported here under the paths
//! the rest uses, so the compiler holds their layering (ARCHITECTURE.md): the engine
//! (`compactd-core`: `message`, [`compaction`]), the formats (`compactd-formats`: `provider`,
//! [`transcript`], `fnv`, `json_shape`), the summarizers (`compactd-summarize`), the store
//! (`compactd-store`: `store`, `blocking`) and the socket API (`compactd-api`: [`protocol`],
//! [`client`], `paths`). This crate's own modules, lowest first; each uses only the ones
//! above it:
//!
//! - `compaction_run`: one compaction end to end (plan, summarize in chunks, redact, result),
//!   shared by the daemon, `compactd summarize` and replay.
//! - `service`: append, check, compact: per-session locks, the breaker, events; `views`
//!   turns the store's rows into the API's answers.
//! - `server`: HTTP over the Unix socket: accept loop, peer-uid check, routes, errors, SSE,
//!   the proxy's HTTP side, the OpenAPI document. [`daemon`] runs it all (`compactd serve`),
//!   `config_watch` reloads `config`, `database_lock` keeps a second daemon off its database.
//! - [`cli`]: the commands.
//! - [`measure`]: what measures and stresses the daemon and is no part of it: `replay`,
//!   `bench`, `torture`, and the synthetic sessions and daemon processes they (and the tests)
//!   use.

#![warn(unreachable_pub)]
// The crate is read with `cargo doc --document-private-items`, where these links resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub(crate) use compactd_store::blocking;
pub mod cli;
pub use compactd_api::client;
pub use compactd_core::compaction;
pub(crate) mod compaction_run;
pub(crate) mod config;
pub(crate) mod config_watch;
pub mod daemon;
pub(crate) mod database_lock;
pub(crate) use compactd_formats::fnv;
pub(crate) use compactd_formats::json_shape;
pub mod measure;
pub use compactd_api as protocol;
pub(crate) use compactd_api::paths;
pub(crate) use compactd_core::message;
pub(crate) use compactd_formats::provider;
pub(crate) mod server;
pub(crate) mod service;
pub use compactd_formats::transcript;
pub(crate) use compactd_store as store;
pub use compactd_summarize as summarize;

#[cfg(test)]
mod tests {
    /// The public surface stays what the crate offers: eight modules, each one thing (the
    /// list in the crate doc). A ninth public module is a layer leaking, or a doc to update.
    #[test]
    fn the_crate_offers_eight_public_modules() {
        // The crate's own modules and the workspace crates it re-exports as modules, in
        // name order (rustfmt orders the `use` lines by crate).
        let mut public: Vec<&str> = include_str!("lib.rs")
            .lines()
            .filter_map(|line| {
                let crate_path = line.strip_prefix("pub use compactd_");
                line.strip_prefix("pub mod ").or_else(|| {
                    let path = crate_path?;
                    let name = path.rsplit_once(" as ").or_else(|| path.rsplit_once("::"));
                    Some(name.map_or(path, |(_, name)| name))
                })
            })
            .collect();
        public.sort_unstable();
        assert_eq!(
            public,
            [
                "cli;",
                "client;",
                "compaction;",
                "daemon;",
                "measure;",
                "protocol;",
                "summarize;",
                "transcript;"
            ]
        );
        let doc = include_str!("lib.rs");
        for module in &public {
            let name = module.trim_end_matches(';');
            assert!(
                doc.contains(&format!("[`{name}`]")),
                "the crate doc names {name}"
            );
        }
    }
}
