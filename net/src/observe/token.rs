//! Who may read what a process shows over HTTP: an [`ObserveToken`] of its own (never the
//! cluster's secret, which lets a peer run code; this only lets it read), or [`Access::Open`]
//! on loopback addresses.
//!
//! A client shows the token as `Authorization: Bearer TOKEN` (Prometheus, scripts, `curl`) or,
//! in a browser, through a cookie the login form sets (`POST /login`): the cookie holds an HMAC
//! of the token, not the token, is `HttpOnly` and `SameSite=Strict`, and the token never goes
//! into a URL. Comparisons take the same time wherever the bytes differ.
//!
//! Token files: a regular file of at most [`TOKEN_FILE_BYTES_MAX`] bytes (anything else, a FIFO
//! or `/dev/zero`, is refused before it is read), holding 16 to 1024 visible ASCII characters
//! (surrounding whitespace dropped); [`ObserveToken::load_or_create`] writes a fresh random one
//! (mode 0600) where none exists.

use std::io::Write;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::handshake::{random_nonce, Secret};

/// The most bytes a token file may hold.
pub const TOKEN_FILE_BYTES_MAX: u64 = 4096;
/// The fewest characters a token may have.
pub const TOKEN_CHARS_MIN: usize = 16;
/// The most characters a token may have.
pub const TOKEN_CHARS_MAX: usize = 1024;
/// The login cookie's name, followed by `_PORT` (cookies are per host, not per port, so each
/// server on a host keeps its own).
pub const COOKIE_NAME: &str = "flint_observe";

/// Why a token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Too short, too long, or a character that is not visible ASCII.
    #[error(
        "an observe token must be {TOKEN_CHARS_MIN} to {TOKEN_CHARS_MAX} visible ASCII characters"
    )]
    Malformed,
    /// Not a regular file, or larger than [`TOKEN_FILE_BYTES_MAX`].
    #[error("observe token file {}: {why}", path.display())]
    NotAFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// Reading, creating or writing the file failed.
    #[error("observe token file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The token is the cluster's shared secret.
    #[error("the observe token must not be the cluster's shared secret: make a token of its own")]
    IsTheSecret,
}

/// A read-only token for the metrics, the pages and the JSON API.
#[derive(Clone)]
pub struct ObserveToken {
    token: Vec<u8>,
    /// The login cookie's value: hex HMAC-SHA256 of a label under the token.
    cookie: String,
}

