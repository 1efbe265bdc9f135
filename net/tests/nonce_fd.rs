//! The handshake's nonces need no file descriptor: a process at its open-file limit (thousands
//! of connections) still completes handshakes instead of logging "no random nonce: Too many
//! open files" for each. A test binary of its own, since it exhausts the process's descriptors.

use flint_net::handshake::random_nonce;

#[test]
fn nonces_come_even_when_no_file_descriptor_is_left() {
    // The first nonce may seed the generator from the operating system.
    let seed = random_nonce().expect("a first nonce");
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(file) => held.push(file),
            Err(error) => {
                assert_eq!(error.raw_os_error(), Some(24), "EMFILE expected: {error}");
                break;
            }
        }
        assert!(held.len() < 1_000_000, "no open-file limit");
    }
    let nonces: Vec<[u8; 32]> = (0..100)
        .map(|_| random_nonce().expect("a nonce with no descriptor left"))
        .collect();
    drop(held);
    assert!(nonces.iter().all(|n| *n != seed));
    let distinct: std::collections::HashSet<_> = nonces.iter().collect();
    assert_eq!(distinct.len(), nonces.len());
}
