//! Passive outlier ejection, per node and per Service port: a backend whose TCP handshakes from
//! this node's pods through one Service port fail [`CONSECUTIVE_FAILURES`] times in a row
//! (refused, unanswered, unreachable), from two pods at least, is avoided by this node's connect
//! hooks for that port for an ejection time that doubles with each ejection, from
//! [`BASE_EJECTION_NS`] up to [`MAX_EJECTION_NS`] (Envoy's consecutive failures, base and
//! maximum ejection time), while the port's cap allows ([`ledger`]).
//!
//! Nothing runs on a handshake that succeeds: tracing programs run only where one fails — a
//! reset answering the SYN (`tcp_receive_reset`), a SYN retransmitted unanswered
//! (`tcp_retransmit_skb`), an ICMP error during the handshake (`inet_sk_error_report`) — and
//! find the socket in the TCP connections table by cookie. A success is not seen, so "in a row"
//! is read from the connect hooks: while some backend failed within [`FAILING_WINDOW_NS`], they
//! count the connections they send a failing backend ([`OutlierEntry::attempt`]). A failure that
//! finds, since the previous one, [`SUCCESS_EVIDENCE`] connections (more than a failing backend's
//! handshakes in flight between two of its failures) or one older than [`SETTLE_NS`] (every
//! failure this sees shows within that time of its connect) knows one of them succeeded, and
//! starts a new run ([`OutlierEntry::fail`]). Each socket's handshake counts once, however many
//! of its SYNs go unanswered, and only while the socket still connects to the backend it was
//! sent to.
//!
//! What one tenant can do to another: the evidence is the Service port's own — its failures, its
//! settings (`topology-agent.io/outlier-ejection`), its ejections ([`OutlierKey`]) — so a Service
//! naming another's pod as its endpoint ejects that pod from itself alone; a run ejects only
//! with failures from two network namespaces (two pods; every host-network pod is one), so one
//! pod's own trouble (its NetworkPolicy dropping its SYNs, a TTL it set) never ejects a backend
//! for the node; and the cap bounds what many failing backends can take from a set.
//!
//! The connect hooks look a drawn backend up only while its bucket says it may be failing or
//! ejected ([`BUCKETS`]; while no backend of the node is, they read one word,
//! [`OutlierState::active`]); an ejected one they draw again, up to [`REDRAWS`] times, then take the
//! first backend not ejected among [`SCAN_SLOTS`] slots from a random one. A set of which more
//! than half the slots searched are ejected (one that shrank under its ejections) is used whole
//! (Envoy's panic threshold): ejection never empties a set.

pub mod ledger;

pub use ledger::{LEDGER_ENTRIES, OutlierLedger, ejection_cap};

use crate::BackendKey;

/// A backend as one Service port's ejections name it.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct OutlierKey {
    /// The backend.
    pub backend: BackendKey,
    /// The Service port's id (`ServiceValue::service_id`).
    pub service_id: u32,
}
const _: () = assert!(size_of::<OutlierKey>() == 24);

/// One backend's failures and ejections through one Service port (the value of
/// `map_names::OUTLIERS`, keyed by [`OutlierKey`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct OutlierEntry {
    /// Handshakes failed in the current run (0 after an ejection).
    pub failures: u32,
    /// Times ejected (each doubles the next ejection time; forgiven after a quiet window).
    pub ejections: u32,
    /// `CLOCK_MONOTONIC` until which the connect hooks avoid it, nanoseconds; 0: never ejected.
    pub ejected_until_ns: u64,
    /// When its last handshake failed.
    pub last_failure_ns: u64,
    /// Connections the connect hooks sent it since its last failure (counted while some backend
    /// is failing).
    pub attempts: u32,
    /// The client (network namespace cookie, low word) of the run's first failure.
    pub run_client: u32,
    /// When the first of those connections was sent.
    pub first_attempt_ns: u64,
    /// Whether a failure of the run came from another client than its first: 1 if so.
    pub many_clients: u32,
    /// Zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<OutlierEntry>() == 48);

