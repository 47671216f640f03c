//! Mix (a) — 90 % of the queries from a set of 1,000 names, 10 % unique — with dnsperf on the
//! node's CPU beside the resolver, in turns: each turn asks the responder, then unbound, a set of
//! popular names nobody has asked (cold: the run's first tenth of a second waits for CoreDNS to
//! forward them all) and, 25 s after that run began, the same names again with new unique ones
//! (warm: a node's steady state, the window holding the popular names' expiry, as every 30 s of
//! it does — CoreDNS's `cache 30` gave them 30 s at the cold run's start).

use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use topology_tests::dnsperf::{Perf, Settling};

use crate::measure::{Measured, row};

/// From a cold run's start to its warm run's.
const WARM_AFTER: Duration = Duration::from_secs(25);
/// The latency target of mix (a), seconds, and the stretch of a run its p99 is judged over when
/// telling how long a cold start took.
const BOUND: f64 = 0.002;
const STRETCH: f64 = 0.1;

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
}

/// A resolver of the turns: its name in the rows, its address, and whether it is the responder
/// (whose upstream the rows read).
pub struct Resolver<'a> {
    pub name: &'a str,
    pub address: SocketAddr,
    pub relayed: bool,
}

/// `turns` turns of each resolver, `run(address, queries, relayed)` measuring one run; prints a
/// row of the bench's table for each run.
pub fn turns(
    turns: usize,
    resolvers: &[Resolver<'_>],
    scratch: &Path,
    count: u64,
    run: impl Fn(SocketAddr, &Path, bool) -> Measured,
) -> Vec<Vec<Turn>> {
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
            row(&what("cold"), "50000/s", &cold);
            std::thread::sleep(WARM_AFTER.saturating_sub(started.elapsed()));
            let warm = run(resolver.address, &warm_file, resolver.relayed);
            row(&what("warm"), "50000/s", &warm);
            let settling = cold.perf.settling(BOUND, STRETCH);
            by_resolver[n].push(Turn { cold: cold.perf, settling, warm: warm.perf });
        }
    }
    by_resolver
}

/// The table of the turns' cold starts and warm p99s.
pub fn print(resolvers: &[Resolver<'_>], by_resolver: &[Vec<Turn>]) {
    println!(
        "\n| mix (a), dnsperf on the node's CPU | turn | cold p99 ms | a 100 ms stretch's p99 under 2 ms after | \
         answers ≥ 2 ms before | cold lost | warm NOERROR per s | warm p99 ms | warm lost |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (resolver, turns) in resolvers.iter().zip(by_resolver) {
        for (n, turn) in turns.iter().enumerate() {
            println!(
                "| {} | {} | {:.2} | {:.1} s | {} | {} | {:.0} | {:.2} | {} |",
                resolver.name,
                n + 1,
                turn.cold.quantile_ms(0.99),
                turn.settling.after,
                turn.settling.slow,
                turn.cold.lost,
                turn.warm.noerror_qps(),
                turn.warm.quantile_ms(0.99),
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
