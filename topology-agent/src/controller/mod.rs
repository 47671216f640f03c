//! The controller: keeps the kernel equal to what the policy says for this node. It owns the
//! cluster state and the dataplane; sources send it events, it recomputes only the Services an
//! event can affect, and hands the changed entries to the dataplane.
//!
//! Nothing is programmed until every source has completed its initial list; the first programming
//! is a full reconcile with whatever a previous agent left pinned (stale entries removed,
//! unchanged ones not rewritten). Events that arrive together are handled as one batch.

mod accounting;
mod context;
mod decide;
mod ejections;
mod feedback;
mod full_sync;
mod health;
mod ingest;
mod program;
mod query;
#[cfg(any(test, feature = "testing"))]
pub mod recording;
#[cfg(any(test, feature = "testing"))]
pub mod scenario;
mod schedule;

use std::{
    collections::BTreeSet,
    sync::{Arc, mpsc::RecvTimeoutError},
    time::{Duration, Instant},
};

use context::Context;
pub use full_sync::PIPELINE_FROM;
pub use health::{Health, NotLive, NotReady, WATCH_STALE_GRACE};
use ingest::Intake;
pub use program::{Observation, Programmer};
pub use query::{AskError, PlanClient, PlanQuery};
use schedule::{Job, Schedule};
use tokio_util::sync::CancellationToken;
use topology_dataplane::ApplyReport;
use topology_dns::DnsPublisher;
use topology_kube::{EventReceiver, ObjectId, SourceEvent, events::ProblemSink};
use topology_model::ObjectKey;
use topology_policy::{
    desired::ServicePort,
    explain,
    plan::{MeasuredPorts, NodePlan, steering::Steering},
};

use crate::{metrics::Metrics, sockets::Terminator};

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// The node this agent programs for.
    pub node: String,
    /// How often the whole desired state is re-applied, retrying service ports that failed.
    pub reconcile_interval: Duration,
    /// Every node runs an agent (the DaemonSet): a Service's own problems, the same on every
    /// node, are published by the one agent its name picks, not by each. Off, this agent
    /// publishes every problem it sees.
    pub one_publisher_per_service: bool,
    /// Which ports' connections the load signal measures.
    pub measured: MeasuredPorts,
}

impl ControllerConfig {
    /// Defaults: reconcile every minute; every problem published.
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            reconcile_interval: Duration::from_secs(60),
            one_publisher_per_service: false,
            measured: MeasuredPorts::Feedback,
        }
    }
}

/// The controller cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The node named with `--node` / `NODE_NAME` is not in the cluster.
    #[error(
        "node {0:?} is not in the cluster (no Node object of that name after the initial list); check --node or \
         NODE_NAME: routing without knowing where this node is would send traffic anywhere"
    )]
    UnknownNode(String),
    /// This node's own Node object cannot be used.
    #[error("this node's Node object cannot be used: {0}; the agent cannot route without knowing where it is")]
    InvalidOwnNode(topology_model::ObjectError),
}

/// Who else hears from the loop: the socket terminator (backends that left), the DNS responder
/// (this node's answers) and `/debug/plan` (questions about the plan).
#[derive(Default)]
struct Outlets {
    terminator: Option<Terminator>,
    dns: Option<DnsPublisher>,
    queries: Option<std::sync::mpsc::Receiver<PlanQuery>>,
}

/// The control loop.
pub struct Controller<P: Programmer> {
    config: ControllerConfig,
    programmer: P,
    /// The cluster state and what its changes left to decide.
    intake: Intake,
    plan: NodePlan,
    programmed: bool,
    /// When each periodic job last ran.
    schedule: Schedule,
    /// Whether programs were found detached at the last look (logged once per change).
    detached: bool,
    feedback: feedback::FeedbackLoop,
    /// The backends this node's kernel ejected, as last read.
    ejections: ejections::Ejections,
    /// The bytes counted, as last read.
    accounting: accounting::Accounting,
    /// Who else hears from the loop.
    outlets: Outlets,
    ctx: Context,
}

