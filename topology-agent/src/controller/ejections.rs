//! The backends this node's kernel ejected (passive outlier ejection), as the loop sees them:
//! read every [`INTERVAL`] (the read also forgets backends quiet for a failing window), each new
//! ejection published as an Event on the Service whose port's set it was ejected from — with that
//! port's settings, at most one Event per Service every [`EVENT_EVERY`] (the ones held back are
//! counted in the next) — and the reading kept, so `/debug/plan` names ejected backends beside
//! the plan's.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

use topology_common::{OutlierEntry, outlier::EjectionSettings};
use topology_dataplane::Outlier;
use topology_model::ObjectKey;
use topology_policy::{desired::ServicePort, explain::ExplainReport, plan::NodePlan};

use super::context::{Context, Topic};

/// The least time between two ejection Events of one Service from this node: a Service with many
/// failing backends, or one flapping, says so once a minute, not once per ejection.
pub(super) const EVENT_EVERY: Duration = Duration::from_secs(60);

/// A backend as one port's ejections name it.
type Ejected = (ServicePort, SocketAddr);

/// The last reading, and the Services told of each ejection.
#[derive(Default)]
pub(super) struct Ejections {
    /// Ejected backends per port, as last read.
    ejected: BTreeMap<Ejected, Outlier>,
    /// The Service told (or held back from telling) of each ejection in force, and its number.
    told: BTreeMap<Ejected, (ObjectKey, u32)>,
    /// When each Service was last told of an ejection, and the ejections held back since.
    events: BTreeMap<ObjectKey, (Instant, u32)>,
}

impl Ejections {
    /// Takes a reading: an ejection not seen before (or a later one of the same backend) becomes
    /// a problem of the Service owning the port; an ejection that ended clears it.
    pub(super) fn update(&mut self, outliers: Vec<Outlier>, plan: &NodePlan, ctx: &mut Context, node: &str) {
        self.update_at(outliers, plan, ctx, node, Instant::now());
    }

    /// [`update`](Self::update) at `now`.
    fn update_at(&mut self, outliers: Vec<Outlier>, plan: &NodePlan, ctx: &mut Context, node: &str, now: Instant) {
        self.ejected = outliers.into_iter().filter(Outlier::ejected).map(|o| ((o.service, o.backend), o)).collect();
        for (key, (service, number)) in std::mem::take(&mut self.told) {
            if self.ejected.contains_key(&key) {
                self.told.insert(key, (service, number));
            } else {
                ctx.resolved(&service, &Topic::Ejection(key.0, key.1));
            }
        }
        for (key, outlier) in &self.ejected {
            if self.told.get(key).is_some_and(|(_, number)| *number == outlier.ejections) {
                continue;
            }
            let (Some(owner), Some(service)) = (plan.owner(&key.0), plan.desired().services.get(&key.0)) else {
                continue;
            };
            self.told.insert(*key, (owner.clone(), outlier.ejections));
            let (last, held) = self.events.entry(owner.clone()).or_insert((now - EVENT_EVERY, 0));
            if now.duration_since(*last) < EVENT_EVERY {
                *held += 1;
                continue;
            }
            let tuning = EjectionSettings::of(service.options.to_kernel().flags);
            let message = message(node, key, outlier, tuning, *held);
            (*last, *held) = (now, 0);
            ctx.problem(owner, Topic::Ejection(key.0, key.1), "BackendEjected", message);
        }
        self.events.retain(|_, (last, held)| *held > 0 || now.duration_since(*last) < EVENT_EVERY);
    }

    /// Marks the backends of `report` this node avoids now, as last read, on the ports they were
    /// ejected from.
    pub(super) fn mark(&self, report: &mut ExplainReport) {
        if self.ejected.is_empty() {
            return;
        }
        for entry in &mut report.services {
            for ((port, backend), outlier) in &self.ejected {
                if port.port != entry.port
                    || port.protocol != entry.protocol
                    || !entry.cluster_ips.iter().any(|ip| ip.parse() == Ok(port.vip))
                {
                    continue;
                }
                for shown in &mut entry.backends {
                    if shown.port == backend.port() && shown.address.parse() == Ok(backend.ip()) {
                        shown.ejected = Some(topology_policy::explain::Ejected {
                            for_seconds: outlier.ejected_for.as_secs_f64(),
                            ejection: outlier.ejections,
                        });
                    }
                }
            }
        }
    }
}

