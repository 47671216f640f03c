//! Mix (a) — 90 % of the queries from a set of 1,000 names, 10 % unique — with dnsperf on the
//! node's CPU beside the resolver, in turns: each turn asks the responder, then unbound, a set of
//! popular names nobody has asked (cold: the run's first tenth of a second waits for CoreDNS to
//! forward them all) and, 25 s after that run began, the same names again with new unique ones
//! (warm: a node's steady state, the window holding the popular names' expiry, as every 30 s of
//! it does — CoreDNS's `cache 30` gave them 30 s at the cold run's start). A warm run's first
//! 0.2 s are their own figure: dnsperf paces its first 1,000 sends and then sends what it fell
//! behind by at once (its start), which is not the resolver's steady state; the target's p99 is
//! that of the answers after them.

use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use topology_tests::dnsperf::{Perf, Settling, Window};

use crate::measure::{Measured, row};

/// From a cold run's start to its warm run's.
const WARM_AFTER: Duration = Duration::from_secs(25);
/// The latency target of mix (a), seconds, and the stretch of a run its p99 is judged over when
/// telling how long a cold start took.
const BOUND: f64 = 0.002;
const STRETCH: f64 = 0.1;
/// A warm run's first seconds: dnsperf's start (its pacing and catch-up were over by 0.085 s at
/// 30,000/s).
const START: f64 = 0.2;

/// Queries of a relayed mix, `count` of them: `popular` of every ten from a set of 1,000 names
/// (`{set}{n}.example.com`), the rest unique (`{prefix}{n}.example.com`).
pub fn mix(path: &Path, set: &str, prefix: &str, popular: u64, count: u64) {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let text: String = (0..count)
        .map(|n| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            if (state >> 33) % 10 < popular {
                format!("{set}{}.example.com A\n", (state >> 40) % 1000)
            } else {
                format!("{prefix}{n}.example.com A\n")
            }
        })
        .collect();
    std::fs::write(path, text).expect("query file");
}

/// One resolver's turn.
pub struct Turn {
    pub cold: Perf,
    pub settling: Settling,
    pub warm: Perf,
    /// The warm run's first [`START`] seconds, and the rest of it.
    pub start: Window,
    pub steady: Window,
}

/// A resolver of the turns: its name in the rows, its address, and whether it is the responder
/// (whose upstream the rows read).
pub struct Resolver<'a> {
    pub name: &'a str,
    pub address: SocketAddr,
    pub relayed: bool,
}

/// The rate mix (a) is offered with dnsperf on the node's CPU: half of what that CPU answers with
/// dnsperf beside the responder (`shared`, per second), in thousands, at most `target`. The
/// generator shares the CPU; offered more, the CPU would be full and the figure the queue of a
/// full CPU, whoever answers.
pub fn offered(shared: f64, target: u32) -> u32 {
    ((shared / 2.0) as u32 / 1_000 * 1_000).clamp(1_000, target)
}

/// `turns` turns of each resolver at `qps`, `run(address, queries, relayed)` measuring one run;
/// prints a row of the bench's table for each run.
pub fn turns(
    turns: usize,
    resolvers: &[Resolver<'_>],
    scratch: &Path,
    qps: u32,
    run: impl Fn(SocketAddr, &Path, bool) -> Measured,
) -> Vec<Vec<Turn>> {
    let count = u64::from(qps) * u64::from(crate::SECONDS);
    let offered = format!("{qps}/s");
    let mut by_resolver: Vec<Vec<Turn>> = resolvers.iter().map(|_| Vec::new()).collect();
    for turn in 1..=turns {
        for (n, resolver) in resolvers.iter().enumerate() {
            let set = format!("p{turn}r{n}-");
            let file = |prefix: &str| {
                let path = scratch.join(format!("mix-a-{prefix}{turn}r{n}.txt"));
                mix(&path, &set, &format!("{prefix}{turn}r{n}-"), 9, count);
                path
            };
            let (cold_file, warm_file) = (file("i"), file("k"));
            let what = |how| {
                format!(
                    "(a) relayed, 90 % of 1,000 names, dnsperf on the node's CPU, turn {turn}, {how}: {}",
                    resolver.name
                )
            };
            let started = Instant::now();
            let cold = run(resolver.address, &cold_file, resolver.relayed);
            row(&what("cold"), &offered, &cold);
            std::thread::sleep(WARM_AFTER.saturating_sub(started.elapsed()));
            let warm = run(resolver.address, &warm_file, resolver.relayed);
            row(&what("warm"), &offered, &warm);
            let settling = cold.perf.settling(BOUND, STRETCH);
            let start = warm.perf.window(0.0, START, BOUND);
            let steady = warm.perf.window(START, warm.perf.run_time, BOUND);
            by_resolver[n].push(Turn { cold: cold.perf, settling, warm: warm.perf, start, steady });
        }
    }
    by_resolver
}

/// The table of the turns' cold starts and warm p99s.
pub fn print(resolvers: &[Resolver<'_>], by_resolver: &[Vec<Turn>]) {
    println!(
        "\n| mix (a), dnsperf on the node's CPU | turn | cold p99 ms | a 100 ms stretch's p99 under 2 ms after | \
         answers ≥ 2 ms before | cold lost | warm NOERROR per s | warm p99 ms, the whole run | warm, its first \
         0.2 s: p99 ms; answers ≥ 2 ms | warm, after them: p99 ms; answers ≥ 2 ms | warm lost |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (resolver, turns) in resolvers.iter().zip(by_resolver) {
        for (n, turn) in turns.iter().enumerate() {
            println!(
                "| {} | {} | {:.2} | {:.1} s | {} | {} | {:.0} | {:.2} | {:.2}; {} | {:.2}; {} | {} |",
                resolver.name,
                n + 1,
                turn.cold.quantile_ms(0.99),
                turn.settling.after,
                turn.settling.slow,
                turn.cold.lost,
                turn.warm.noerror_qps(),
                turn.warm.quantile_ms(0.99),
                turn.start.p99_ms,
                turn.start.slow,
                turn.steady.p99_ms,
                turn.steady.slow,
                turn.warm.lost
            );
        }
    }
}

/// The turn with the median `figure`.
pub fn median(turns: &[Turn], figure: impl Fn(&Turn) -> f64) -> &Turn {
    let mut sorted: Vec<&Turn> = turns.iter().collect();
    sorted.sort_by(|a, b| figure(a).total_cmp(&figure(b)));
    sorted[sorted.len() / 2]
}
