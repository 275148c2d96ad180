//! `compactd torture`: the daemon under abuse, for as long as asked, with every promise
//! checked against what clients were told.
//!
//! - [`kills`]: kill -9 cycles while clients append concurrently, compactions run and
//!   outside `sqlite3` processes read the database ([`readers`]); after every kill the system
//!   `sqlite3` must find the file sound, after every restart each acknowledged message must be
//!   stored exactly once, in order; appends retried with their Idempotency-Key exactly once;
//!   no context over its limit or with an orphaned tool result.
//! - [`fuzz`]: hostile requests (malformed HTTP, bad JSON, hostile ids and numbers, oversized
//!   and slow bodies, half-closed clients): every refusal is a JSON error, nothing refused
//!   changes what is stored, the daemon stays up with bounded memory, and `/health` stays
//!   fast while large pages are read; bodies of tens of thousands of tiny messages on both
//!   doors at once stay within the memory bound.
//! - [`proxy`]: a model server sending 100 MB or never ending, a squatter over the loopback
//!   listener, parallel calls with one history, a config edit that would not fit a session.
//!
//! CI runs it for about a minute (`compactd torture --seconds 60`); docs/RELIABILITY.md has
//! the figures of longer runs.

mod fuzz;
mod http;
mod kills;
mod proxy;
mod readers;

use anyhow::Result;
use serde::Serialize;
use std::time::Duration;

/// What a torture run found.
#[derive(Debug, Clone, Serialize)]
pub struct TortureReport {
    pub seconds: f64,
    pub kills: kills::KillFigures,
    pub fuzz: fuzz::FuzzFigures,
    pub proxy: proxy::ProxyFigures,
}

impl TortureReport {
    /// Every broken promise, in words; empty when the run passed.
    pub fn failures(&self) -> Vec<String> {
        let mut out = self.kills.failures();
        out.extend(self.fuzz.failures());
        out.extend(self.proxy.failures());
        out
    }
}

/// Runs both parts, splitting `duration` between them.
pub async fn run(duration: Duration, progress: impl Fn(&str)) -> Result<TortureReport> {
    let started = std::time::Instant::now();
    progress("kill -9 cycles under concurrent appends");
    let kills = kills::run(duration.mul_f64(0.5)).await?;
    progress("hostile requests, slow clients, large reads");
    let fuzz = fuzz::run(duration.mul_f64(0.5)).await?;
    progress("the proxy: huge and endless answers, squatting, parallel calls, a config misfit");
    let proxy = proxy::run(fuzz::RSS_BOUND_MB).await?;
    Ok(TortureReport {
        seconds: started.elapsed().as_secs_f64(),
        kills,
        fuzz,
        proxy,
    })
}

/// The report as text.
pub fn render(r: &TortureReport) -> String {
    let k = &r.kills;
    let f = &r.fuzz;
    let mut out = format!(
        "kill -9 cycles       {} cycles ({} during a compaction), {} appends acknowledged, {} retried by key\n\
         \x20 lost {}, duplicated {}, out of order {}, retried twice {}, contexts over the limit {}, orphaned results {}\n\
         \x20 outside readers: {} sqlite3 processes and 1 long-lived session ({} answers); integrity_check after each kill: {} ok, {} not\n\
         \x20 outside writes (.restore, DDL under .timeout): {} tried, {} took the lock\n\
         hostile requests     {} sent, {} refused with a JSON error, {} refusals without one, {} invalid ones accepted\n\
         \x20 stored data changed by refusals: {}; daemon up: {}\n\
         memory               peak RSS {:.0} MB (bound {:.0} MB) under {} slow clients, {} concurrent {:.1} MB bodies\n\
         \x20 and {} bodies of 49,990 tiny messages on both doors at once ({} served, the rest 503 busy)\n\
         large reads          /health p50 {:.1} ms, max {:.1} ms while {} clients read {:.0} MB pages\n\
         \x20 two 2,000-byte searches over 1 MB messages: {:.2} s, /health max {:.1} ms meanwhile, {} failed\n\
         proxy                a {:.0} MB answer passed whole: {}, {:.0} KB of it recorded; {} endless answers, up meanwhile: {}; peak RSS {:.0} MB\n\
         \x20 a squatter reached the owner's session: {}; 2 parallel calls stored {} copy; a misfitting config edit refused: {}\n\
         \x20 a forged PDF and another key's genuine one: {} calls, {} reached the model without it\n",
        k.cycles,
        k.kills_during_compaction,
        k.acknowledged_appends,
        k.retried_by_key,
        k.lost,
        k.duplicated,
        k.out_of_order,
        k.retried_twice,
        k.contexts_over_limit,
        k.orphaned_results,
        k.outside_reads,
        k.long_reader_answers,
        k.integrity_checks - k.integrity_failures,
        k.integrity_failures,
        k.outside_writes_tried,
        k.outside_writes_taken,
        f.requests,
        f.refused_with_json,
        f.refused_without_json,
        f.invalid_accepted,
        f.stored_changed,
        f.daemon_up,
        f.peak_rss_mb,
        f.rss_bound_mb,
        f.slow_clients,
        f.large_bodies,
        f.large_body_mb,
        f.many_message_bodies,
        f.many_message_served,
        f.health_p50_ms,
        f.health_max_ms,
        f.readers,
        f.page_mb,
        f.search_seconds,
        f.health_during_search_max_ms,
        f.searches_failed,
        r.proxy.huge_answer_mb,
        r.proxy.huge_answer_whole,
        r.proxy.recorded_kb,
        r.proxy.endless_answers,
        r.proxy.up_during_endless,
        r.proxy.peak_rss_mb,
        r.proxy.squatter_reached_owner,
        r.proxy.parallel_copies,
        r.proxy.misfit_refused,
        r.proxy.pdf_calls,
        r.proxy.pdf_dropped,
    );
    let failures = r.failures();
    if failures.is_empty() {
        out.push_str("every promise held\n");
    } else {
        for failure in failures {
            out.push_str(&format!("BROKEN: {failure}\n"));
        }
    }
    out
}
