//! The backends this node's kernel ejected (passive outlier ejection), as the loop sees them:
//! read every [`INTERVAL`] (the read also forgets backends quiet for a failing window), each new
//! ejection published as an Event on every Service whose set on this node holds the backend, and
//! the reading kept, so `/debug/plan` names ejected backends beside the plan's.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use topology_common::{OutlierEntry, outlier::Tuning};

use super::context::{Context, Topic};
use crate::{cluster::ObjectKey, dataplane::Outlier, explain::ExplainReport, plan::NodePlan};

/// How often the loop reads the ejections: an ejection lasts 10 s at the least.
pub(super) const INTERVAL: Duration = Duration::from_secs(2);

/// The last reading, and the Services told of each ejection.
#[derive(Default)]
pub(super) struct Ejections {
    read_at: Option<Instant>,
    /// Ejected backends, as last read.
    ejected: BTreeMap<SocketAddr, Outlier>,
    /// The Services each ejected backend's Event went to.
    told: BTreeMap<SocketAddr, BTreeSet<ObjectKey>>,
}

impl Ejections {
    /// Whether a reading is due.
    pub(super) fn due(&self) -> bool {
        self.read_at.is_none_or(|at| at.elapsed() >= INTERVAL)
    }

    /// Takes a reading: an ejection not seen before (or a later one of the same backend) becomes
    /// a problem of each Service whose set holds the backend; an ejection that ended clears it.
    pub(super) fn update(&mut self, outliers: Vec<Outlier>, plan: &NodePlan, ctx: &mut Context, node: &str) {
        self.read_at = Some(Instant::now());
        self.ejected = outliers.into_iter().filter(Outlier::ejected).map(|o| (o.backend, o)).collect();
        for (backend, services) in std::mem::take(&mut self.told) {
            if self.ejected.contains_key(&backend) {
                self.told.insert(backend, services);
                continue;
            }
            for service in services {
                ctx.resolved(&service, &Topic::Ejection(backend));
            }
        }
        if self.ejected.is_empty() {
            return;
        }
        // Per ejected backend: the Services holding it, and the settings of the first port found.
        let mut owners: BTreeMap<SocketAddr, (BTreeSet<ObjectKey>, Tuning)> = BTreeMap::new();
        for (port, service) in &plan.desired().services {
            for backend in &service.backends {
                let addr = SocketAddr::new(backend.addr, backend.port);
                if self.ejected.contains_key(&addr)
                    && let Some(owner) = plan.owner(port)
                {
                    let tuning = Tuning::of(service.options.to_kernel().flags);
                    owners.entry(addr).or_insert_with(|| (BTreeSet::new(), tuning)).0.insert(owner.clone());
                }
            }
        }
        for (backend, (services, tuning)) in owners {
            let ejection = self.ejected[&backend].ejections;
            let seconds = OutlierEntry::ejection_ns_from(tuning.base_ns, ejection) / 1_000_000_000;
            let message = format!(
                "node {node} avoids backend {backend} for {seconds} s: its TCP handshakes from this node failed \
                 {} times in a row (ejection {ejection}; other nodes judge for themselves)",
                tuning.failures
            );
            for service in &services {
                ctx.problem(service, Topic::Ejection(backend), "BackendEjected", message.clone());
            }
            self.told.entry(backend).or_default().extend(services);
        }
    }

    /// Marks the backends of `report` this node avoids now, as last read.
    pub(super) fn mark(&self, report: &mut ExplainReport) {
        if self.ejected.is_empty() {
            return;
        }
        for entry in &mut report.services {
            for backend in &mut entry.backends {
                let addr = backend.address.parse().ok().map(|ip| SocketAddr::new(ip, backend.port));
                if let Some(outlier) = addr.and_then(|addr| self.ejected.get(&addr)) {
                    backend.ejected = Some(crate::explain::Ejected {
                        for_seconds: outlier.ejected_for.as_secs_f64(),
                        ejection: outlier.ejections,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use topology_policy::testing::{endpoints, service, with};

    use super::*;
    use crate::events::{Problem, ProblemSink};

    #[derive(Default)]
    struct Sink(Mutex<Vec<Problem>>);
    impl ProblemSink for Arc<Sink> {
        fn publish(&self, problem: &Problem) {
            self.0.lock().unwrap().push(problem.clone());
        }
    }

    fn outlier(addr: &str, ejections: u32, ejected_s: u64) -> Outlier {
        Outlier { backend: addr.parse().unwrap(), failures: 0, ejections, ejected_for: Duration::from_secs(ejected_s) }
    }

    #[test]
    fn each_ejection_is_one_event_on_the_services_holding_the_backend_and_explain_names_it() {
        let state = with(service("web"), endpoints(false));
        let plan = NodePlan::build(&state, "a1", None).unwrap();
        let sink = Arc::new(Sink::default());
        let mut ctx = Context::new(Arc::default(), Arc::default(), Box::new(Arc::clone(&sink)));
        let mut ejections = Ejections::default();
        let events = || sink.0.lock().unwrap().iter().map(|p| (p.service.to_string(), p.reason)).collect::<Vec<_>>();

        // Failing but not ejected, or not in any set here: nothing to say.
        ejections.update(vec![outlier("10.0.2.1:8080", 0, 0), outlier("10.9.9.9:8080", 1, 9)], &plan, &mut ctx, "a1");
        assert!(events().is_empty());
        // Ejected: one Event on the Service, however often it is read while it lasts.
        for _ in 0..3 {
            ejections.update(vec![outlier("10.0.2.1:8080", 1, 9)], &plan, &mut ctx, "a1");
        }
        assert_eq!(events(), [("ns/web".to_owned(), "BackendEjected")]);
        let message = sink.0.lock().unwrap()[0].message.clone();
        assert!(message.contains("node a1 avoids backend 10.0.2.1:8080 for 10 s") && message.contains("ejection 1"));
        let mut report = crate::explain::report(&state, state.node("a1").unwrap(), &plan, None);
        ejections.mark(&mut report);
        let marked: Vec<_> = report.services[0]
            .backends
            .iter()
            .filter_map(|b| b.ejected.as_ref().map(|e| (&*b.address, e.ejection)))
            .collect();
        assert_eq!(marked, [("10.0.2.1", 1)]);
        // Over, then ejected again: a second Event, for 20 s.
        ejections.update(vec![outlier("10.0.2.1:8080", 1, 0)], &plan, &mut ctx, "a1");
        ejections.update(vec![outlier("10.0.2.1:8080", 2, 19)], &plan, &mut ctx, "a1");
        assert_eq!(events().len(), 2);
        assert!(sink.0.lock().unwrap()[1].message.contains("for 20 s"));
    }
}
