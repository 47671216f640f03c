//! Policy tests: tables per mode, joins, and properties.

mod join;
mod props;
mod tables;
mod world;