impl<P: Programmer> Controller<P> {
    /// A controller programming through `programmer`.
    pub fn new(
        config: ControllerConfig,
        programmer: P,
        health: Arc<Health>,
        metrics: Arc<Metrics>,
        sink: Box<dyn ProblemSink>,
    ) -> Self {
        let plan = NodePlan::new(config.node.clone(), None).measured(config.measured);
        let accounting = accounting::Accounting::starting_from(programmer.bytes().unwrap_or_default());
        let feedback = feedback::FeedbackLoop::new(Default::default());
        let schedule = Schedule::new(config.reconcile_interval, feedback.interval(), Instant::now());
        Self {
            config,
            programmer,
            intake: Intake::default(),
            plan,
            programmed: false,
            schedule,
            detached: false,
            feedback,
            ejections: ejections::Ejections::default(),
            accounting,
            outlets: Outlets::default(),
            ctx: Context::new(health, metrics, sink),
        }
    }

    /// Hands the backends that leave a set to `terminator`, which destroys the sockets still
    /// connected to them through the service.
    pub fn with_terminator(mut self, terminator: Option<Terminator>) -> Self {
        self.outlets.terminator = terminator;
        self
    }

    /// Keeps `dns`'s view of this node's answers current, one Service at a time.
    pub fn with_dns(mut self, dns: Option<DnsPublisher>) -> Self {
        self.outlets.dns = dns;
        self
    }

    /// Answers questions about the plan from `queries` (`/debug/plan`).
    pub fn with_queries(mut self, queries: Option<std::sync::mpsc::Receiver<PlanQuery>>) -> Self {
        self.outlets.queries = queries;
        self
    }

    /// Steers the cluster DNS Service's port 53 to this node's responder.
    pub fn with_steering(mut self, steering: Option<Steering>) -> Self {
        self.plan = NodePlan::new(self.config.node.clone(), steering).measured(self.config.measured);
        self
    }

    /// Runs until `shutdown` or until every source is gone; returns the programmer. The kernel
    /// state stays as last programmed.
    pub fn run(mut self, events: &EventReceiver, shutdown: &CancellationToken) -> Result<P, ControllerError> {
        while !shutdown.is_cancelled() {
            self.ctx.health.beat();
            match events.recv_timeout(self.schedule.wait(Instant::now())) {
                Ok((seen, event)) => {
                    self.receive(seen, event);
                    // Everything already queued joins this batch: bursts cost one sync.
                    while let Ok((seen, event)) = events.try_recv() {
                        self.receive(seen, event);
                    }
                    self.sync()?;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.run_due(Instant::now())?;
            self.answer_queries();
        }
        Ok(self.programmer)
    }

    /// Answers the questions waiting, from the plan the kernel was last given.
    fn answer_queries(&self) {
        let Some(queries) = &self.outlets.queries else { return };
        // At most what can be queued: a steady stream of questions still leaves the loop its events.
        for query in std::iter::from_fn(|| queries.try_recv().ok()).take(query::QUEUED) {
            let answer = match self.intake.state.node(&self.config.node) {
                Some(this) if self.programmed => match &query.service {
                    Some(key) if self.intake.state.service(key).is_none() => Err(AskError::UnknownService(key.clone())),
                    service => {
                        let mut report = explain::report(&self.intake.state, this, &self.plan, service.as_ref());
                        self.ejections.mark(&mut report);
                        Ok(report)
                    }
                },
                _ => Err(AskError::NotProgrammed),
            };
            // The asker may have given up; nothing to do then.
            let _ = query.reply.send(answer);
        }
    }

    /// Runs every periodic job due at `now`: those that need a current view only while it is,
    /// and those that read what was programmed only once something was. A job that failed is
    /// retried at the next wake. Fails only as a sync fails (the feedback's moves are synced at
    /// once).
    fn run_due(&mut self, now: Instant) -> Result<(), ControllerError> {
        let current = self.ctx.health.view_current();
        self.ctx.metrics.control.view_current.set(i64::from(current));
        if let Some(dns) = &self.outlets.dns {
            // `sync` published the view of everything programmed so far.
            dns.set_current(current);
        }
        for job in Job::ALL {
            let waits = (job.needs_current_view() && !current) || (job.needs_programmed() && !self.programmed);
            if waits || !self.schedule.due(job, now) {
                continue;
            }
            let ran = match job {
                Job::Reconcile => {
                    self.reconcile();
                    true
                }
                Job::Heartbeat => self.heartbeat(),
                Job::Ejections => self.read_ejections(),
                Job::Bytes => self.account(),
                Job::Tidy => {
                    if let Err(error) = self.programmer.tidy() {
                        tracing::warn!(%error, "tidying the kernel's maps failed; retrying later");
                    }
                    true
                }
                Job::Feedback => {
                    self.look_at_feedback(self.feedback.now_ms())?;
                    true
                }
            };
            if ran {
                self.schedule.done(job, now);
            }
        }
        Ok(())
    }

    /// One look of the feedback controller at `now_ms` (its clock): the Services whose shares it
    /// moved are decided again and synced at once.
    fn look_at_feedback(&mut self, now_ms: u64) -> Result<(), ControllerError> {
        let moved = self.feedback.step(now_ms, &self.programmer, &mut self.plan, &self.ctx.metrics);
        if moved.is_empty() {
            return Ok(());
        }
        self.intake.dirty.extend(moved);
        self.sync()
    }

    /// Refreshes the kernel's heartbeat (the programs fail open once the view has not been current
    /// for `--fail-open-after`) and checks the programs are attached; whether it was written.
    fn heartbeat(&mut self) -> bool {
        let written = match self.programmer.heartbeat() {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, "the kernel heartbeat could not be written; retrying");
                false
            }
        };
        self.check_attached();
        written
    }

