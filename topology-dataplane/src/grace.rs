//! Waiting until no program can still use what it read before a map update.
//!
//! The socket programs run inside an RCU read-side critical section (`bpf_prog_run_array_cg`
//! holds `rcu_read_lock()` around them), so once an RCU grace period has passed after a service
//! entry was replaced, no program holds the old entry any more and its slots may be rewritten.
//!
//! The kernel's documented way for userspace to wait for one is an update of a map-in-map: after
//! `BPF_MAP_UPDATE_ELEM` on an `ARRAY_OF_MAPS` succeeds, the kernel has called `synchronize_rcu()`
//! so that "userspace, when we return to it, knows that all non-sleepable programs that could be
//! running use the new map value" (`maybe_wait_bpf_programs`, kernel/bpf/syscall.c). Unlike
//! `membarrier(MEMBARRIER_CMD_GLOBAL)`, which returns at once on a one-CPU machine even when a
//! preempted program is mid-run (preemptible RCU), this is a real grace period on every
//! configuration. The writer rewrites an entry of the counters map with the same inner map.
//!
//! That update takes a grace period, 10–30 ms on a busy node: the index asks for one in the
//! background ([`Grace::begin`], [`Background`]) well before it must have one, so that a Service
//! under churn does not hold the control loop that long every 64 rewrites of its position. Grace
//! periods are numbered ([`Epochs`]): what was written before period `n` began is safe to reuse
//! once `n` has passed.

use std::{
    os::fd::{AsRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
};

use super::error::DataplaneError;

/// Something that can wait for an RCU grace period.
pub trait Grace {
    /// Returns once every program that started before the call has finished; an error means
    /// no grace period was waited for, and nothing that needs one may be reused.
    fn wait(&mut self) -> Result<(), DataplaneError>;
    /// The grace periods begun and passed so far, [`Grace::wait`]'s too.
    fn epochs(&mut self) -> Epochs;
    /// Begins a grace period in the background when none is under way and this can (else does
    /// nothing): the next [`Grace::epochs`] counts it begun, a later one passed.
    fn begin(&mut self) {}
}

/// Grace periods, numbered from 1: the latest begun, and the latest passed (every program running
/// now started after it began). Period `n` began after everything done before `begun` was `n`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epochs {
    pub begun: u64,
    pub passed: u64,
    /// Those the writer waited for itself, the others passing in the background.
    pub waited: u64,
}

/// The numbering of grace periods, for a [`Grace`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock(Epochs);

impl Clock {
    pub fn epochs(&self) -> Epochs {
        self.0
    }

    /// A grace period was waited for: begun and passed.
    pub fn waited(&mut self) {
        self.0.begun += 1;
        self.0.passed = self.0.begun;
        self.0.waited += 1;
    }

    /// One begins in the background; its number.
    pub fn began(&mut self) -> u64 {
        self.0.begun += 1;
        self.0.begun
    }

    /// Period `number`, begun in the background, has passed.
    pub fn passed(&mut self, number: u64) {
        self.0.passed = self.0.passed.max(number.min(self.0.begun));
    }

    /// Whether one begun in the background has yet to pass.
    pub fn under_way(&self) -> bool {
        self.0.passed < self.0.begun
    }
}

/// A thread that waits for grace periods as asked (rewriting entry 0 of an array of maps with the
/// inner map it holds), so that the writer does not.
pub struct Background {
    asks: mpsc::Sender<u64>,
    /// The latest period it has waited for. One whose wait failed never passes: the writer
    /// waits itself when it must.
    passed: Arc<AtomicU64>,
}

impl Background {
    /// Starts the thread on `outer` (an array of maps) and `inner` (what its entry 0 holds).
    pub fn start(outer: OwnedFd, inner: OwnedFd) -> std::io::Result<Self> {
        let (asks, asked) = mpsc::channel::<u64>();
        let passed = Arc::new(AtomicU64::new(0));
        let passed_ = passed.clone();
        std::thread::Builder::new().name("grace".into()).spawn(move || {
            // Ends when the writer (the sender) is dropped.
            for number in asked {
                if update_same(&outer, &inner).is_ok() {
                    passed_.store(number, Ordering::Release);
                }
            }
        })?;
        Ok(Self { asks, passed })
    }

    /// Asks for period `number`; false if the thread is gone.
    pub fn ask(&self, number: u64) -> bool {
        self.asks.send(number).is_ok()
    }

    /// The latest period passed.
    pub fn passed(&self) -> u64 {
        self.passed.load(Ordering::Acquire)
    }
}

/// `BPF_MAP_UPDATE_ELEM` of entry 0 of the array of maps `outer` with `inner`: the kernel waits for
/// a grace period before it returns (`maybe_wait_bpf_programs`), the update [`Grace::wait`]'s
/// own rewrite makes. One element, not a batch: the single update is the one documented to wait.
fn update_same(outer: &OwnedFd, inner: &OwnedFd) -> std::io::Result<()> {
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    #[repr(C)]
    struct Attr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    let key = 0u32;
    let value = u32::try_from(inner.as_raw_fd()).map_err(std::io::Error::other)?;
    let mut attr = Attr {
        map_fd: u32::try_from(outer.as_raw_fd()).map_err(std::io::Error::other)?,
        _pad: 0,
        key: std::ptr::from_ref(&key) as u64,
        value: std::ptr::from_ref(&value) as u64,
        flags: 0,
    };
    // SAFETY: `attr` is the `bpf_attr` layout of BPF_MAP_UPDATE_ELEM; the pointers it holds point
    // at locals that outlive the call.
    let done =
        unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_ELEM, &raw mut attr, size_of::<Attr>() as libc::c_uint) };
    if done < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Grace periods, counted; those begun in the background pass when the test says.
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Debug, Default)]
pub struct CountedGrace {
    /// Grace periods waited for.
    pub periods: u64,
    /// Every wait fails (the kernel refused the map-in-map update).
    pub fail: bool,
    /// Periods may begin in the background ([`Grace::begin`]); each passes at [`Self::pass`].
    pub background: bool,
    /// Periods begun in the background.
    pub begun: u64,
    clock: Clock,
}

#[cfg(any(test, feature = "testing"))]
impl CountedGrace {
    /// The period begun in the background passes.
    pub fn pass(&mut self) {
        let begun = self.clock.epochs().begun;
        self.clock.passed(begun);
    }
}

#[cfg(any(test, feature = "testing"))]
impl Grace for CountedGrace {
    fn wait(&mut self) -> Result<(), DataplaneError> {
        if self.fail {
            return Err(DataplaneError::GracePeriod { source: std::io::Error::other("injected failure") });
        }
        self.periods += 1;
        self.clock.waited();
        Ok(())
    }

    fn epochs(&mut self) -> Epochs {
        self.clock.epochs()
    }

    fn begin(&mut self) {
        if self.background && !self.clock.under_way() {
            self.begun += 1;
            self.clock.began();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Clock;

    #[test]
    fn the_clock_counts_waits_and_background_periods() {
        let mut clock = Clock::default();
        clock.waited();
        assert_eq!((clock.epochs().begun, clock.epochs().passed), (1, 1));
        let number = clock.began();
        assert!(clock.under_way());
        // A wait while one is under way passes both: it began later.
        clock.waited();
        assert!(!clock.under_way());
        clock.passed(number);
        assert_eq!((clock.epochs().begun, clock.epochs().passed), (3, 3), "a late report changes nothing");
        let number = clock.began();
        clock.passed(number);
        assert_eq!(clock.epochs().passed, 4);
    }
}
