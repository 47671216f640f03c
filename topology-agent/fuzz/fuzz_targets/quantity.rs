//! Fuzz target `quantity`: see `topology_agent::fuzzing::quantity`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topology_agent::fuzzing::quantity(data));