    /// Reads the backends the kernel ejected; whether they were read.
    fn read_ejections(&mut self) -> bool {
        match self.programmer.outliers() {
            Ok(outliers) => {
                self.ejections.update(outliers, &self.plan, &mut self.ctx, &self.config.node);
                true
            }
            Err(error) => {
                tracing::warn!(%error, "the outlier ejections could not be read; retrying");
                false
            }
        }
    }

    /// Not ready while a program that should rewrite is detached (someone detached its link, its
    /// cgroup went): the maps still hold the policy, but no connection is rewritten.
    fn check_attached(&mut self) {
        let detached = self.programmer.detached();
        let reason = (!detached.is_empty()).then(|| {
            format!(
                "programs detached from the cgroup: {}; restart the agent to attach them again",
                detached.join(", ")
            )
        });
        if reason.is_some() && !self.detached {
            tracing::error!(programs = ?detached, "programs detached from the cgroup: connections are not rewritten");
        }
        self.detached = reason.is_some();
        self.ctx.health.set_detached(reason);
    }

    /// Takes one event into the cluster state and notes what it may change.
    pub fn receive(&mut self, seen: Instant, event: SourceEvent) {
        let mut to = ingest::Reporting { ctx: &mut self.ctx, node: &self.config.node, programmed: self.programmed };
        self.intake.receive(seen, event, &mut to);
    }

    /// The programmer (tests read what it was given).
    pub fn programmer(&self) -> &P {
        &self.programmer
    }

    /// Recomputes what the events changed and programs it; nothing before every kind is listed.
    pub fn sync(&mut self) -> Result<(), ControllerError> {
        if !self.intake.all_listed() {
            return Ok(());
        }
        let node = self.config.node.clone();
        let Some(this) = self.intake.state.node(&node).cloned() else {
            if !self.programmed {
                if let Some(invalid) = self.intake.skipped.get(&ObjectId::Node(node.clone())) {
                    return Err(ControllerError::InvalidOwnNode(invalid.error.clone()));
                }
                return Err(ControllerError::UnknownNode(node));
            }
            self.ctx.health.set_blocked(Some(format!(
                "node {node} is no longer in the cluster; the kernel keeps the last programmed state"
            )));
            return Ok(());
        };
        self.ctx.health.set_blocked(None);
        self.ctx.node_info(&this);
        if let Some(dns) = &mut self.outlets.dns {
            // Who this node's pods are, for `--dns-clients node`.
            let changed = dns.view_mut().set_node(&this);
            dns.touch(changed);
        }
        if self.config.one_publisher_per_service {
            self.ctx.set_rank(self.intake.state.rank(&node));
        }
        if !self.programmed || self.intake.everything_dirty {
            self.intake.dirty.clear();
            self.intake.everything_dirty = false;
            let keys: BTreeSet<ObjectKey> =
                self.intake.state.services().map(|s| s.key.clone()).chain(self.plan.services()).collect();
            let keys: Vec<ObjectKey> = keys.into_iter().collect();
            let started = Instant::now();
            let synced = self.full_sync(&this, &keys);
            let report = synced.report;
            tracing::info!(
                services = keys.len(),
                ports = self.plan.desired().services.len(),
                plan_ms = synced.deciding.as_millis() as u64,
                write_ms = synced.writing.as_millis() as u64,
                total_ms = started.elapsed().as_millis() as u64,
                "full sync"
            );
            self.finish(started, &report, None);
            crate::heap::release_freed();
        } else if !self.intake.dirty.is_empty() {
            let started = Instant::now();
            let mut changed = BTreeSet::new();
            let mut decider = self.decider();
            let decided = decider.dirty.clone();
            for key in std::mem::take(decider.dirty) {
                changed.extend(decider.recompute(&this, &key));
            }
            changed.extend(decider.drain_retries(&this));
            let report = self.programmer.apply_changes(self.plan.desired(), &changed);
            self.finish(started, &report, Some((&changed, &decided)));
        } else {
            self.intake.oldest_pending = None;
            self.intake.changes_pending.clear();
        }
        if let Some(dns) = &mut self.outlets.dns {
            dns.publish();
        }
        Ok(())
    }

