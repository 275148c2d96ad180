//! The bench's report as a table: a figure per line, what it is held against, the verdict.

use super::{BenchReport, agent_loop};

/// The figures as a table, with the targets for this kind of machine.
pub fn render(r: &BenchReport) -> String {
    let mut out = format!("{:<24} {}\n", "host", r.host.describe());
    for (what, figure, against, verdict) in [append_rows(r), read_rows(r), loop_rows(r)].concat() {
        out.push_str(&format!(
            "{what:<24} {figure:<48} {against:<30} {verdict}\n"
        ));
    }
    out
}

/// One line of the table: what, the figure, what it is held against, the verdict.
type Row = (&'static str, String, String, &'static str);

fn check(ok: bool) -> &'static str {
    if ok { "ok" } else { "MISSED" }
}

/// Appends: one client, 16, by session size, against raw SQLite and the echo.
fn append_rows(r: &BenchReport) -> Vec<Row> {
    let a = &r.append;
    let raw = a.raw_sqlite_txn_per_s;
    vec![
        throughput_row("append, 1 client", &a.clients_1, raw, 0.5),
        throughput_row("append, 16 clients", &a.clients_16, raw, 2.5),
        (
            "append p50 by size",
            format!(
                "{:.0} / {:.0} / {:.0} µs at 100 / 10k / 100k messages",
                a.by_session_size.p50_us_100,
                a.by_session_size.p50_us_10k,
                a.by_session_size.p50_us_100k
            ),
            format!("ratio {:.2} (target <= 1.5)", a.by_session_size.ratio),
            check(a.by_session_size.ratio <= 1.5),
        ),
        (
            "raw SQLite txn/s",
            format!("{raw:.0} rows/s, p50 {:.0} µs", a.raw_sqlite_p50_us),
            "one transaction per row".into(),
            "",
        ),
        (
            "echo (GET /health)",
            format!("p50 {:.0} µs", r.echo.p50_us),
            String::new(),
            "",
        ),
        (
            "append p50 / echo p50",
            format!("{:.2}", r.append_vs_echo_p50),
            format!(
                "target <= 5; raw SQLite's commit alone: {:.2}",
                r.raw_commit_vs_echo_p50
            ),
            check(r.append_vs_echo_p50 <= 5.0),
        ),
    ]
}

/// Appends per second and their latency, held to `target` times raw SQLite's rate.
fn throughput_row(what: &'static str, t: &super::Throughput, raw: f64, target: f64) -> Row {
    (
        what,
        format!(
            "{:.0} msg/s, p50 {:.0} µs, p99 {:.0} µs",
            t.msgs_per_s, t.p50_us, t.p99_us
        ),
        // Three decimals: "0.50x ... MISSED" (0.499x) read as a contradiction.
        format!("{:.3}x raw (target >= {target})", t.msgs_per_s / raw),
        check(t.msgs_per_s >= target * raw),
    )
}

/// Reads and memory: context, the engine's plan, RSS, search.
fn read_rows(r: &BenchReport) -> Vec<Row> {
    vec![
        (
            "context p50",
            format!(
                "{:.0} µs at 100, {:.0} µs at 100k messages",
                r.context.p50_us_100, r.context.p50_us_100k
            ),
            format!("ratio {:.2} (target <= 1.5)", r.context.ratio),
            check(r.context.ratio <= 1.5),
        ),
        (
            "plan (engine)",
            format!(
                "{:.2} / {:.2} / {:.2} ms at 80 / 1k / 10k",
                r.engine.plan_ms_80, r.engine.plan_ms_1000, r.engine.plan_ms_10000
            ),
            "target <= 50 ms at 10k".into(),
            check(r.engine.plan_ms_10000 <= 50.0),
        ),
        (
            "RSS idle",
            format!("{:.1} MB", r.rss_mb.idle),
            "target <= 20 MB".into(),
            check(r.rss_mb.idle <= 20.0),
        ),
        (
            "RSS, 1000 sessions",
            format!("{:.1} MB", r.rss_mb.sessions_1000),
            "target <= 150 MB".into(),
            check(r.rss_mb.sessions_1000 <= 150.0),
        ),
        (
            "search, 100k messages",
            format!(
                "p50 {:.1} ms, p99 {:.1} ms",
                r.search.p50_ms_100k, r.search.p99_ms_100k
            ),
            format!(
                "target p50 < 20 ms; inline index +{:.0} µs/txn",
                r.search.index_us_inline
            ),
            check(r.search.p50_ms_100k < 20.0),
        ),
    ]
}

/// The agent loop with a slow summarizer, and the proxy's cost.
fn loop_rows(r: &BenchReport) -> Vec<Row> {
    let l = &r.agent_loop;
    let loop_row = |run: &agent_loop::LoopRun| {
        format!(
            "p50 {:.1} / p99 {:.1} / max {:.0} ms, {} waits, {} compactions ({} hurried), {} over trigger",
            run.context_p50_ms,
            run.context_p99_ms,
            run.context_max_ms,
            run.waits,
            run.compactions,
            run.hurried,
            run.over_trigger
        )
    };
    vec![
        (
            "agent loop, waiting",
            loop_row(&l.waiting),
            format!(
                "{} steps, {} ms summarizer, {} ms/step",
                l.steps, l.summarizer_ms, l.step_ms
            ),
            "",
        ),
        (
            "agent loop, background",
            loop_row(&l.background),
            "target p99 < 50 ms, 0 over limit".into(),
            check(l.background.context_p99_ms < 50.0 && l.background.over_limit == 0),
        ),
        (
            "proxy, added per call",
            format!(
                "{:.1} / {:.1} / {:.1} ms at 10 / 1k / 10k messages",
                r.proxy.added_ms_10, r.proxy.added_ms_1k, r.proxy.added_ms_10k
            ),
            format!("direct call at 10k: {:.1} ms", r.proxy.direct_ms_10k),
            "",
        ),
        (
            "context beside the proxy",
            format!(
                "p50 {:.1} / p99 {:.1} / max {:.1} ms",
                r.proxy.neighbour_context_p50_ms,
                r.proxy.neighbour_context_p99_ms,
                r.proxy.neighbour_context_max_ms
            ),
            "another agent, beside two 10k-message proxy calls".into(),
            "",
        ),
        (
            "append beside the proxy",
            format!(
                "p50 {:.1} / p99 {:.1} / max {:.1} ms",
                r.proxy.neighbour_append_p50_ms,
                r.proxy.neighbour_append_p99_ms,
                r.proxy.neighbour_append_max_ms
            ),
            "another agent, beside the same calls".into(),
            "",
        ),
    ]
}
