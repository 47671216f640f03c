//! Fuzz target `annotations`: see `topology_agent::fuzzing::annotations`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topology_agent::fuzzing::annotations(data));