    /// Re-applies the whole desired state: retries failures and heals drift.
    fn reconcile(&mut self) {
        if self.programmed {
            let started = Instant::now();
            let report = self.programmer.apply(self.plan.desired());
            self.finish(started, &report, None);
        }
    }

    /// Books an apply: health, metrics, and the problems of ports that failed or recovered.
    /// `attempted` is the set of ports the apply covered and the Services decided for it (`None`:
    /// all).
    fn finish(
        &mut self,
        started: Instant,
        report: &ApplyReport,
        attempted: Option<(&BTreeSet<ServicePort>, &BTreeSet<ObjectKey>)>,
    ) {
        self.programmed = true;
        self.ctx.health.programmed();
        if let Some(terminator) = &self.outlets.terminator {
            // Only a backend that left its Service ends its sockets: one the topology merely
            // stopped choosing, or one terminating while it still serves, keeps its connections.
            let (state, plan) = (&self.intake.state, &self.plan);
            let decided = attempted.map(|(_, decided)| decided);
            // A held departure's backend can stop serving only with a change its Service was
            // decided again for (or gone with it).
            let recheck = |d: &crate::sockets::Departure| {
                decided.is_none_or(|keys| plan.owner(&d.service).is_none_or(|owner| keys.contains(owner)))
            };
            let still_serves = |d: &crate::sockets::Departure| plan.still_serves(state, &d.service, d.backend);
            terminator.submit(&report.departed, &report.returned, recheck, still_serves);
        }
        self.ctx.metrics.control.sync_duration.observe(started.elapsed().as_secs_f64());
        if let Some(seen) = self.intake.oldest_pending.take() {
            self.ctx.metrics.control.event_to_kernel.observe(seen.elapsed().as_secs_f64());
        }
        // A change is programmed once an apply has written everything; a failed one keeps them
        // for the apply that retries it.
        if report.failed.is_empty() {
            let now = std::time::SystemTime::now();
            for at in self.intake.changes_pending.drain(..) {
                let latency = now.duration_since(at).unwrap_or_default();
                self.ctx.metrics.control.network_programming.observe(latency.as_secs_f64());
            }
        }
        if report.added + report.updated + report.removed + report.failed.len() > 0 {
            tracing::info!(
                added = report.added,
                updated = report.updated,
                removed = report.removed,
                unchanged = report.unchanged,
                failed = report.failed.len(),
                "kernel maps updated"
            );
        }
        let plan = &self.plan;
        let attempted = attempted.map(|(ports, _)| ports);
        match attempted {
            Some(ports) => {
                for port in ports {
                    self.ctx.metrics.set_baseline(*port, plan.entry(port).and(plan.baseline_in_zone(port)));
                }
            }
            None => self.ctx.metrics.replace_baselines(plan.baselines()),
        }
        self.ctx.kernel_failures(report, attempted, |port| plan.owner(port).cloned());
        for error in &report.housekeeping {
            tracing::warn!(%error, "kernel clean-up deferred to the next apply");
        }
        self.ctx.observe(&self.programmer.observe());
    }

    /// The deciding half of the controller, apart from its programmer.
    fn decider(&mut self) -> decide::Decider<'_> {
        decide::Decider {
            state: &self.intake.state,
            plan: &mut self.plan,
            dns: &mut self.outlets.dns,
            ctx: &mut self.ctx,
            dirty: &mut self.intake.dirty,
        }
    }
}

#[cfg(test)]
mod tests;
