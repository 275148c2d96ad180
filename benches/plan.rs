//! `cargo bench --bench plan`: the engine's `plan` (boundary, files, masked prompt) on
//! synthetic sessions of 80, 1,000 and 10,000 messages (about 1 KB each). The target is
//! under 50 ms at 10,000 messages, and time linear in size; the summary line prints
//! the per-message cost at each size so the ratio is visible.

use compactd_core::compaction::{
    CompactionConfig, CompactionPlan, LazyEstimator, PlanInput, estimate_each,
};
use compactd_measure::synthetic::synthetic_session;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Instant;

fn plan_once(messages: &[compactd_core::compaction::Message], tokens: &[usize]) -> usize {
    let config = CompactionConfig::default();
    let input = PlanInput::new(messages, tokens, 128_000, &config);
    let plan = CompactionPlan::new(&input);
    plan.prompt(&input).len()
}

fn bench_plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    group.sample_size(20);
    let estimator = LazyEstimator::default();
    for n in [80usize, 1_000, 10_000] {
        let messages = synthetic_session(n);
        let bytes: usize = messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap().len())
            .sum();
        // Token estimates are stored at append time in the daemon; `plan` from a file computes
        // them too, so both are measured.
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::new("estimate+plan", n), &messages, |b, m| {
            b.iter(|| {
                let tokens = estimate_each(m, &estimator);
                black_box(plan_once(m, &tokens))
            })
        });
    }
    group.finish();

    // A plain summary with ratios, for the record.
    let mut per_message = Vec::new();
    for n in [80usize, 1_000, 10_000] {
        let messages = synthetic_session(n);
        let bytes: usize = messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap().len())
            .sum();
        let runs = (20_000 / n).clamp(5, 200);
        let start = Instant::now();
        for _ in 0..runs {
            let tokens = estimate_each(&messages, &estimator);
            black_box(plan_once(&messages, &tokens));
        }
        let ms = start.elapsed().as_secs_f64() * 1e3 / runs as f64;
        per_message.push(ms * 1e3 / n as f64);
        println!(
            "plan n={n:>6} bytes={:>9} mean={ms:8.3} ms  per message={:.2} us",
            bytes,
            ms * 1e3 / n as f64
        );
    }
    println!(
        "per-message cost ratio 10000/80 = {:.2} (1.0 = perfectly linear)",
        per_message[2] / per_message[0]
    );
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
