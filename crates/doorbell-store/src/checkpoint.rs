//! The checkpoint: what a restart starts from so that it replays only the journal's tail.
//! It is the index (`index.rs`), saved with what changed since the last save; this module
//! decides when the index can be trusted and what to do when it cannot.
//!
//! A bridge written by an older doorbell has a whole-ledger `checkpoint.json` instead. Its
//! journal is complete, so migrating is replaying the journal into a new index; the old
//! files are removed once the index holds everything they did. The same replay rebuilds an
//! index that is missing, damaged, of another version or ahead of the journal: the journal
//! says which lines were judged, so nothing is judged twice and no side effect repeated.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use crate::index::IndexWriter;
use crate::judge::PendingCheckpoint;
use crate::{Error, Result};

/// The old whole-ledger checkpoint and its previous copy.
pub const OLD_FILES: [&str; 2] = ["checkpoint.json", "checkpoint.prev.json"];

/// The index's files: the database and `SQLite`'s own two beside it.
fn index_files(index: &Path) -> [std::path::PathBuf; 3] {
    let name = index.display().to_string();
    [
        index.to_path_buf(),
        format!("{name}-wal").into(),
        format!("{name}-shm").into(),
    ]
}

/// Open the index for writing, building a new one when it is missing or cannot be used.
/// Returns the writer and whether the index is new (to be filled from the whole journal).
/// A new one is filled without the readers' lookups, made after the first catch-up
/// ([`IndexWriter::finish`]); one whose first catch-up was cut short gets them now.
pub fn open_index(index: &Path) -> Result<(IndexWriter, bool)> {
    let existed = index.exists();
    let mut writer = IndexWriter::open(index)?;
    if existed {
        writer.finish()?;
    } else {
        writer.defer_lookups();
    }
    Ok((writer, !existed))
}

/// Remove the index's files, so that a new one is built.
pub fn discard(index: &Path) -> Result<()> {
    let mark = crate::index::damage_mark(index);
    for file in index_files(index).into_iter().chain([mark]) {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove damaged index", &file)(e)),
        }
    }
    Ok(())
}

/// After the first save of a migrated bridge: the old checkpoint files say nothing the index
/// does not, so they go.
pub fn retire_old(state_dir: &Path) {
    for name in OLD_FILES {
        let path = state_dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "migrated: the index replaces the old checkpoint");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "could not remove the old checkpoint");
            }
        }
    }
}

/// The thread that saves checkpoints for a long-running judge, so that their fsyncs and
/// transactions (seconds on a busy disk) never hold up judging. One save at a time, with its
/// own connection to the index.
#[derive(Debug)]
pub struct Saver {
    to_save: Sender<PendingCheckpoint>,
    /// Each save's result, with the checkpoint it saved: its rows are freed on the judge's
    /// thread, which allocated them. Freed on this thread they contended with the judge's
    /// own allocations for the allocator's lock (about a sixth of the judge's time in a catch-up).
    saved: Receiver<(Result<u64>, PendingCheckpoint)>,
    in_flight: bool,
    /// Set once judging is live: the thread's next save gives way ([`yield_to_the_judge`]).
    give_way: Arc<AtomicBool>,
    /// The thread, waited for when the saver is dropped.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A saver dropped (its judge dropped, or replaced in a reload) ends its thread and waits for
/// it: a save still in flight, and the thread's connection, are done with the index before
/// the judge lets the bridge go, so the next judge finds nobody writing it (nor an older
/// change set landing after its own).
impl Drop for Saver {
    fn drop(&mut self) {
        // The thread ends when nothing can hand it a checkpoint any more.
        let (closed, _) = channel();
        drop(std::mem::replace(&mut self.to_save, closed));
        if let Some(thread) = self.thread.take() {
            // A save that failed or panicked has nobody left to tell.
            let _ = thread.join();
        }
    }
}

/// The saves of a live judge give way to it (and to the agents) whenever they contend for a
/// core: its verdicts are what someone waits for, a save only bounds a restart's replay.
/// With two cores and a burst of writers, a save running beside the judge at its own
/// priority held the burst's lines back. A nice of 10 still gives it a tenth of a busy
/// core, and every idle one. Not in a catch-up, where the judge waits for its saves.
fn yield_to_the_judge() {
    // On Linux a thread's id names that thread alone to setpriority.
    let this = rustix::process::Pid::from_raw(rustix::thread::gettid().as_raw_nonzero().get());
    if let Err(error) = rustix::process::setpriority_process(this, 10) {
        tracing::debug!(%error, "the checkpoint thread keeps the judge's priority");
    }
}

impl Saver {
    #[must_use]
    pub fn start() -> Saver {
        let (to_save, pending) = channel::<PendingCheckpoint>();
        let (report, saved) = channel();
        let give_way = Arc::new(AtomicBool::new(false));
        let live = Arc::clone(&give_way);
        let thread = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || {
                let mut yielded = false;
                // Opened again after a failure.
                let mut writer: Option<IndexWriter> = None;
                for checkpoint in pending {
                    if !yielded && live.load(Ordering::Relaxed) {
                        yield_to_the_judge();
                        yielded = true;
                    }
                    let result = match writer.take() {
                        Some(w) => Ok(w),
                        None => IndexWriter::open(checkpoint.index_path()),
                    }
                    .and_then(|mut w| {
                        let saved = checkpoint.save(&mut w)?;
                        writer = Some(w);
                        Ok(saved)
                    });
                    if report.send((result, checkpoint)).is_err() {
                        return;
                    }
                }
            })
            .expect("starting the checkpoint thread");
        Saver {
            to_save,
            saved,
            in_flight: false,
            give_way,
            thread: Some(thread),
        }
    }

    /// From the next save on, the saves give way to the judge: judging is live.
    pub fn give_way(&self) {
        self.give_way.store(true, Ordering::Relaxed);
    }

    /// Whether the saves give way to the judge.
    #[must_use]
    pub fn gives_way(&self) -> bool {
        self.give_way.load(Ordering::Relaxed)
    }

    /// Whether a save is still in flight; when one finished, its result (the change set
    /// saved, or why it failed) and the checkpoint, handed back to be freed or reused.
    pub fn poll(&mut self) -> Option<(Result<u64>, PendingCheckpoint)> {
        if !self.in_flight {
            return None;
        }
        let saved = self.saved.try_recv().ok()?;
        self.in_flight = false;
        Some(saved)
    }

    #[must_use]
    pub fn is_busy(&self) -> bool {
        self.in_flight
    }

    /// Hand a checkpoint over; the caller made sure none is in flight.
    pub fn hand_over(&mut self, checkpoint: PendingCheckpoint) {
        self.in_flight = self.to_save.send(checkpoint).is_ok();
    }

    /// Wait for the save in flight, if any.
    pub fn settle(&mut self) -> Option<(Result<u64>, PendingCheckpoint)> {
        if !std::mem::take(&mut self.in_flight) {
            return None;
        }
        self.saved.recv().ok()
    }
}
