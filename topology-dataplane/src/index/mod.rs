//! The service index (`topology_common::index`): where each service port sits in the
//! open-addressing table the programs probe, and the rewrite of a position.
//!
//! [`Placement`] is the pure part: it decides positions and keeps the invariant the programs rely
//! on. [`ServiceIndex`] publishes what it decides through the index's shared mapping, one
//! position at a time, in an order that keeps the invariant true in the kernel after every single
//! store. The hash maps stay the authority: a position that could not be published (a grace
//! period was due and refused) keeps whole, earlier contents under an odd `seq`, as a killed
//! agent's half-done rewrite does; the programs treat an odd `seq` as "not sure" and answer from
//! the hash map.

#[cfg(test)]
mod grace_tests;
mod placement;
mod publish;
#[cfg(test)]
mod tests;

#[cfg(any(test, feature = "fuzzing"))]
pub use placement::Placement;
pub use placement::positions_for;
pub use publish::{ServiceIndex, Staged, verify};
