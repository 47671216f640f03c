//! The loop's periodic jobs and their cadences, in one table with one clock: what is due when the
//! loop wakes, and how long it may sleep. The jobs themselves are the controller's and its
//! readers' (`accounting.rs`, `ejections.rs`); the schedule only says when.

use std::time::{Duration, Instant};

/// How often the kernel heartbeat is refreshed while the view is current; `--fail-open-after`
/// must be comfortably longer.
pub const BEAT_INTERVAL: Duration = Duration::from_millis(500);
/// How often the programmer drops what no programmed set needs any more (the load measurements of
/// backends gone and idle).
pub const TIDY_INTERVAL: Duration = Duration::from_secs(30);
/// How often the backends the kernel ejected are read: an ejection lasts 1 s at the least.
pub const EJECTIONS_INTERVAL: Duration = Duration::from_secs(2);
/// How often the bytes counted are read: as often as the open connections are swept.
pub const BYTES_INTERVAL: Duration = crate::sockets::sweep::INTERVAL;

/// The longest the loop sleeps without events: the liveness beat and questions about the plan
/// are served at least this often.
const IDLE_WAKE: Duration = Duration::from_millis(250);

/// A job the loop runs on a cadence of its own, besides taking events in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Job {
    /// Re-apply the whole desired state: retry failures and heal drift.
    Reconcile,
    /// Refresh the kernel heartbeat (retried at the next wake until it is written) and check the
    /// programs are still attached.
    Heartbeat,
    /// Read the backends the kernel ejected.
    Ejections,
    /// Read the bytes counted.
    Bytes,
    /// Drop what no programmed set needs.
    Tidy,
    /// Read the load the kernel measured and let the feedback controller move shares.
    Feedback,
}

impl Job {
    /// Every job, in the order a wake runs those due.
    pub(super) const ALL: [Self; 6] =
        [Self::Reconcile, Self::Heartbeat, Self::Ejections, Self::Bytes, Self::Tidy, Self::Feedback];

    /// Whether the job runs only while the agent's view of the cluster is current: all but the
    /// reconcile and the feedback wait, like the heartbeat, for a view the kernel may be given
    /// (the feedback moves shares of what is programmed, whatever the view).
    pub(super) fn needs_current_view(self) -> bool {
        !matches!(self, Self::Reconcile | Self::Feedback)
    }

    /// Whether the job reads what was programmed, and so waits for the first sync (the reconcile
    /// has nothing to do before it, and says so itself).
    pub(super) fn needs_programmed(self) -> bool {
        matches!(self, Self::Ejections | Self::Bytes | Self::Feedback)
    }
}

/// When each job last ran.
pub(super) struct Schedule {
    reconcile_every: Duration,
    feedback_every: Duration,
    last: [Option<Instant>; Job::ALL.len()],
}

impl Schedule {
    /// A schedule from `now`, reconciling and looking at feedback every so often: the reconcile
    /// is first due a whole interval later, every other job at once.
    pub(super) fn new(reconcile_every: Duration, feedback_every: Duration, now: Instant) -> Self {
        let mut last = [None; Job::ALL.len()];
        last[Job::Reconcile as usize] = Some(now);
        Self { reconcile_every, feedback_every, last }
    }

    /// How often `job` runs.
    fn every(&self, job: Job) -> Duration {
        match job {
            Job::Reconcile => self.reconcile_every,
            Job::Heartbeat => BEAT_INTERVAL,
            Job::Ejections => EJECTIONS_INTERVAL,
            Job::Bytes => BYTES_INTERVAL,
            Job::Tidy => TIDY_INTERVAL,
            Job::Feedback => self.feedback_every,
        }
    }

    /// Whether `job` is due at `now`.
    pub(super) fn due(&self, job: Job, now: Instant) -> bool {
        self.last[job as usize].is_none_or(|at| now.saturating_duration_since(at) >= self.every(job))
    }

    /// Notes that `job` ran at `now`.
    pub(super) fn done(&mut self, job: Job, now: Instant) {
        self.last[job as usize] = Some(now);
    }

    /// How long the loop may wait for events before a job is due: at most [`IDLE_WAKE`], and no
    /// later than the reconcile.
    pub(super) fn wait(&self, now: Instant) -> Duration {
        let reconcile = self.last[Job::Reconcile as usize]
            .map_or(Duration::ZERO, |at| (at + self.reconcile_every).saturating_duration_since(now));
        reconcile.min(IDLE_WAKE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_job_is_due_on_its_own_cadence() {
        let start = Instant::now();
        let mut schedule = Schedule::new(Duration::from_secs(60), Duration::from_secs(1), start);
        assert!(!schedule.due(Job::Reconcile, start), "the first reconcile waits a whole interval");
        for job in [Job::Heartbeat, Job::Ejections, Job::Bytes, Job::Tidy, Job::Feedback] {
            assert!(schedule.due(job, start), "{job:?} is due at once");
            schedule.done(job, start);
        }
        let later = start + Duration::from_secs(3);
        assert!(schedule.due(Job::Heartbeat, later) && schedule.due(Job::Ejections, later));
        assert!(schedule.due(Job::Feedback, later) && !schedule.due(Job::Feedback, start + Duration::from_millis(900)));
        assert!(!schedule.due(Job::Tidy, later) && !schedule.due(Job::Reconcile, later));
        assert!(schedule.due(Job::Reconcile, start + Duration::from_secs(60)));
        assert_eq!(
            schedule.wait(start + Duration::from_secs(59) + Duration::from_millis(900)),
            Duration::from_millis(100)
        );
        assert_eq!(schedule.wait(later), IDLE_WAKE);
    }
}
