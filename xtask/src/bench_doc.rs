//! `docs/benchmarks.md`: each suite's tables as its last run printed them, under how they were
//! measured (the bench's own module documentation) and where (machine, kernel, commit, date). A
//! run of some suites replaces their sections and keeps the others.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;

use crate::cmd;

/// One suite's section.
pub struct Section {
    /// `cargo xtask bench <key>`.
    pub key: &'static str,
    pub title: &'static str,
    /// The bench source whose `//!` header says how it measures.
    pub source: &'static str,
    /// What the bench printed (Markdown tables and notes).
    pub body: String,
}

const HEADER: &str = "# Benchmarks

Figures from `cargo xtask bench [SUITE…]` on the machine each section names; the command rewrites
the sections of the suites it ran and keeps the others. Root is needed for every suite but
`policy`. Rerun one suite with `cargo xtask bench <suite>` (`policy`, `datapath`, `control-plane`,
`soak`, `dns`, `cost`); the tables are printed as they are written here. Targets are checked here, never
as timed assertions in tests.
";

fn begin(key: &str) -> String {
    format!("<!-- bench:{key} -->")
}

fn end(key: &str) -> String {
    format!("<!-- /bench:{key} -->")
}

pub fn path() -> PathBuf {
    cmd::workspace_root().join("docs/benchmarks.md")
}

/// Rewrites the sections of `ran`, keeping every other one as it was; `order` fixes their order.
pub fn write(ran: &[Section], order: &[&str]) -> anyhow::Result<()> {
    let file = path();
    let old = std::fs::read_to_string(&file).unwrap_or_default();
    let machine = machine()?;
    let mut out = String::from(HEADER);
    for key in order {
        let section = match ran.iter().find(|s| s.key == *key) {
            Some(section) => Some(render(section, &machine)?),
            None => kept(&old, key),
        };
        if let Some(section) = section {
            out.push('\n');
            out.push_str(&section);
        }
    }
    std::fs::create_dir_all(file.parent().expect("docs/")).context("creating docs/")?;
    std::fs::write(&file, out).with_context(|| format!("writing {}", file.display()))?;
    eprintln!("bench: wrote {}", file.display());
    Ok(())
}

fn kept(old: &str, key: &str) -> Option<String> {
    let start = old.find(&begin(key))?;
    let stop = old[start..].find(&end(key))? + start + end(key).len();
    Some(format!("{}\n", &old[start..stop]))
}

fn render(section: &Section, machine: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    writeln!(out, "{}", begin(section.key))?;
    writeln!(out, "## {}\n", section.title)?;
    writeln!(out, "Measured {machine}. Rerun: `cargo xtask bench {}`.\n", section.key)?;
    writeln!(out, "**How:** {}\n", how(&cmd::workspace_root().join(section.source))?)?;
    writeln!(out, "{}\n", section.body.trim())?;
    writeln!(out, "{}", end(section.key))?;
    Ok(out)
}

/// The bench's `//!` header as one paragraph (list items kept on their own lines).
fn how(source: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))?;
    let mut out = String::new();
    for line in text.lines().map_while(|l| l.strip_prefix("//!")) {
        let line = line.trim();
        if line.is_empty() {
            out.push_str("\n\n");
        } else if line.starts_with("- ") {
            out.push('\n');
            out.push_str(line);
        } else {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push(' ');
            }
            out.push_str(line);
        }
    }
    Ok(out.trim().to_owned())
}

/// "on 2 × AMD EPYC, 24 GiB, kernel 6.18.44, commit abc1234, 2026-11-25".
fn machine() -> anyhow::Result<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_owned()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let root = cmd::workspace_root();
    let commit = cmd::output(Command::new("git").args(["rev-parse", "--short", "HEAD"]).current_dir(&root))
        .unwrap_or_else(|_| "unknown".into());
    // docs/ is what this writes: it does not make the code measured differ from the commit.
    let dirty =
        !cmd::output(Command::new("git").args(["status", "--porcelain", "--", ".", ":!docs"]).current_dir(&root))
            .unwrap_or_default()
            .is_empty();
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    Ok(format!(
        "on {cores} × {model}, {} GiB, kernel {}, commit {commit}{}, {}",
        (kib as f64 / 1024.0 / 1024.0).round(),
        kernel.trim(),
        if dirty { " with local changes" } else { "" },
        &date[..10]
    ))
}

/// Criterion's estimates of every benchmark under `dir` (`target/criterion`) written since
/// `since` (this run), as a table.
pub fn criterion_table(dir: &Path, since: std::time::SystemTime) -> anyhow::Result<String> {
    let mut rows = Vec::new();
    criterion_rows(dir, since, &mut rows)?;
    rows.sort();
    Ok(format!("| benchmark | median | 95 % interval |\n| --- | ---: | ---: |\n{}", rows.join("\n")))
}

fn criterion_rows(dir: &Path, since: std::time::SystemTime, rows: &mut Vec<String>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let dir = entry?.path();
        let estimates_file = dir.join("new/estimates.json");
        let fresh = std::fs::metadata(&estimates_file).and_then(|m| m.modified()).is_ok_and(|at| at >= since);
        if !fresh {
            if dir.is_dir() && dir.file_name().is_some_and(|n| n != "report" && n != "new" && n != "base") {
                criterion_rows(&dir, since, rows)?;
            }
            continue;
        }
        let bench: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("new/benchmark.json"))?)?;
        let estimates: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&estimates_file)?)?;
        let median = &estimates["median"];
        let ns = |value: &serde_json::Value| value.as_f64().unwrap_or(f64::NAN);
        rows.push(format!(
            "| {} | {} | {} – {} |",
            bench["full_id"].as_str().unwrap_or("?"),
            duration(ns(&median["point_estimate"])),
            duration(ns(&median["confidence_interval"]["lower_bound"])),
            duration(ns(&median["confidence_interval"]["upper_bound"])),
        ));
    }
    Ok(())
}

fn duration(ns: f64) -> String {
    match ns {
        n if n >= 1e9 => format!("{:.2} s", n / 1e9),
        n if n >= 1e6 => format!("{:.2} ms", n / 1e6),
        n if n >= 1e3 => format!("{:.2} µs", n / 1e3),
        n => format!("{n:.0} ns"),
    }
}
