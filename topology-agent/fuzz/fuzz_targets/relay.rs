//! Fuzz target `relay`: see `topology_agent::fuzzing::relay`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topology_agent::fuzzing::relay(data));
