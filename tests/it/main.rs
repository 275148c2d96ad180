//! compactd's integration tests, in one binary (one link, one parallel run). Each module
//! tests one face of the product as its users meet it; `common` is the harness: real daemons
//! on temp sockets and databases ([`common::TestDaemon`]) and a mock model API.

mod common;

mod conversation_tree;

mod agents;
mod background;
mod bounds;
mod cache_stability;
mod cli_offline;
mod clients;
mod current_step;
mod daemon_api;
mod database;
mod disk_full;
mod engine_properties;
mod hardening;
mod in_process;
mod model_count;
mod openapi;
mod operate;
mod overflow_report;
mod pinning;
mod provider_formats;
mod proxy;
mod proxy_branches;
mod proxy_images;
mod proxy_overflow;
mod proxy_preamble;
mod proxy_wire;
mod recall;
mod spec_conformance;
mod summarizers;
mod transcripts;