/// Slots searched, from a random one, for a backend not ejected and for the share ejected.
pub const SCAN_SLOTS: u32 = 16;

/// Whether any backend of the node is failing or ejected, and which buckets of backends may be
/// (the one entry of `map_names::OUTLIER_STATE`): one cache line, which the connect hooks read
/// for every connection anyway; while no backend is failing they read its first word alone.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct OutlierState {
    /// Nonzero while some backend may be failing or ejected: set by the programs at each failure,
    /// and every two seconds by the agent to whether one is ([`OutlierEntry::active`]).
    pub active: u64,
    /// A bit per bucket ([`BUCKETS`], [`bucket_of`]): set while a backend hashed to it may be
    /// failing or ejected — by the programs at each failure, and every two seconds by the agent
    /// from the entries. A bit the agent clears as a failure sets it is set again by that
    /// backend's next failure; an agent that stops leaves bits set (lookups, never an ejection
    /// missed).
    pub bits: [u64; BUCKET_WORDS as usize],
    /// Zero.
    pub _pad: [u64; 3],
}
const _: () = assert!(size_of::<OutlierState>() == 64);

/// Buckets of [`OutlierState::bits`], a power of two: while some backend of the node is failing,
/// a connection to another pays a hash and a bit test in a line already read, not a lookup nor
/// a clock read, unless its bucket is shared with a failing one (k failing backends: about k in
/// 256 connections look theirs up).
pub const BUCKETS: u32 = 256;
/// `u64` words of the bucket bits.
pub const BUCKET_WORDS: u32 = BUCKETS / 64;

impl OutlierState {
    /// Whether bucket `bucket`'s bit is set.
    #[inline(always)]
    pub fn flagged(&self, bucket: u32) -> bool {
        let word = (bucket >> 6) & (BUCKET_WORDS - 1);
        self.bits[word as usize] >> (bucket & 63) & 1 != 0
    }

    /// Sets bucket `bucket`'s bit.
    #[inline(always)]
    pub fn flag(&mut self, bucket: u32) {
        let word = (bucket >> 6) & (BUCKET_WORDS - 1);
        self.bits[word as usize] |= 1 << (bucket & 63);
    }
}

/// The bucket of the backend `addr`:`port` (a multiplicative hash of its words).
#[inline(always)]
pub fn bucket_of(addr: &[u8; 16], port: u16) -> u32 {
    let word = |i: usize| u32::from_ne_bytes([addr[i], addr[i + 1], addr[i + 2], addr[i + 3]]);
    bucket_of_words([word(0), word(4), word(8), word(12)], port)
}

/// [`bucket_of`] of an address as its four native-endian words (see [`crate::Backend::addr_words`]):
/// four loads where the bytes' alignment is unknown to the compiler and would cost sixteen.
#[inline(always)]
pub fn bucket_of_words(words: [u32; 4], port: u16) -> u32 {
    let mixed = (words[0] ^ words[1].rotate_left(7) ^ words[2].rotate_left(13) ^ words[3].rotate_left(19))
        ^ u32::from(port).rotate_left(23);
    mixed.wrapping_mul(0x9e37_79b1) >> (32 - BUCKETS.trailing_zeros())
}

/// The connect hooks' count over [`SCAN_SLOTS`] of a set's slots while a drawn backend is ejected (the one
/// per-CPU entry of `map_names::OUTLIER_SCAN`): kept in a map, not on the stack, so the verifier
/// sees each slot's outcome as unknown and does not walk every combination of them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct OutlierScan {
    /// Slots of the set searched.
    pub searched: u32,
    /// Of those, slots whose backend is ejected.
    pub out: u32,
    /// Offset of the first slot whose backend is not; `u32::MAX` when none is.
    pub first_in: u32,
    /// Zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<OutlierScan>() == 16);

