//! What a batch of attempts did: where each landed, what failed and when.

use std::{collections::BTreeMap, io};

use serde::{Deserialize, Serialize};

/// Where a batch of attempts landed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Attempts made.
    pub attempts: u64,
    /// Successful attempts by the name of the backend that answered.
    pub landed: BTreeMap<String, u64>,
    /// Failed attempts by errno name (`ECONNREFUSED`, `ENETUNREACH`, `timeout`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Answers whose peer (`getpeername()` or `recvfrom()` source) was not the address dialled.
    pub peer_mismatch: u64,
    /// `connect()` durations in nanoseconds, when requested.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connect_ns: Vec<u64>,
    /// In an interleaved comparison ([`Client::interleaved`]): the baseline's `connect()`
    /// durations, `baseline_ns[i]` measured next to `connect_ns[i]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline_ns: Vec<u64>,
    /// (`CLOCK_MONOTONIC` ns, backend) of every successful attempt, when asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub landings: Vec<(u64, String)>,
    /// `CLOCK_MONOTONIC` ns of every failed attempt, when asked for (with `landings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_at: Vec<u64>,
    /// Of those, the TCP attempts that failed after their handshake had succeeded (reset or cut
    /// while the answer was read): not the router's to avoid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broken_at: Vec<u64>,
    /// Whether to fill `landings` and `failed_at`.
    #[serde(skip)]
    pub stamp: bool,
}

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process of the machine.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write; CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

impl Report {
    /// Successful attempts.
    pub fn successes(&self) -> u64 {
        self.landed.values().sum()
    }

    /// Failed attempts.
    pub fn failures(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Attempts that landed on `name`.
    pub fn landed_on(&self, name: &str) -> u64 {
        self.landed.get(name).copied().unwrap_or(0)
    }

    /// Failures with errno `name`.
    pub fn errno(&self, name: &str) -> u64 {
        self.errors.get(name).copied().unwrap_or(0)
    }

    pub(crate) fn record(&mut self, outcome: io::Result<String>) {
        self.attempts += 1;
        match outcome {
            Ok(name) => {
                if self.stamp {
                    self.landings.push((monotonic_ns(), name.clone()));
                }
                *self.landed.entry(name).or_default() += 1;
            }
            Err(error) => {
                if self.stamp {
                    self.failed_at.push(monotonic_ns());
                }
                *self.errors.entry(errno_name(&error)).or_default() += 1;
            }
        }
    }

    /// Adds another report's counts to this one.
    pub fn merge(&mut self, other: &Report) {
        self.attempts += other.attempts;
        for (name, count) in &other.landed {
            *self.landed.entry(name.clone()).or_default() += count;
        }
        for (name, count) in &other.errors {
            *self.errors.entry(name.clone()).or_default() += count;
        }
        self.peer_mismatch += other.peer_mismatch;
        self.connect_ns.extend(&other.connect_ns);
        self.baseline_ns.extend(&other.baseline_ns);
    }
}

/// A short name for an I/O error: the errno constant, or `timeout`.
pub fn errno_name(error: &io::Error) -> String {
    if matches!(error.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) {
        return "timeout".into();
    }
    let known = [
        (libc::ECONNREFUSED, "ECONNREFUSED"),
        (libc::ENETUNREACH, "ENETUNREACH"),
        (libc::EHOSTUNREACH, "EHOSTUNREACH"),
        (libc::ECONNRESET, "ECONNRESET"),
        (libc::ECONNABORTED, "ECONNABORTED"),
        (libc::EDESTADDRREQ, "EDESTADDRREQ"),
        (libc::EPERM, "EPERM"),
        (libc::EACCES, "EACCES"),
        (libc::EADDRNOTAVAIL, "EADDRNOTAVAIL"),
        (libc::ETIMEDOUT, "timeout"),
        (libc::EAGAIN, "timeout"),
    ];
    match error.raw_os_error() {
        Some(code) => known
            .iter()
            .find(|(errno, _)| *errno == code)
            .map_or_else(|| format!("errno {code}"), |(_, name)| (*name).to_owned()),
        None => format!("{:?}", error.kind()),
    }
}
