//! The feedback controller's place in the control loop: once per interval, while some port is
//! under feedback, read the kernel's load counters, let the controller decide, and mark the
//! Services whose inputs changed for the next sync.

use std::{collections::BTreeSet, time::Instant};

use super::program::Programmer;
use crate::{
    cluster::ObjectKey,
    feedback::{Tuning, control::Regulator, metrics::FeedbackMetrics},
    plan::NodePlan,
};

/// The controller and its clock.
pub struct FeedbackLoop {
    regulator: Regulator,
    started: Instant,
    last: Option<Instant>,
}

impl FeedbackLoop {
    /// A loop with `tuning`.
    pub fn new(tuning: Tuning) -> Self {
        Self { regulator: Regulator::new(tuning), started: Instant::now(), last: None }
    }

    /// One look, if an interval has passed: returns the Services to decide again.
    pub fn step(
        &mut self,
        programmer: &impl Programmer,
        plan: &mut NodePlan,
        metrics: &FeedbackMetrics,
    ) -> BTreeSet<ObjectKey> {
        let interval = std::time::Duration::from_millis(self.regulator.tuning().interval_ms);
        if self.last.is_some_and(|at| at.elapsed() < interval) {
            return BTreeSet::new();
        }
        // Once an interval, whether or not a port is under feedback: the event loop runs this
        // after every batch of events.
        self.last = Some(Instant::now());
        let ports = plan.feedback_ports();
        if ports.is_empty() && self.regulator.inputs().is_empty() {
            return BTreeSet::new();
        }
        let reading = match programmer.backend_load() {
            Ok(reading) => reading,
            Err(error) => {
                tracing::warn!(%error, "the load counters could not be read; feedback holds its last decisions");
                return BTreeSet::new();
            }
        };
        let now_ms = self.started.elapsed().as_millis() as u64;
        let changed = self.regulator.step(now_ms, &reading, &ports);
        for key in &changed {
            if let Some(input) = self.regulator.inputs().get(key) {
                tracing::info!(service = %key.service, port = key.port, shift = input.shift, reason = %input.reason, "feedback");
            }
        }
        metrics.set(self.regulator.inputs());
        plan.set_feedback(self.regulator.inputs())
    }
}
