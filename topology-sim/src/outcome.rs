//! What a routing does to one input, in the simulator's terms: the traffic from each zone is
//! proportional to its nodes; an endpoint's fair share is `1 / endpoints`; its deviation is its
//! load over the fair share, minus one. Endpoints are kept in groups that receive the same load.

/// A group of endpoints of one zone that receive the same load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Group {
    /// Zone of the endpoints.
    pub zone: usize,
    /// Number of endpoints.
    pub endpoints: u32,
    /// Share of all traffic the group receives.
    pub load: f64,
}

/// Where one input's traffic went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Endpoint groups.
    pub groups: Vec<Group>,
    /// Share of all traffic that stayed in its zone.
    pub in_zone: f64,
    /// The algorithm gave up its topology mode and routed cluster-wide.
    pub fell_back: bool,
}

impl Outcome {
    /// A new group of `endpoints` endpoints of `zone`, receiving nothing yet; its index.
    pub fn group(&mut self, zone: usize, endpoints: u32) -> usize {
        self.groups.push(Group { zone, endpoints, load: 0.0 });
        self.groups.len() - 1
    }

    /// One group per zone with endpoints (`None` for a zone without).
    pub fn zone_groups(&mut self, endpoints: &[u32]) -> Vec<Option<usize>> {
        endpoints.iter().enumerate().map(|(zone, &count)| (count > 0).then(|| self.group(zone, count))).collect()
    }

    /// Sends `amount` (a share of all traffic) from zone `from` to group `group`.
    pub fn send(&mut self, from: usize, group: usize, amount: f64) {
        if from == self.groups[group].zone {
            self.in_zone += amount;
        }
        self.groups[group].load += amount;
    }

    /// Sends `amount` from zone `from` over the `groups` in proportion to their endpoints.
    pub fn spread(&mut self, from: usize, groups: &[usize], amount: f64) {
        let total: u32 = groups.iter().map(|&g| self.groups[g].endpoints).sum();
        for &g in groups {
            let share = f64::from(self.groups[g].endpoints) / f64::from(total);
            self.send(from, g, amount * share);
        }
    }

    /// The simulator's metrics of this outcome over `total_endpoints`.
    pub fn metrics(&self, total_endpoints: u32) -> Metrics {
        let total = f64::from(total_endpoints);
        let fair = 1.0 / total;
        let mut metrics = Metrics { in_zone: self.in_zone, ..Metrics::default() };
        let mut landed = 0.0;
        // Endpoints of one zone in several groups are distinct endpoints; loads add per group.
        for group in &self.groups {
            landed += group.load;
            let deviation = group.load / f64::from(group.endpoints) / fair - 1.0;
            metrics.max_overload = metrics.max_overload.max(deviation);
            metrics.max_deviation = metrics.max_deviation.max(deviation.abs());
            metrics.mean_deviation += deviation.abs() * f64::from(group.endpoints) / total;
        }
        // Endpoints no traffic reaches sit at -100 %.
        let reached: u32 = self.groups.iter().map(|g| g.endpoints).sum();
        if reached < total_endpoints {
            metrics.max_deviation = metrics.max_deviation.max(1.0);
            metrics.mean_deviation += f64::from(total_endpoints - reached) / total;
        }
        metrics.lost = (1.0 - landed).max(0.0);
        metrics
    }
}

/// The metrics of one input.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Share of traffic that stays in its zone.
    pub in_zone: f64,
    /// Largest positive deviation of an endpoint's load from its fair share (0 if none is above).
    pub max_overload: f64,
    /// Largest absolute deviation (the simulator's "max deviation").
    pub max_deviation: f64,
    /// Mean absolute deviation over the endpoints.
    pub mean_deviation: f64,
    /// Traffic that reached no endpoint.
    pub lost: f64,
}