/// The Event's text for `outlier`, ejected from port `key.0` under `tuning`, with `held` others
/// of the Service held back since its last Event.
fn message(node: &str, key: &Ejected, outlier: &Outlier, tuning: EjectionSettings, held: u32) -> String {
    let (port, backend) = key;
    let ejection = outlier.ejections;
    let seconds = OutlierEntry::ejection_ns_from(tuning.base_ns, ejection) / 1_000_000_000;
    let mut message = format!(
        "node {node} avoids backend {backend} for port {port} for {seconds} s: its TCP handshakes from this node's \
         pods failed {} times in a row, from two pods or more (ejection {ejection}; settings failures={},base={}s; \
         other nodes judge for themselves)",
        tuning.failures,
        tuning.failures,
        tuning.base_ns / 1_000_000_000
    );
    if held > 0 {
        message.push_str(&format!("; {held} more ejections of this Service here since its last Event"));
    }
    message
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use topology_kube::events::{Problem, ProblemSink};
    use topology_policy::testing::{endpoints, service, with};

    use super::*;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<Problem>>>);
    impl ProblemSink for Sink {
        fn publish(&self, problem: &Problem) {
            self.0.lock().unwrap().push(problem.clone());
        }
    }

    fn outlier(port: ServicePort, addr: &str, ejections: u32, ejected_s: u64) -> Outlier {
        Outlier {
            service: port,
            backend: addr.parse().unwrap(),
            failures: 0,
            ejections,
            ejected_for: Duration::from_secs(ejected_s),
        }
    }

    #[test]
    fn each_ejection_is_one_event_on_the_ports_service_and_explain_marks_that_port() {
        let state = with(service("web"), endpoints(false));
        let plan = NodePlan::build(&state, "a1", None).unwrap();
        let web = *plan.desired().services.keys().next().unwrap();
        let elsewhere = ServicePort { port: web.port + 1, ..web };
        let sink = Sink::default();
        let mut ctx = Context::new(Arc::default(), Arc::default(), Box::new(sink.clone()));
        let mut ejections = Ejections::default();
        let events = || sink.0.lock().unwrap().iter().map(|p| (p.service.to_string(), p.reason)).collect::<Vec<_>>();
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);

        // Failing but not ejected, or ejected from a port this node does not program: nothing.
        let quiet = vec![outlier(web, "10.0.2.1:8080", 0, 0), outlier(elsewhere, "10.0.2.1:8080", 1, 9)];
        ejections.update_at(quiet, &plan, &mut ctx, "a1", at(0));
        assert!(events().is_empty());
        // Ejected: one Event on the Service, however often it is read while it lasts.
        for s in 0..3 {
            ejections.update_at(vec![outlier(web, "10.0.2.1:8080", 1, 9)], &plan, &mut ctx, "a1", at(s));
        }
        assert_eq!(events(), [("ns/web".to_owned(), "BackendEjected")]);
        let message = sink.0.lock().unwrap()[0].message.clone();
        assert!(
            message.contains(&format!("node a1 avoids backend 10.0.2.1:8080 for port {web} for 10 s"))
                && message.contains("ejection 1")
                && message.contains("settings failures=5,base=10s"),
            "{message}"
        );
        let mut report = topology_policy::explain::report(&state, state.node("a1").unwrap(), &plan, None);
        ejections.mark(&mut report);
        let marked: Vec<_> = report.services[0]
            .backends
            .iter()
            .filter_map(|b| b.ejected.as_ref().map(|e| (&*b.address, e.ejection)))
            .collect();
        assert_eq!(marked, [("10.0.2.1", 1)]);
        // Over, then ejected again within the minute: held back; the next, a minute after the
        // first Event, says so.
        ejections.update_at(vec![outlier(web, "10.0.2.1:8080", 1, 0)], &plan, &mut ctx, "a1", at(12));
        ejections.update_at(vec![outlier(web, "10.0.2.1:8080", 2, 19)], &plan, &mut ctx, "a1", at(13));
        assert_eq!(events().len(), 1);
        ejections.update_at(vec![outlier(web, "10.0.2.1:8080", 2, 0)], &plan, &mut ctx, "a1", at(40));
        ejections.update_at(vec![outlier(web, "10.0.2.1:8080", 3, 39)], &plan, &mut ctx, "a1", at(61));
        assert_eq!(events().len(), 2);
        let message = sink.0.lock().unwrap()[1].message.clone();
        assert!(message.contains("for 40 s") && message.contains("1 more ejections"), "{message}");
    }
}
