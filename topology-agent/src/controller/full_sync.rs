//! The full sync: every Service decided and the whole plan programmed — the first programming
//! after the initial lists, and every one after a list again.
//!
//! In a large cluster deciding and writing take about as long as each other, so they run on two
//! threads: the controller decides the Services [`CHUNK`] at a time and hands each chunk's changed
//! ports, as owned entries, to a writer thread that programs them while the next chunk is decided
//! ([`AHEAD`] chunks at most wait). A port's entry changes only when a Service is decided, and
//! every such change goes to the writer in order, so once both threads are done the kernel holds
//! every planned port; [`Programmer::complete`] then removes what the kernel holds that the plan
//! does not (a previous agent's Services since deleted) and retries what a chunk could not write
//! (a port may have needed the room a stale one held). A small cluster is decided, then written
//! whole, on the controller's own thread. Either way the periodic reconcile re-applies the whole
//! plan.

use std::{
    collections::BTreeSet,
    sync::mpsc,
    time::{Duration, Instant},
};

use topology_dataplane::ApplyReport;
use topology_model::{Node, ObjectKey};
use topology_policy::{
    desired::{DesiredState, ServicePort},
    plan::NodePlan,
};

use super::{Controller, Programmer, decide::Decider};

/// Services decided per chunk handed to the writer (the writer's own batches are as large).
pub(super) const CHUNK: usize = 2048;
/// Chunks decided ahead of the writer at most: bounds the entries copied and waiting.
const AHEAD: usize = 2;
/// From this many Services on, deciding and writing overlap; below, a thread costs more than it
/// saves.
pub const PIPELINE_FROM: usize = 2 * CHUNK;

/// What a full sync did and where its time went.
pub(super) struct FullSync {
    /// What the applies did; its failures are those of the last try of each port.
    pub(super) report: ApplyReport,
    /// Time the controller spent deciding.
    pub(super) deciding: Duration,
    /// Time spent writing the maps (on the writer thread, overlapping `deciding`, then
    /// completing).
    pub(super) writing: Duration,
}

/// The changed ports of one chunk, with their entries now (a port not in `desired`: removed).
type Piece = (DesiredState, BTreeSet<ServicePort>);

impl<P: Programmer> Controller<P> {
    /// Decides every Service in `keys` (and those waiting for ports they release) and makes the
    /// kernel hold the resulting plan.
    pub(super) fn full_sync(&mut self, this: &Node, keys: &[ObjectKey]) -> FullSync {
        if keys.len() >= PIPELINE_FROM
            && crate::heap::arenas_apart()
            && let Some(pipelined) = self.pipelined(this, keys)
        {
            return pipelined;
        }
        let started = Instant::now();
        let mut decider = self.decider();
        for key in keys {
            decider.recompute(this, key);
        }
        decider.drain_retries(this);
        let deciding = started.elapsed();
        let report = self.programmer.apply(self.plan.desired());
        FullSync { report, deciding, writing: started.elapsed() - deciding }
    }

    /// The two-thread full sync; `None` when the writer thread could not be started (nothing was
    /// decided then).
    fn pipelined(&mut self, this: &Node, keys: &[ObjectKey]) -> Option<FullSync> {
        let Self { programmer, intake, plan, outlets, ctx, .. } = self;
        let mut decider = Decider { state: &intake.state, plan, dns: &mut outlets.dns, ctx, dirty: &mut intake.dirty };
        let (written, deciding) = std::thread::scope(|scope| {
            let (pieces, received) = mpsc::sync_channel::<Piece>(AHEAD);
            let writer = std::thread::Builder::new()
                .name("topology-writer".into())
                .spawn_scoped(scope, move || write(programmer, keys.len(), received));
            let writer = match writer {
                Ok(writer) => writer,
                Err(error) => {
                    tracing::warn!(%error, "no thread to write the maps on; the full sync decides, then writes");
                    return None;
                }
            };
            let mut deciding = Duration::ZERO;
            let chunks = keys.chunks(CHUNK).map(Some).chain([None]);
            for chunk in chunks {
                let started = Instant::now();
                let changed = match chunk {
                    Some(keys) => keys.iter().flat_map(|key| decider.recompute(this, key)).collect(),
                    None => decider.drain_retries(this),
                };
                if changed.is_empty() {
                    deciding += started.elapsed();
                    continue;
                }
                let piece = piece(decider.plan, changed);
                deciding += started.elapsed();
                // Fails only when the writer is gone: its panic is raised by `join`.
                if pieces.send(piece).is_err() {
                    break;
                }
            }
            drop(pieces);
            match writer.join() {
                Ok(written) => Some((written, deciding)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })?;
        let (mut chunks, writing) = written;
        let started = Instant::now();
        let failed: Vec<_> = std::mem::take(&mut chunks.failed);
        // Every stranded port failed too: the retry says again whether it still is.
        chunks.stranded.clear();
        let retry = failed.into_iter().map(|(port, _)| port).collect();
        chunks.absorb(self.programmer.complete(self.plan.desired(), &retry));
        Some(FullSync { report: chunks, deciding, writing: writing + started.elapsed() })
    }
}

/// `changed` with the plan's entries for them.
fn piece(plan: &NodePlan, changed: BTreeSet<ServicePort>) -> Piece {
    let services = changed.iter().filter_map(|port| Some((*port, plan.entry(port)?.clone()))).collect();
    (DesiredState { services }, changed)
}

/// The writer thread: prepares for about `ports` new ports (one per Service, a guess: what the
/// pieces bring is only known as they come), then programs each piece as it comes; what it did
/// and the time it spent.
fn write<P: Programmer>(programmer: &mut P, ports: usize, pieces: mpsc::Receiver<Piece>) -> (ApplyReport, Duration) {
    let started = Instant::now();
    if !crate::heap::own_arena() {
        tracing::debug!("the writer thread allocates from the controller's arena");
    }
    programmer.reserve(ports);
    let mut report = ApplyReport::default();
    let mut writing = started.elapsed();
    for (desired, changed) in pieces {
        let started = Instant::now();
        report.absorb(programmer.apply_changes(&desired, &changed));
        writing += started.elapsed();
    }
    (report, writing)
}
