//! Policy tests: tables per mode, joins, and properties.

mod baseline;
mod feedback;
mod join;
mod kube_proxy;
mod outlier;
mod props;
mod scope;
mod spillover;
mod tables;
mod terminating;
pub(crate) use crate::testing as world;
