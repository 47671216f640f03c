//! topology-sim: the routing algorithms side by side over the input space of the KubeCon 2020
//! talk, measured as the k8s-topology-simulator measured them. Spillover runs through the agent's
//! own solver (`topology_policy::policy::spillover::solve`), so the figures are the agent's.

pub mod algorithms;
pub mod chart;
pub mod dynamic;
pub mod outcome;
pub mod report;
pub mod run;
pub mod space;
