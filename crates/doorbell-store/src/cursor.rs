//! An agent's own read position, `<agent>-inbox.cursor`, beside its inbox.
//!
//! It records which file it belongs to (device, inode and a marker of the bytes before the
//! offset) and the offset, always the start of a line. It only moves forward, under `flock`,
//! and is replaced atomically. Before it is trusted it is checked against the inbox like the
//! judge's own positions: a cursor for a replaced or truncated inbox is not trusted.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hash::Marker;
use crate::{Bridge, Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct CursorFile {
    version: u32,
    dev: u64,
    ino: u64,
    offset: u64,
    marker: Marker,
}

/// Where an agent's reading resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// No cursor yet: read from the start.
    Fresh,
    /// The cursor matches the inbox: resume here.
    At(u64),
    /// The cursor belongs to a file that was replaced or truncated: read the new one from 0.
    Replaced { stale_offset: u64 },
}

impl Position {
    #[must_use]
    pub fn offset(self) -> u64 {
        match self {
            Position::At(offset) => offset,
            Position::Fresh | Position::Replaced { .. } => 0,
        }
    }
}

fn read_cursor(path: &Path) -> Result<Option<CursorFile>> {
    let mut text = String::new();
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(mut file) => {
            file.read_to_string(&mut text)
                .map_err(Error::io("read cursor", path))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("open cursor", path)(e)),
    }
    if text.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str(&text) {
        Ok(cursor) => Ok(Some(cursor)),
        Err(error) => {
            // Cursors are not synced (they may go back, never forward), so a power loss can
            // leave one unreadable: going back to the start is the safe direction.
            tracing::warn!(path = %path.display(), %error, "the cursor file cannot be read: reading the inbox from the start");
            Ok(None)
        }
    }
}

fn validate(saved: Option<CursorFile>, inbox: &File) -> Result<Position> {
    let Some(saved) = saved else {
        return Ok(Position::Fresh);
    };
    let meta = inbox.metadata().map_err(|e| Error::Io {
        action: "stat inbox",
        path: "(inbox)".into(),
        source: e,
    })?;
    let same = meta.dev() == saved.dev
        && meta.ino() == saved.ino
        && meta.len() >= saved.offset
        && saved.marker.matches(inbox, saved.offset).unwrap_or(false);
    Ok(if same {
        Position::At(saved.offset)
    } else {
        Position::Replaced {
            stale_offset: saved.offset,
        }
    })
}

/// Where `agent` resumes reading `inbox`.
pub fn load(bridge: &Bridge, agent: &str, inbox: &File) -> Result<Position> {
    let path = bridge.cursor_path(agent)?;
    validate(read_cursor(&path)?, inbox)
}

/// Open the cursor file and lock it, making sure the locked file is still the one at `path`
/// (a concurrent writer may have renamed a new one over it).
fn lock_cursor(path: &Path) -> Result<File> {
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(Error::io("open cursor", path))?;
        file.lock().map_err(Error::io("lock cursor", path))?;
        let locked = file.metadata().map_err(Error::io("stat cursor", path))?;
        match fs::symlink_metadata(path) {
            Ok(now) if now.ino() == locked.ino() && now.dev() == locked.dev() => return Ok(file),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("stat cursor", path)(e)),
        }
    }
}

/// Move `agent`'s cursor on `inbox` forward to `offset` (the start of a line). A cursor that
/// is already further on the same file stays where it is.
pub fn advance(bridge: &Bridge, agent: &str, inbox: &File, offset: u64) -> Result<()> {
    let path = bridge.cursor_path(agent)?;
    let _guard = lock_cursor(&path)?;
    let current = validate(read_cursor(&path)?, inbox)?;
    if let Position::At(at) = current {
        if at >= offset {
            return Ok(());
        }
    }
    let meta = inbox.metadata().map_err(Error::io("stat inbox", &path))?;
    let Some(marker) = Marker::of(inbox, offset).map_err(Error::io("read inbox", &path))? else {
        return Ok(());
    };
    let record = CursorFile {
        version: 1,
        dev: meta.dev(),
        ino: meta.ino(),
        offset,
        marker,
    };
    let text = serde_json::to_string(&record).expect("a cursor always serialises");
    // Not synced: after a power loss a cursor may go back (messages shown again), never
    // forward; an fsync per message held up `watch` behind the disk.
    crate::atomic::write_atomic_unsynced(&path, text.as_bytes())
}
