//! The feedback controller's place in the control loop: a scheduled job (`schedule.rs`, once per
//! [`Tuning::interval_ms`]) that, while some port is under feedback, reads the kernel's load
//! counters, lets the controller decide, and returns the Services whose inputs changed.

use std::{collections::BTreeSet, time::Instant};

use topology_common::{capacity, map_names};
use topology_model::ObjectKey;
use topology_policy::{
    feedback::{Tuning, control::Regulator},
    plan::NodePlan,
};

use super::program::Programmer;
use crate::metrics::{MapLabels, Metrics};

/// The controller and its clock.
pub struct FeedbackLoop {
    regulator: Regulator,
    started: Instant,
    /// Whether the load map was full at the last reading (said once per change).
    full: bool,
}

impl FeedbackLoop {
    /// A loop with `tuning`.
    pub fn new(tuning: Tuning) -> Self {
        Self { regulator: Regulator::new(tuning), started: Instant::now(), full: false }
    }

    /// How often it looks.
    pub fn interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.regulator.tuning().interval_ms)
    }

    /// Milliseconds since the loop started, its clock.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// One look at `now_ms` (its clock): returns the Services to decide again.
    pub fn step(
        &mut self,
        now_ms: u64,
        programmer: &impl Programmer,
        plan: &mut NodePlan,
        metrics: &Metrics,
    ) -> BTreeSet<ObjectKey> {
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
        self.watch_room(reading.len(), metrics);
        let changed = self.regulator.step(now_ms, &reading, &ports);
        for key in &changed {
            if let Some(input) = self.regulator.inputs().get(key) {
                tracing::info!(service = %key.service, port = key.port, shift = input.shift, reason = %input.reason, "feedback");
            }
        }
        metrics.feedback.set(self.regulator.inputs());
        plan.set_feedback(self.regulator.inputs())
    }

    /// Reports how full the load map is (`topology_agent_map_entries{map="topo_backend_load"}`,
    /// which the map alerts watch): a backend beyond its capacity is not measured, so its ports
    /// hold their static plan — said, not silent.
    fn watch_room(&mut self, measured: usize, metrics: &Metrics) {
        let labels = MapLabels { map: map_names::BACKEND_LOAD.to_owned() };
        metrics.control.map_entries.get_or_create(&labels).set(measured as i64);
        metrics.control.map_capacity.get_or_create(&labels).set(i64::from(capacity::BACKEND_LOAD));
        let full = measured >= capacity::BACKEND_LOAD as usize;
        if full && !self.full {
            tracing::warn!(
                backends = measured,
                "the load map is full: backends beyond it are not measured, and their ports keep their static plan"
            );
        } else if !full && self.full {
            tracing::info!(backends = measured, "the load map has room again");
        }
        self.full = full;
    }
}
