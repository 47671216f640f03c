//! Which backends that left a port's set on this node left the Service itself.
//!
//! A set changes for two reasons: an endpoint stopped serving or went away, or the topology chose
//! other endpoints (a closer one became ready, a hint moved, feedback moved the weights, a
//! serving endpoint began terminating while others are ready). Only the first ends the
//! connections already made to it: ending those of the second resets clients talking to healthy
//! backends (cilium#48259) and cuts terminating pods before their grace period (cilium#48348).
//! kube-proxy acts the same way, flushing conntrack only for endpoints that are gone.

use std::net::SocketAddr;

use topology_model::{ClusterState, Family};

use super::NodePlan;
use crate::{desired::ServicePort, policy::join};

impl NodePlan {
    /// Whether `backend` still serves the Service port `port` (an endpoint of its Service at that
    /// port's target, ready or serving while terminating): connections to it go on even when this
    /// node's set no longer draws it.
    pub fn still_serves(&self, state: &ClusterState, port: &ServicePort, backend: SocketAddr) -> bool {
        let Some(service) = self.owner(port).and_then(|key| state.service(key)) else { return false };
        if !service.cluster_ips.contains(&port.vip) {
            return false;
        }
        let family = Family::of(&port.vip);
        service.ports.iter().filter(|spec| spec.port == port.port && spec.protocol == port.protocol).any(|spec| {
            join::candidates(state, service, spec, family).candidates.iter().any(|candidate| {
                (candidate.address, candidate.port) == (backend.ip(), backend.port())
                    && (candidate.is_ready() || candidate.serving)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use topology_model::{ClusterState, Endpoint, Protocol};

    use crate::{plan::NodePlan, testing::*};

    fn state(endpoints: Vec<Endpoint>) -> ClusterState {
        with(service("web").distribution("PreferClose"), endpoints)
    }

    #[test]
    fn only_a_backend_that_left_the_service_is_gone() {
        let vip = service("web").cluster_ips[0];
        let port = crate::desired::ServicePort { vip, port: 80, protocol: Protocol::Tcp };
        let far: std::net::SocketAddr = "10.0.2.1:8080".parse().unwrap();
        let serves = |endpoints: Vec<Endpoint>| {
            let state = state(endpoints);
            let plan = NodePlan::build(&state, "a1", None).unwrap();
            let drawn = plan.entry(&port).unwrap().backends.iter().any(|b| b.addr == far.ip() && b.weight > 0);
            assert!(!drawn, "a1's set does not draw the far backend");
            plan.still_serves(&state, &port, far)
        };
        // A closer endpoint is ready: the far one leaves a1's set, not the Service.
        assert!(serves(vec![ep("10.0.1.1", "a1"), ep("10.0.2.1", "b1")]));
        // Terminating but serving: its connections go on until it stops.
        assert!(serves(vec![ep("10.0.1.1", "a1"), ep("10.0.2.1", "b1").terminating()]));
        // Not serving, or gone from the slices: it left.
        assert!(!serves(vec![ep("10.0.1.1", "a1"), ep("10.0.2.1", "b1").unready()]));
        assert!(!serves(vec![ep("10.0.1.1", "a1")]));
        // Another port or ClusterIP of no Service: nothing serves there.
        let state = state(vec![ep("10.0.2.1", "b1")]);
        let plan = NodePlan::build(&state, "a1", None).unwrap();
        assert!(!plan.still_serves(&state, &crate::desired::ServicePort { port: 81, ..port }, far));
        assert!(!plan.still_serves(&state, &port, "10.0.2.1:9090".parse().unwrap()));
    }
}
