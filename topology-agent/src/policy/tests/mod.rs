//! Policy tests: tables per mode, joins, and properties.

mod join;
mod props;
mod spillover;
mod tables;
mod world;
