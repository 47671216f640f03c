//! Fuzz target `mountinfo`: see `topology_agent::fuzzing::mountinfo`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topology_agent::fuzzing::mountinfo(data));
