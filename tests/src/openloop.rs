//! An open-loop load generator: TCP connections arrive at a set rate (Poisson arrivals), whatever
//! became of the ones before, as requests from many independent users do. A closed loop (the next
//! request after the last answer) slows down with the server and hides its queue; an open loop
//! does not. Latency is measured from each connection's *scheduled* arrival, so a generator that
//! falls behind cannot hide a stall either (the "coordinated omission" wrk2 avoids).

use std::{
    io,
    net::SocketAddr,
    process::{Child, Stdio},
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{io::AsyncReadExt as _, net::TcpStream, sync::mpsc, time::Instant};

use crate::{
    net::ClientPlace,
    sandbox::ProcessGuard,
    traffic::{errno_name, monotonic_ns},
};

/// A stretch of time at one arrival rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Its name (`surge`, `calm`, ...).
    pub name: String,
    /// Connections per second.
    pub rate_per_s: f64,
    /// How long, seconds.
    pub seconds: f64,
}

impl FromStr for Phase {
    type Err = String;

    /// `NAME:RATE:SECONDS`, as in `surge:320:20`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("phase {text:?}: expected NAME:RATE_PER_S:SECONDS, as in surge:320:20");
        let mut parts = text.split(':');
        let (Some(name), Some(rate), Some(seconds), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let rate_per_s: f64 = rate.parse().map_err(|_| bad())?;
        let seconds: f64 = seconds.parse().map_err(|_| bad())?;
        if name.is_empty() || !(0.0..=100_000.0).contains(&rate_per_s) || !(0.0..=3600.0).contains(&seconds) {
            return Err(format!("{}: a name, a rate of 0–100000/s and 0–3600 s", bad()));
        }
        Ok(Self { name: name.to_owned(), rate_per_s, seconds })
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.name, self.rate_per_s, self.seconds)
    }
}

/// One connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// When it was scheduled, microseconds after the start.
    pub at_us: u64,
    /// From its scheduled arrival to the answer (or the failure), microseconds.
    pub latency_us: u64,
    /// What became of it.
    pub outcome: Outcome,
}

/// What became of one connection (`{"Ok": backend}` or `{"Err": why}` in the report's JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The backend that answered.
    #[serde(rename = "Ok")]
    Served(String),
    /// The failure: `timeout`, `ECONNREFUSED`, …, or `overflow` when the generator's bound on
    /// connections in flight was reached.
    #[serde(rename = "Err")]
    Failed(String),
}

impl Outcome {
    /// The backend that answered, if one did.
    pub fn served(&self) -> Option<&str> {
        match self {
            Self::Served(name) => Some(name),
            Self::Failed(_) => None,
        }
    }
}

/// Everything one run did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpenLoopReport {
    /// `CLOCK_MONOTONIC` ns at the start, the clock of every process of the machine.
    pub started_ns: u64,
    /// The phases run.
    pub phases: Vec<Phase>,
    /// Every connection, in the order they ended.
    pub attempts: Vec<Attempt>,
}

/// Runs `phases` against `targets` (one picked per connection, at random), each connection
/// bounded by `timeout` from its scheduled arrival and at most `max_in_flight` at once. Every
/// connection reads the backend's name to the end.
pub fn run(
    targets: &[SocketAddr],
    phases: &[Phase],
    timeout: Duration,
    max_in_flight: usize,
    seed: u64,
) -> io::Result<OpenLoopReport> {
    raise_file_limit();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let targets = targets.to_vec();
    runtime.block_on(async move {
        let start = Instant::now();
        let started_ns = monotonic_ns();
        let (send, mut receive) = mpsc::unbounded_channel();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let mut random = seed;
        let mut phase_start: f64 = 0.0;
        let mut next: f64 = 0.0;
        let mut count = 0u64;
        for phase in phases {
            let end = phase_start + phase.seconds;
            if phase.rate_per_s > 0.0 {
                next = next.max(phase_start);
                loop {
                    // Exponential gaps: Poisson arrivals.
                    random = splitmix(random);
                    let uniform = (random >> 11) as f64 / (1u64 << 53) as f64;
                    next += -(1.0 - uniform).ln() / phase.rate_per_s;
                    if next >= end {
                        break;
                    }
                    let scheduled = start + Duration::from_secs_f64(next);
                    tokio::time::sleep_until(scheduled).await;
                    let at_us = (next * 1e6) as u64;
                    let target = crate::traffic::pick(&targets, count);
                    count += 1;
                    if in_flight.load(Ordering::Relaxed) >= max_in_flight {
                        let _ =
                            send.send(Attempt { at_us, latency_us: 0, outcome: Outcome::Failed("overflow".into()) });
                        continue;
                    }
                    in_flight.fetch_add(1, Ordering::Relaxed);
                    let (send, in_flight) = (send.clone(), Arc::clone(&in_flight));
                    tokio::spawn(async move {
                        let outcome = match tokio::time::timeout_at(scheduled + timeout, exchange(target)).await {
                            Ok(Ok(name)) => Outcome::Served(name),
                            Ok(Err(error)) => Outcome::Failed(errno_name(&error)),
                            Err(_) => Outcome::Failed("timeout".to_owned()),
                        };
                        let latency_us = scheduled.elapsed().as_micros() as u64;
                        in_flight.fetch_sub(1, Ordering::Relaxed);
                        let _ = send.send(Attempt { at_us, latency_us, outcome });
                    });
                }
            }
            tokio::time::sleep_until(start + Duration::from_secs_f64(end)).await;
            phase_start = end;
        }
        drop(send);
        let mut attempts = Vec::with_capacity(count as usize);
        while let Some(attempt) = receive.recv().await {
            attempts.push(attempt);
        }
        Ok(OpenLoopReport { started_ns, phases: phases.to_vec(), attempts })
    })
}

