//! Fuzz target `sock_diag`: see `topology_agent::fuzzing::sock_diag`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topology_agent::fuzzing::sock_diag(data));
