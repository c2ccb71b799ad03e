//! The checkpoint, `.doorbell/checkpoint.json`: the journal's snapshot (ledger, inbox
//! positions, the judge's pending side effects) saved so a restart replays only the journal's
//! tail.
//!
//! Written atomically (temp, fsync, rename, fsync the folder), versioned, and never ahead of
//! the journal: it records the journal length it covers, and that length is synced first.
//! The previous good copy is kept as `checkpoint.prev.json`. A checkpoint that is corrupt,
//! from another version, or claims more journal than exists is passed over loudly for the
//! previous copy or for a full replay — never a silent start from zero or from the end.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::journal::Snapshot;
use crate::{Error, Result};

pub const CHECKPOINT_FILE: &str = "checkpoint.json";
pub const PREVIOUS_FILE: &str = "checkpoint.prev.json";
const VERSION: u32 = 1;

#[derive(Serialize)]
struct Saving<'a> {
    version: u32,
    snapshot: &'a Snapshot,
}

#[derive(Deserialize)]
struct Loaded {
    version: u32,
    snapshot: Snapshot,
}

fn state_dir(journal: &Path) -> &Path {
    journal.parent().unwrap_or(Path::new("."))
}

/// The newest usable checkpoint beside `journal`, or an empty snapshot to replay from zero.
pub fn load(journal: &Path) -> Result<Snapshot> {
    let dir = state_dir(journal);
    let journal_len = fs::metadata(journal).map_or(0, |m| m.len());
    for name in [CHECKPOINT_FILE, PREVIOUS_FILE] {
        let path = dir.join(name);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("read checkpoint", &path)(e)),
        };
        match serde_json::from_slice::<Loaded>(&bytes) {
            Ok(loaded)
                if loaded.version == VERSION && loaded.snapshot.journal_len <= journal_len =>
            {
                return Ok(loaded.snapshot);
            }
            Ok(loaded) if loaded.version != VERSION => {
                tracing::error!(path = %path.display(), version = loaded.version, "checkpoint has an unknown version; not using it");
            }
            Ok(loaded) => {
                tracing::error!(
                    path = %path.display(),
                    covers = loaded.snapshot.journal_len,
                    journal = journal_len,
                    "checkpoint is ahead of the journal; not using it"
                );
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "checkpoint is corrupt; not using it");
            }
        }
    }
    if dir.join(CHECKPOINT_FILE).exists() || dir.join(PREVIOUS_FILE).exists() {
        tracing::error!(dir = %dir.display(), "no usable checkpoint: replaying the whole journal");
    }
    Ok(Snapshot::default())
}

/// Save `snapshot` (whose `journal_len` must already be durable in the journal).
pub fn save(journal: &Path, snapshot: &Snapshot) -> Result<()> {
    write(journal, &encode(snapshot))
}

/// The checkpoint's bytes for `snapshot`: what [`write`] saves, made while the snapshot can
/// be borrowed so the disk work can happen elsewhere.
#[must_use]
pub fn encode(snapshot: &Snapshot) -> Vec<u8> {
    let saving = Saving {
        version: VERSION,
        snapshot,
    };
    serde_json::to_vec(&saving).expect("a snapshot always serialises")
}

/// Save checkpoint `bytes` from [`encode`] beside `journal`, atomically, keeping the previous
/// copy. The journal length they cover must already be durable.
pub fn write(journal: &Path, bytes: &[u8]) -> Result<()> {
    let dir = state_dir(journal);
    crate::atomic::replace_with(
        &dir.join(CHECKPOINT_FILE),
        Some(&dir.join(PREVIOUS_FILE)),
        |out| out.write_all(bytes),
    )
}
