//! Fuzz target `stream`: see `flint_net::wire::fuzzing::stream`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_net::wire::fuzzing::stream(data));
