//! Fuzz target `dns_packet`: see `topology_agent::fuzzing::dns_packet`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| topology_agent::fuzzing::dns_packet(data));