/// Failed handshakes in a row that eject a backend (Envoy's `consecutive_5xx` default).
pub const CONSECUTIVE_FAILURES: u32 = 5;
/// The first ejection's length.
pub const BASE_EJECTION_NS: u64 = 10_000_000_000;
/// The longest ejection (Envoy's `max_ejection_time` default).
pub const MAX_EJECTION_NS: u64 = 300_000_000_000;
/// How long after a backend's last failure (or ejection) its connections are counted; a failure
/// after a quiet window this long starts a new run and forgives earlier ejections.
pub const FAILING_WINDOW_NS: u64 = 60_000_000_000;
/// The longest a failure this sees takes to show after its connect: the first SYN
/// retransmission comes after the initial retransmission timeout (1 s); a reset or an ICMP
/// error answers the SYN itself.
pub const SETTLE_NS: u64 = 2_000_000_000;
/// Connections sent a backend between two of its failures that mean one of them succeeded: a
/// backend that fails every handshake sees about one between two failures (each failure lets
/// its client try again), a healthy one with sparse failures many.
pub const SUCCESS_EVIDENCE: u32 = 3;
/// Draws after the first while the drawn backend is ejected (then the set's first slots are
/// searched for one that is not).
pub const REDRAWS: u32 = 3;

/// A port's ejection settings (`topology-agent.io/outlier-ejection: "failures=N,base=Ns"`),
/// carried in its options' flags: the failures in a row that eject, and the first ejection's
/// length (each further one doubles it, up to [`MAX_EJECTION_NS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EjectionSettings {
    /// Failed handshakes in a row that eject.
    pub failures: u32,
    /// The first ejection's length, nanoseconds.
    pub base_ns: u64,
}

impl EjectionSettings {
    /// Envoy's defaults: [`CONSECUTIVE_FAILURES`] and [`BASE_EJECTION_NS`].
    pub const DEFAULT: Self = Self { failures: CONSECUTIVE_FAILURES, base_ns: BASE_EJECTION_NS };

    /// The settings a port's `flags` (`service_flags`) carry; the defaults where they carry none.
    #[inline(always)]
    pub fn of(flags: u32) -> Self {
        use crate::service_flags::{
            OUTLIER_BASE_MASK, OUTLIER_BASE_SHIFT, OUTLIER_FAILURES_MASK, OUTLIER_FAILURES_SHIFT,
        };
        let failures = flags >> OUTLIER_FAILURES_SHIFT & OUTLIER_FAILURES_MASK;
        let base_s = u64::from(flags >> OUTLIER_BASE_SHIFT & OUTLIER_BASE_MASK);
        Self {
            failures: if failures == 0 { CONSECUTIVE_FAILURES } else { failures },
            base_ns: if base_s == 0 { BASE_EJECTION_NS } else { base_s * 1_000_000_000 },
        }
    }
}

/// What a failed handshake did to its backend's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// One more in the run.
    Counted,
    /// The run reached the port's failures: ejected until then (`CLOCK_MONOTONIC`, ns).
    Ejected(u64),
    /// The run reached them, all from one client: not ejected (one pod's own trouble).
    OneClient,
    /// The run reached them from two clients, but the port's cap was reached: not ejected.
    Capped,
    /// A connection made before its ejection: nothing more is counted.
    WhileEjected,
}

impl OutlierEntry {
    /// The length of ejection number `ejections` (1 for the first) with the default base.
    #[inline(always)]
    pub fn ejection_ns(ejections: u32) -> u64 {
        Self::ejection_ns_from(BASE_EJECTION_NS, ejections)
    }

