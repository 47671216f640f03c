//! `topology-agent simulate`: the routing algorithms side by side over the KubeCon input space,
//! measured as the k8s-topology-simulator measured them.

pub mod algorithms;
pub mod outcome;
pub mod report;
pub mod run;
pub mod space;
