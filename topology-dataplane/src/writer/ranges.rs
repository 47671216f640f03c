//! Keeping the service ranges ([`topology_common::ServiceRanges`]) ahead of the service ports:
//! widened before a port outside them is written, narrowed once ports are gone.

use topology_policy::desired::{DesiredService, ServicePort};

use super::{ApplyReport, MapOps, Writer};
use crate::{
    error::DataplaneError,
    ranges::{Bounds, covers},
};

/// The ranges as the writer keeps them: the bounds of every port held or being written, and what
/// the map holds (`None`: not written by this writer yet).
#[derive(Debug, Default)]
pub struct Ranges {
    bounds: Bounds,
    written: Option<topology_common::ServiceRanges>,
}

impl Ranges {
    /// The ranges of the ports `held`, not yet written.
    pub fn adopt(held: impl IntoIterator<Item = std::net::IpAddr>) -> Self {
        Self { bounds: Bounds::of(held), written: None }
    }
}

impl<M: MapOps> Writer<M> {
    /// Widens the ranges to the ports `changes` write, before any is written. When the map refuses,
    /// a port the ranges the programs hold do not cover is taken out of `changes` and reported
    /// failed: written, it would be passed by the programs as no service.
    pub(super) fn widen_ranges(
        &mut self,
        changes: &mut Vec<(ServicePort, Option<&DesiredService>)>,
        report: &mut ApplyReport,
    ) {
        self.ranges.bounds.extend(changes.iter().filter(|(_, s)| s.is_some()).map(|(port, _)| port.vip));
        let Err(error) = self.publish_ranges() else { return };
        let covered = Bounds::of(self.kernel.services.keys().map(|port| port.vip)).to_kernel();
        let reason = format!("the service ranges could not be widened to it: {error}");
        changes.retain(|(port, service)| {
            let outside = service.is_some() && !self.kernel.services.contains_key(port) && !covers(&covered, port.vip);
            if outside {
                report.failed.push((*port, DataplaneError::InvalidService { service: *port, reason: reason.clone() }));
            }
            !outside
        });
    }

    /// Narrows the ranges to the ports held, after some were removed.
    pub(super) fn narrow_ranges(&mut self, report: &mut ApplyReport) {
        self.ranges.bounds = Bounds::of(self.kernel.services.keys().map(|port| port.vip));
        if let Err(error) = self.publish_ranges() {
            // Wider than needed: a destination outside the ports is looked up, never missed.
            report.housekeeping.push(error);
        }
    }

    /// Writes the ranges of the bounds, if the map does not hold them already.
    fn publish_ranges(&mut self) -> Result<(), DataplaneError> {
        let wanted = self.ranges.bounds.to_kernel();
        if self.ranges.written != Some(wanted) {
            self.maps.put_ranges(wanted)?;
            self.ranges.written = Some(wanted);
        }
        Ok(())
    }
}
