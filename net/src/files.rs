//! Reading the small files an operator names (the shared secret, a pool file) or a child may
//! have replaced (an executor's `pid` file): regular files only, opened without blocking (a FIFO
//! would hang the open until a writer came), and never more than a cap (`/dev/zero` or a huge
//! file would take all memory).

use std::fs::{File, Metadata, OpenOptions};
use std::io::{Error, ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The bytes of the regular file at `path` (at most `max` of them) and its metadata; an
/// `InvalidInput` error says what else it is or how large.
pub fn read_small(path: &Path, max: u64) -> std::io::Result<(Vec<u8>, Metadata)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        let what = kind(&meta);
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("not a regular file ({what})"),
        ));
    }
    if meta.len() > max {
        return Err(too_large(meta.len(), max));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    read_at_most(file, max, &mut bytes)?;
    Ok((bytes, meta))
}

/// Reads `file` to its end into `bytes`, failing past `max` bytes (a file that grew).
fn read_at_most(file: File, max: u64, bytes: &mut Vec<u8>) -> std::io::Result<()> {
    let got = file.take(max.saturating_add(1)).read_to_end(bytes)?;
    if got as u64 > max {
        return Err(too_large(got as u64, max));
    }
    Ok(())
}

fn too_large(len: u64, max: u64) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("{len} bytes or more, at most {max}"),
    )
}

/// What a file that is not a regular one is.
fn kind(meta: &Metadata) -> &'static str {
    let kind = meta.file_type();
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_up_to_the_cap_are_read() {
        let dir = std::env::temp_dir().join(format!("flint-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let small = dir.join("small");
        std::fs::write(&small, b"hello").expect("write");
        assert_eq!(read_small(&small, 5).expect("reads").0, b"hello");
        let refused = |path: &Path, max| {
            let error = read_small(path, max).expect_err("refused");
            assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
            error.to_string()
        };
        assert!(refused(&small, 4).contains("at most 4"));
        assert!(refused(&dir, 100).contains("a directory"));
        assert!(refused(Path::new("/dev/zero"), 100).contains("a character device"));
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            assert!(refused(&fifo, 100).contains("a FIFO"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
