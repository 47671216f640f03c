//! Fuzz target `apply`: see `topology_agent::fuzzing::apply`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topology_agent::fuzzing::apply(data));