    /// The length of ejection number `ejections` (1 for the first) from a first one of `base_ns`
    /// (at most 255 s), doubling up to [`MAX_EJECTION_NS`].
    #[inline(always)]
    pub fn ejection_ns_from(base_ns: u64, ejections: u32) -> u64 {
        // Shifts, not a multiplication: the BPF target has no 128-bit overflow check. Nine
        // doublings of 1 s pass the maximum already.
        let doublings = if ejections > 10 { 9 } else { ejections.saturating_sub(1) };
        let length = base_ns << doublings;
        if length < MAX_EJECTION_NS { length } else { MAX_EJECTION_NS }
    }

    /// Whether the connect hooks should look it up at `now`: ejected, or failed within a failing
    /// window (its connections are counted).
    pub fn active(&self, now: u64) -> bool {
        now < self.ejected_until_ns || now.saturating_sub(self.last_failure_ns) <= FAILING_WINDOW_NS
    }

    /// The connect hooks sent it a connection at `now` (`CLOCK_MONOTONIC`, ns).
    #[inline(always)]
    pub fn attempt(&mut self, now: u64) {
        if self.attempts == 0 {
            self.first_attempt_ns = now;
        }
        self.attempts = self.attempts.saturating_add(1);
    }

    /// A handshake to it from `client` failed at `now`: a new run if one of the connections sent
    /// since the last failure succeeded ([`SUCCESS_EVIDENCE`] of them, or one that has had
    /// [`SETTLE_NS`] to fail) or after a quiet window, else one more in the run; an ejection at
    /// `tuning`'s failures if two clients failed in the run and the cap admits it (see
    /// [`fail_adding`](Self::fail_adding)).
    pub fn fail(
        &mut self,
        now: u64,
        tuning: EjectionSettings,
        client: u32,
        admit: impl FnOnce(u64) -> bool,
    ) -> Failure {
        self.fail_adding(
            now,
            tuning,
            client,
            |failures| {
                *failures = failures.saturating_add(1);
                *failures
            },
            admit,
        )
    }

    /// [`fail`](Self::fail), the run's count raised by `add_one`, which returns the count after
    /// it: in the programs an atomic add read back, so that failures of one backend counted on
    /// two CPUs at once both count (the second sees both, and ejects). `admit(until)` takes a
    /// place in the port's ledger for an ejection until then, or refuses (the cap): a refused run
    /// keeps its count, and its next failure asks again.
    #[inline(always)]
    pub fn fail_adding(
        &mut self,
        now: u64,
        tuning: EjectionSettings,
        client: u32,
        add_one: impl FnOnce(&mut u32) -> u32,
        admit: impl FnOnce(u64) -> bool,
    ) -> Failure {
        let quiet_since =
            if self.ejected_until_ns > self.last_failure_ns { self.ejected_until_ns } else { self.last_failure_ns };
        let quiet = now.saturating_sub(quiet_since) > FAILING_WINDOW_NS;
        let succeeded = self.attempts >= SUCCESS_EVIDENCE
            || (self.attempts > 0 && now.saturating_sub(self.first_attempt_ns) > SETTLE_NS);
        self.last_failure_ns = now;
        self.attempts = 0;
        if now < self.ejected_until_ns {
            return Failure::WhileEjected;
        }
        if quiet {
            self.ejections = 0;
        }
        let failures = if quiet || succeeded {
            self.failures = 1;
            self.run_client = client;
            self.many_clients = 0;
            1
        } else {
            if self.failures == 0 {
                // The first failure after an ejection starts the run.
                self.run_client = client;
                self.many_clients = 0;
            } else if self.run_client != client {
                self.many_clients = 1;
            }
            add_one(&mut self.failures)
        };
        if failures < tuning.failures {
            return Failure::Counted;
        }
        if self.many_clients == 0 {
            return Failure::OneClient;
        }
        let until = now + Self::ejection_ns_from(tuning.base_ns, self.ejections.saturating_add(1));
        if !admit(until) {
            return Failure::Capped;
        }
        self.ejections = self.ejections.saturating_add(1);
        self.ejected_until_ns = until;
        self.failures = 0;
        Failure::Ejected(until)
    }
}

#[cfg(test)]
mod tests;
