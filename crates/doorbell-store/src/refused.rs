//! `.doorbell/refused.jsonl`: every refused line, one record each, for people and tools.
//! Keyed by inbox, generation and offset: the journal is the truth, and writing a refusal
//! that is already here (after a crash between the two) adds nothing.

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use doorbell_core::notice::refusal_key;
use serde::{Deserialize, Serialize};

use crate::fault::Guarded;
use crate::journal::{Record, Word};
use crate::reader::{Line, LineReader};
use crate::{Error, Result};

pub const REFUSED_FILE: &str = "refused.jsonl";

/// One refused line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusedRecord {
    pub inbox: String,
    pub generation: u32,
    pub offset: u64,
    pub reason: String,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The judge's clock, milliseconds since the epoch.
    pub seen_at: i64,
}

/// The refused log's appender. It remembers which of the refusals it may be shown again (the
/// journal's tail past the checkpoint) it already holds, and nothing else.
#[derive(Debug)]
pub struct RefusedLog {
    /// `None` once a write failed: the unwritten rest is dropped, not written later behind a
    /// reopened log; the judge reloads, and the journal's tail brings back what is missing.
    out: Option<BufWriter<Guarded>>,
    path: PathBuf,
    keys: HashSet<String>,
}

impl RefusedLog {
    /// Open the log in the judge's folder, cutting off a torn last record, and note which of
    /// the refusals keyed in `replayed` it already holds; `None`: note every one (after the
    /// journal lost records, any refusal here may be judged again).
    pub fn open(state_dir: &Path, replayed: Option<&HashSet<String>>) -> Result<RefusedLog> {
        let path = state_dir.join(REFUSED_FILE);
        crate::fault::check(&path).map_err(Error::io("open refused log", &path))?;
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(Error::io("open refused log", &path))?;
        let mut keys = HashSet::new();
        let end = LineReader::new(1 << 24).read(&file, 0, |line| -> Result<()> {
            if let Line::Complete { bytes, .. } = line {
                if let Ok(record) = serde_json::from_slice::<RefusedRecord>(bytes) {
                    let key = refusal_key(&record.inbox, record.generation, record.offset);
                    if replayed.is_none_or(|r| r.contains(&key)) {
                        keys.insert(key);
                    }
                }
            }
            Ok(())
        })?;
        let len = file
            .metadata()
            .map_err(Error::io("stat refused log", &path))?
            .len();
        if len > end {
            file.set_len(end)
                .map_err(Error::io("repair refused log", &path))?;
        }
        let file = Guarded {
            file,
            path: path.clone(),
        };
        Ok(RefusedLog {
            out: Some(BufWriter::new(file)),
            path,
            keys,
        })
    }

    /// Record a journaled refusal unless it is already here (each one is shown at most once
    /// more, by the replay); other records are ignored.
    pub fn log(&mut self, record: &Record) {
        if record.verdict != Word::Refused {
            return;
        }
        let key = refusal_key(&record.inbox, record.gen, record.offset);
        if self.keys.remove(&key) {
            return;
        }
        let entry = RefusedRecord {
            inbox: record.inbox.clone(),
            generation: record.gen,
            offset: record.offset,
            reason: record.reason.clone().unwrap_or_default(),
            detail: record.detail.clone().unwrap_or_default(),
            id: record.id.clone(),
            from: record.from.clone(),
            seen_at: record.seen_at,
        };
        let mut line = serde_json::to_vec(&entry).expect("a refused record always serialises");
        line.push(b'\n');
        let Some(out) = &mut self.out else {
            return;
        };
        if let Err(e) = out.write_all(&line) {
            tracing::error!(path = %self.path.display(), error = %e, "could not write the refused log");
            self.abandon();
        }
    }

    /// Close the log without writing what it still buffers; later records are dropped and
    /// `flush` fails.
    pub fn abandon(&mut self) {
        if let Some(out) = self.out.take() {
            let (_file, _unwritten) = out.into_parts();
        }
    }

    fn out(&mut self) -> Result<&mut BufWriter<Guarded>> {
        match &mut self.out {
            Some(out) => Ok(out),
            None => Err(Error::io("write refused log", &self.path)(
                std::io::Error::other("an earlier write failed; the log must be reopened"),
            )),
        }
    }

    pub fn flush(&mut self) -> Result<()> {
        let flushed = self.out()?.flush();
        flushed.map_err(|e| {
            self.abandon();
            Error::io("write refused log", &self.path)(e)
        })
    }

    /// Another handle on the log file, for syncing it from elsewhere.
    pub fn file(&mut self) -> Result<std::fs::File> {
        let cloned = self.out()?.get_ref().file.try_clone();
        cloned.map_err(Error::io("open refused log", &self.path))
    }

    pub fn sync(&mut self) -> Result<()> {
        self.flush()?;
        let synced = self.out()?.get_ref().sync_data();
        synced.map_err(|e| {
            self.abandon();
            Error::io("sync refused log", &self.path)(e)
        })
    }
}
