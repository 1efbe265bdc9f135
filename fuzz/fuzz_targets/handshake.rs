//! Fuzz target `handshake`: see `flint_net::wire::fuzzing::handshake`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_net::wire::fuzzing::handshake(data));