/// One connection: connect, read the backend's name to the end.
async fn exchange(target: SocketAddr) -> io::Result<String> {
    let mut stream = TcpStream::connect(target).await?;
    let mut name = String::new();
    stream.read_to_string(&mut name).await?;
    Ok(name.trim().to_owned())
}

/// splitmix64's step.
fn splitmix(state: u64) -> u64 {
    let mut x = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Thousands of connections in flight need as many descriptors: the soft limit goes up to the
/// hard one (a failure leaves it, and shows as `EMFILE` failures).
fn raise_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: valid rlimit structs for getrlimit to fill and setrlimit to read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// An open-loop generator running in a client place (see [`ClientPlace`]).
#[derive(Debug)]
pub struct OpenLoopClient {
    process: ProcessGuard,
}

impl OpenLoopClient {
    /// Starts `phases` against `target` from `place`; each connection times out 2 s after its
    /// scheduled arrival (the probe's client timeout).
    pub fn start(place: &ClientPlace, target: SocketAddr, phases: &[Phase], seed: u64) -> Self {
        let mut command = place.command_spread(&[target]);
        command.args(["open-loop", "--seed", &seed.to_string()]);
        for phase in phases {
            command.args(["--phase", &phase.to_string()]);
        }
        let child: Child = command.stdout(Stdio::piped()).spawn().expect("spawn open-loop client");
        Self { process: ProcessGuard::new(child) }
    }

    /// Waits for the run to end and returns what it did.
    pub fn finish(mut self) -> OpenLoopReport {
        let child = self.process.child();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().expect("piped stdout"), &mut out)
            .expect("read open-loop report");
        let status = child.wait().expect("wait for the open-loop client");
        assert!(status.success(), "open-loop client failed: {status}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("open-loop report: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_parse_and_print_back_and_bad_ones_say_what_is_expected() {
        let phase: Phase = "surge:320:20".parse().unwrap();
        assert_eq!(phase, Phase { name: "surge".into(), rate_per_s: 320.0, seconds: 20.0 });
        assert_eq!(phase.to_string().parse::<Phase>().unwrap(), phase);
        for bad in ["surge", "surge:x:1", "surge:1:2:3", ":1:2", "surge:-1:2"] {
            let error = bad.parse::<Phase>().unwrap_err();
            assert!(error.contains("NAME:RATE_PER_S:SECONDS"), "{bad}: {error}");
        }
    }

    #[test]
    fn arrivals_follow_the_rate_and_failures_are_named() {
        // Nothing listens on this port of the loopback: every connection is refused at once.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = closed.local_addr().unwrap();
        drop(closed);
        let phases = ["warm:0:0.2".parse().unwrap(), "busy:500:1".parse().unwrap()];
        let report = run(&[target], &phases, Duration::from_millis(500), 10_000, 7).unwrap();
        let n = report.attempts.len();
        // Poisson with mean 500: within ±5 standard deviations (about ±112).
        assert!((388..=612).contains(&n), "{n} arrivals");
        assert!(
            report.attempts.iter().all(|a| a.outcome == Outcome::Failed("ECONNREFUSED".into())),
            "{:?}",
            report.attempts[0]
        );
        assert!(report.attempts.iter().all(|a| (200_000..1_200_000).contains(&a.at_us)), "arrivals inside the phase");
    }
}
