//! Section 3, Files and Code Sections: the files the session changed, created, deleted and
//! read. Changed files come first, the most recently and most often changed at the top, so
//! the one that matters is not lost among scratch files; each list is capped with a count of
//! the rest (the CompactionResult's file lists stay whole).

use super::{Detail, Sources};
use crate::compaction::files::recently_changed;
use std::collections::HashSet;
use std::fmt::Write;

/// How many paths each list shows: (modified, created, deleted, read) at each detail.
fn caps(detail: Detail) -> [usize; 4] {
    match detail {
        Detail::Full => [15, 10, 10, 15],
        Detail::Reduced => [8, 5, 5, 5],
        Detail::Floor => [4, 2, 2, 0],
    }
}

pub(super) fn section(sources: &Sources, detail: Detail) -> String {
    let files = &sources.request.files;
    let ranking = recently_changed(&sources.request.messages);
    let [modified, created, deleted, read] = caps(detail);
    let mut out = String::new();
    list(
        &mut out,
        "Modified",
        &ranked(&files.modified, &ranking),
        modified,
    );
    list(
        &mut out,
        "Created",
        &ranked(&files.created, &ranking),
        created,
    );
    list(&mut out, "Deleted", &ranked(&files.deleted, &[]), deleted);
    list(&mut out, "Read", &ranked(&files.read, &[]), read);
    out
}

/// `paths` in the ranking's order first, then the rest newest first.
fn ranked(paths: &[String], ranking: &[String]) -> Vec<String> {
    let present: HashSet<&String> = paths.iter().collect();
    let mut out: Vec<String> = ranking
        .iter()
        .filter(|p| present.contains(p))
        .cloned()
        .collect();
    let shown: HashSet<String> = out.iter().cloned().collect();
    out.extend(paths.iter().rev().filter(|p| !shown.contains(*p)).cloned());
    out
}

fn list(out: &mut String, label: &str, paths: &[String], cap: usize) {
    if paths.is_empty() {
        return;
    }
    if cap == 0 {
        let _ = writeln!(out, "{label}: {} files", paths.len());
        return;
    }
    let _ = writeln!(out, "{label}:");
    for path in paths.iter().take(cap) {
        let _ = writeln!(out, "- {path}");
    }
    if paths.len() > cap {
        let _ = writeln!(out, "- … and {} more", paths.len() - cap);
    }
}
