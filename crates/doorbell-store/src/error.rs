//! The store's one error type. Variants carry the path or agent they concern; the binary adds
//! context and turns them into messages for people.

use std::io;
use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no such agent '{name}' ({})", known_list(.known))]
    NoSuchAgent { name: String, known: Vec<String> },
    #[error("'{name}' is not a valid agent name (use [a-z0-9][a-z0-9._-]{{0,63}})")]
    BadAgentName { name: String },
    #[error("the name '{name}' is taken: {why}")]
    NameTaken { name: String, why: String },
    #[error("agent '{name}' already has an inbox at {path}")]
    AgentExists { name: String, path: PathBuf },
    #[error("{path} is not a regular file or folder (a symlink, FIFO or device is never followed): replace it with a real one")]
    NotRegularFile { path: PathBuf },
    #[error("{path} is not a folder ({what}; a symlink is never followed), so nothing reads the judge's state: {fix}")]
    StateNotFolder {
        path: PathBuf,
        what: String,
        fix: String,
    },
    #[error("the bridge folder {path} does not exist (create it, or pick another with --dir or DOORBELL_DIR)")]
    NoBridge { path: PathBuf },
    #[error("{path} has been locked by another process for {secs} s (a writer that hangs?): nothing was written; try again, or find the holder with `fuser {path}`")]
    InboxLocked { path: PathBuf, secs: f64 },
    /// A message to several inboxes written to some of them only.
    #[error("written to {written} only: {ids}; not to {failed}, {why}{advice}")]
    PartlyWritten {
        written: String,
        ids: String,
        failed: String,
        why: String,
        /// How to write the rest, when sending again can.
        advice: String,
    },
    #[error("{path} has been locked by another process for {secs} s, so the cursor did not move: what was shown stays unread and is shown again; find the holder with `fuser {path}`")]
    CursorLocked { path: PathBuf, secs: f64 },
    #[error("another reader of {agent} ({holder}) was in the middle of showing it messages and did not finish within {secs} s, so nothing was read this time: a reader whose output nobody reads (a `watch` or `read` into a paused pager, Ctrl-Z) stays in its turn until its output is read; try again once it goes on")]
    ReaderBusy {
        agent: String,
        holder: String,
        secs: u64,
    },
    #[error("another judge holds the bridge {dir} ({holder})")]
    Locked { dir: PathBuf, holder: String },
    #[error("config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("journal {path} line {line} (byte {offset}): {message} (the judge cuts the journal there when it starts, keeping the damaged part beside it, and judges again from the inboxes what the journal no longer says; see docs/RELIABILITY.md)")]
    CorruptJournal {
        path: PathBuf,
        line: u64,
        offset: u64,
        message: String,
    },
    #[error("journal {path} line {line}: {message} (the record is intact but not one this doorbell reads: a newer doorbell wrote it; run that one)")]
    UnknownJournalRecord {
        path: PathBuf,
        line: u64,
        message: String,
    },
    #[error("index {path} is damaged: {message} (the judge rebuilds it from the journal when it starts)")]
    Index { path: PathBuf, message: String },
    #[error("index {path} covers {index_len} bytes of the journal, which has {journal_len} (the judge rebuilds the index from the journal when it starts)")]
    JournalBehindIndex {
        path: PathBuf,
        index_len: u64,
        journal_len: u64,
    },
    #[error("index {path}: {message}")]
    IndexWrite { path: PathBuf, message: String },
    /// Input a sender gave that the rules refuse (exit 2).
    #[error("{message}")]
    Refused { message: String },
    #[error("the bridge's state folder {dir} was replaced while this judge ran (restored from a backup?): it stops, so that a judge started afresh works from what is there now")]
    StateReplaced { dir: PathBuf },
    #[error("the bridge folder {dir} or its state folder was removed or moved while this judge ran (restored from a backup?): it stops, so that a judge started afresh watches what is there now")]
    FolderGone { dir: PathBuf },
    #[error("interrupted: the judge is stopping")]
    Interrupted,
    /// A cursor was to move past lines printed as they were judged, and the inbox no longer
    /// holds them there.
    #[error("{path} changed in place since its lines were judged: the cursor stays")]
    ChangedInPlace { path: PathBuf },
}

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        "no agents yet; add one with 'doorbell agent add'".to_owned()
    } else {
        format!(
            "known: {}; add one with 'doorbell agent add'",
            known.join(", ")
        )
    }
}

impl Error {
    /// Whether a write was refused for room or because the file system is read-only
    /// (`ENOSPC`, `EDQUOT`, `EROFS`, or `SQLite`'s words for them): nothing is wrong with the
    /// bridge, only with where it is kept.
    #[must_use]
    pub fn is_no_room(&self) -> bool {
        match self {
            Error::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS)
            ),
            Error::IndexWrite { message, .. } => {
                message.contains("disk is full") || message.contains("readonly database")
            }
            _ => false,
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io {
            action,
            path,
            source,
        }
    }
}
