//! `cargo xtask bench soak`: the crash-mid-write soak at full size — 200 SIGKILLs of the agent at
//! random 0–50 ms after a change, under eight client loops (TCP and UDP, IPv4 and IPv6), with
//! every service's set swapped 20 times a second. Prints one table.

use topology_tests::{fixture::Fixture, sandbox::is_root, soak};

fn main() {
    if !is_root() {
        eprintln!("SKIPPED soak benchmark: needs root");
        return;
    }
    let kills = std::env::var("SOAK_KILLS").ok().and_then(|k| k.parse().ok()).unwrap_or(200);
    let fx = Fixture::new(6);
    let report = soak::run(&fx, kills, 0x50a4);
    let seconds = report.elapsed.as_secs_f64();
    let mut restarts = report.restarts.clone();
    restarts.sort();
    let at = |q: f64| restarts.get(((restarts.len() as f64 - 1.0) * q) as usize).copied().unwrap_or_default();
    println!(
        "| kills | duration | connects+exchanges | per s | failed | landings checked | bad landings | set swaps | per s | inconsistent after a kill | restart to ready p50 / max |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {} | {seconds:.0} s | {} | {:.0} | {} | {} | {} | {} | {:.0} | {} | {:.0} / {:.0} ms |",
        report.kills,
        report.attempts,
        report.attempts as f64 / seconds,
        report.failures.values().sum::<u64>(),
        report.landings,
        report.violations.len(),
        report.swaps,
        report.swaps as f64 / seconds,
        report.inconsistent.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3,
    );
    for problem in report.inconsistent.iter().chain(&report.violations).take(10) {
        println!("problem: {problem}");
    }
    if !report.failures.is_empty() {
        println!("failures: {:?}", report.failures);
    }
}