impl std::fmt::Debug for ObserveToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObserveToken(..)")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ObserveToken {
    /// A token from its text (surrounding whitespace dropped).
    pub fn new(text: &[u8]) -> Result<ObserveToken, TokenError> {
        let token = text.trim_ascii();
        let visible = token.iter().all(|b| (0x21..=0x7e).contains(b));
        if !visible || !(TOKEN_CHARS_MIN..=TOKEN_CHARS_MAX).contains(&token.len()) {
            return Err(TokenError::Malformed);
        }
        // HMAC takes keys of any length; `new_from_slice` fails for none.
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(token).unwrap_or_else(|_| unreachable!());
        mac.update(b"flint-observe-cookie-v1");
        let cookie = hex(&mac.finalize().into_bytes());
        Ok(ObserveToken {
            token: token.to_vec(),
            cookie,
        })
    }

    /// A fresh random token: 64 hex digits.
    pub fn generate() -> std::io::Result<ObserveToken> {
        let text = hex(&random_nonce()?);
        ObserveToken::new(text.as_bytes()).map_err(std::io::Error::other)
    }

    /// Reads a token file (see the module docs for what is refused), warning when other
    /// users may read it.
    pub fn from_file(path: &Path) -> Result<ObserveToken, TokenError> {
        use std::os::unix::fs::PermissionsExt;
        let (text, meta) =
            crate::files::read_small(path, TOKEN_FILE_BYTES_MAX).map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidInput => TokenError::NotAFile {
                    path: path.to_owned(),
                    why: e.to_string(),
                },
                _ => TokenError::Io {
                    path: path.to_owned(),
                    source: e,
                },
            })?;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                "observe token file {} may be read by other users; chmod 600 it",
                path.display()
            );
        }
        ObserveToken::new(&text)
    }

    /// Reads `path`, or writes a fresh token there (mode 0600, a new file only) if it does not
    /// exist; says whether it was created.
    pub fn load_or_create(path: &Path) -> Result<(ObserveToken, bool), TokenError> {
        match ObserveToken::from_file(path) {
            Err(TokenError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let token = ObserveToken::generate().map_err(|source| TokenError::Io {
                    path: path.to_owned(),
                    source,
                })?;
                token.write_new_file(path)?;
                Ok((token, true))
            }
            other => other.map(|token| (token, false)),
        }
    }

    /// A fresh token in a new file `observe-token` of a new directory of the system's
    /// temporary one (mode 0700, a random name: nothing planted there beforehand is used); the
    /// token and the file's path.
    pub fn create_in_temp_dir() -> Result<(ObserveToken, PathBuf), TokenError> {
        use std::os::unix::fs::DirBuilderExt;
        let tag = hex(&random_nonce().map_err(|source| TokenError::Io {
            path: std::env::temp_dir(),
            source,
        })?[..6]);
        let dir = std::env::temp_dir().join(format!("flint-observe-{tag}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| TokenError::Io {
                path: dir.clone(),
                source,
            })?;
        let path = dir.join("observe-token");
        let token = ObserveToken::generate().map_err(|source| TokenError::Io {
            path: path.clone(),
            source,
        })?;
        token.write_new_file(&path)?;
        Ok((token, path))
    }

    /// Writes the token to a new file readable by its owner only (mode 0600); fails if the
    /// file exists.
    pub fn write_new_file(&self, path: &Path) -> Result<(), TokenError> {
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| TokenError::Io {
            path: path.to_owned(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        file.write_all(&self.token)
            .and_then(|()| file.write_all(b"\n"))
            .and_then(|()| file.sync_all())
            .map_err(io)
    }

    /// Refuses a token equal to the cluster's `secret` (as its file holds it, or trimmed).
    pub fn check_not_secret(&self, secret: Option<&Secret>) -> Result<(), TokenError> {
        let Some(secret) = secret else {
            return Ok(());
        };
        let bytes = secret.expose_bytes();
        if constant_time_eq(&self.token, bytes) || constant_time_eq(&self.token, bytes.trim_ascii())
        {
            return Err(TokenError::IsTheSecret);
        }
        Ok(())
    }

    /// Whether `given` (a bearer credential) is the token.
    pub(crate) fn matches(&self, given: &[u8]) -> bool {
        constant_time_eq(&self.token, given)
    }

    /// Whether `given` (a cookie's value) is the login cookie.
    pub(crate) fn matches_cookie(&self, given: &[u8]) -> bool {
        constant_time_eq(self.cookie.as_bytes(), given)
    }

    /// The login cookie's value.
    pub(crate) fn cookie(&self) -> &str {
        &self.cookie
    }
}

/// Who may read a server's answers.
#[derive(Debug, Clone)]
pub enum Access {
    /// Every request shows this token (bearer or login cookie).
    Token(ObserveToken),
    /// No token: served on loopback addresses only.
    Open,
}

/// Equal in time independent of where the bytes differ (the length is not secret).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("flint-token-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn tokens_are_checked_and_never_the_secret() {
        assert!(matches!(
            ObserveToken::new(b"short"),
            Err(TokenError::Malformed)
        ));
        assert!(matches!(
            ObserveToken::new(b"has a space in it!!"),
            Err(TokenError::Malformed)
        ));
        let token = ObserveToken::new(b"  0123456789abcdef\n").unwrap();
        assert!(token.matches(b"0123456789abcdef"));
        assert!(!token.matches(b"0123456789abcdeF"));
        assert!(token.matches_cookie(token.cookie().as_bytes()));
        assert!(!token.cookie().contains("0123456789abcdef"));
        let secret = Secret::new(b"0123456789abcdef\n".to_vec()).unwrap();
        assert!(matches!(
            token.check_not_secret(Some(&secret)),
            Err(TokenError::IsTheSecret)
        ));
        let other = Secret::new(b"another secret".to_vec()).unwrap();
        assert!(token.check_not_secret(Some(&other)).is_ok());
    }

    #[test]
    fn files_are_regular_bounded_and_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("files");
        let path = dir.join("token");
        let (made, created) = ObserveToken::load_or_create(&path).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (read, created) = ObserveToken::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(read.cookie(), made.cookie());
        assert!(matches!(
            ObserveToken::from_file(Path::new("/dev/zero")),
            Err(TokenError::NotAFile { .. })
        ));
        assert!(matches!(
            ObserveToken::from_file(&dir),
            Err(TokenError::NotAFile { .. })
        ));
        let big = dir.join("big");
        std::fs::write(&big, vec![b'a'; 5000]).unwrap();
        assert!(matches!(
            ObserveToken::from_file(&big),
            Err(TokenError::NotAFile { .. })
        ));
        let fifo = dir.join("fifo");
        let made_fifo = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made_fifo.is_ok_and(|s| s.success()) {
            assert!(matches!(
                ObserveToken::from_file(&fifo),
                Err(TokenError::NotAFile { .. })
            ));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
