//! Fuzz target `adopt`: see `topology_agent::fuzzing::adopt`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topology_agent::fuzzing::adopt(data));
