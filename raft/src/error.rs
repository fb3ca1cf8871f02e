//! The crate's internal error, and its mapping into openraft's [`StorageError`].
//!
//! Internal functions return [`Error`]; each trait method maps it once, naming what it was
//! working on ([`ErrorSubject`]) and how ([`ErrorVerb`]), so openraft's report says e.g.
//! "when Write Apply(T1-N0.7): bfkv: ...".

use std::fmt;
use std::path::PathBuf;

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};

use crate::NodeId;

/// openraft's storage error for this crate's node ids.
pub(crate) type StorageError = openraft::StorageError<NodeId>;

/// Why a storage operation failed.
#[derive(Debug)]
pub(crate) enum Error {
    /// A bfkv call failed.
    Tree(bfkv::Error),
    /// A file-system call on `path` failed (the snapshot file, `CURRENT`, a generation).
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// Bytes that should hold a format of this crate do not (a snapshot pack, the snapshot
    /// file, `CURRENT`, a stored entry or vote).
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// Which check failed.
        reason: &'static str,
    },
    /// The node directory's parts disagree: each is readable, but together they say that
    /// something synced was lost (the log or vote went back, the state machine is gone or
    /// behind the log). The node must not serve from it.
    Inconsistent {
        /// The part found wanting.
        what: &'static str,
        /// What the check found.
        reason: &'static str,
    },
    /// A value did not encode or decode with bincode.
    Codec(bincode::Error),
    /// A blocking task that ran the I/O panicked or was cancelled.
    Task(tokio::task::JoinError),
}

/// Shorthand for results of [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error about `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Parts of the node directory that disagree (see [`Error::Inconsistent`]).
    pub(crate) fn inconsistent(what: &'static str, reason: &'static str) -> Self {
        Error::Inconsistent { what, reason }
    }

    /// A decoding failure of `what`.
    pub(crate) fn malformed(what: &'static str, reason: &'static str) -> Self {
        Error::Malformed { what, reason }
    }

    /// This error as openraft's, about `subject`, while doing `verb`.
    pub(crate) fn storage(&self, subject: ErrorSubject<NodeId>, verb: ErrorVerb) -> StorageError {
        StorageIOError::new(subject, verb, AnyError::new(self)).into()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Tree(e) => write!(f, "bfkv: {e}"),
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Malformed { what, reason } => write!(f, "malformed {what}: {reason}"),
            Error::Inconsistent { what, reason } => {
                write!(f, "refusing the node directory: {what}: {reason}")
            }
            Error::Codec(e) => write!(f, "encoding: {e}"),
            Error::Task(e) => write!(f, "storage task: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Tree(e) => Some(e),
            Error::Io { source, .. } => Some(source),
            Error::Codec(e) => Some(e),
            Error::Task(e) => Some(e),
            Error::Malformed { .. } | Error::Inconsistent { .. } => None,
        }
    }
}

impl From<bfkv::Error> for Error {
    fn from(e: bfkv::Error) -> Self {
        Error::Tree(e)
    }
}

impl From<bincode::Error> for Error {
    fn from(e: bincode::Error) -> Self {
        Error::Codec(e)
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::Task(e)
    }
}

/// Runs the blocking `work` (bfkv calls that may `fsync` or read leaves from disk) on
/// tokio's blocking pool, so openraft's tasks on the async workers keep running meanwhile.
pub(crate) async fn blocking<T, F>(work: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work).await?
}
