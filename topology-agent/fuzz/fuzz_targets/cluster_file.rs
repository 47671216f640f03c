//! Fuzz target `cluster_file`: see `topology_agent::fuzzing::cluster_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topology_agent::fuzzing::cluster_file(data));
