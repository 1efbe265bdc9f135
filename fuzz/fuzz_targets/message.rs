//! Fuzz target `message`: see `flint_net::wire::fuzzing::message`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_net::wire::fuzzing::message(data));
