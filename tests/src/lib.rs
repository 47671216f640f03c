//! Test support: sandboxes that always clean up, an isolated network of namespaces, and the
//! traffic probe (backends that answer with their name, clients that record where they landed).

pub mod accounting;
pub mod agent;
pub mod bulk;
pub mod caps;
pub mod datagrams;
pub mod demo;
pub mod dns;
pub mod dnsperf;
pub mod fixture;
pub mod kernel;
pub mod kind;
pub mod kubernetes;
pub mod net;
pub mod netns;
pub mod openloop;
pub mod sandbox;
pub mod scale;
pub mod server;
pub mod soak;
pub mod traffic;
pub mod unbound;
