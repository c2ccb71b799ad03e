//! Journaling: a verdict recorded (journal, ledger, refused log) before anything acts on it;
//! checkpoints of the index and the roll of the live journal.

use std::fs::File;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use doorbell_core::{Accepted, Verdict, BUILTIN_LOOPS};

use super::{CatchUp, Judge};
use crate::index::{Changes, IndexWriter};
use crate::journal::{JournalWriter, Record, Word};
use crate::{Error, Result};

/// A checkpoint ready to be saved: what changed since the last one. The journal and the
/// refused log are synced first, so the index never covers more than is durable.
#[derive(Debug)]
pub struct PendingCheckpoint {
    /// The files to sync first, with their paths.
    durable_first: [(File, PathBuf); 2],
    changes: Changes,
    index_path: PathBuf,
}

/// What a verdict knows of the bytes it is on, to know them again where they are (see
/// [`crate::journal::LastLine`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum Bytes<'a> {
    /// One line's, its `\n` not included.
    Line(&'a [u8]),
    /// A run of lines judged as one: the fold of their hashes, and how many there are.
    Run { hash: u64, lines: u64 },
    /// Not kept: an over-long line.
    Unknown,
}

/// The thread making a new index's lookups ([`Judge::make_lookups`]). Dropped, it waits for
/// them, whatever their outcome: a judge dropped before it asked for them (its catch-up
/// failed half way), a reload, or an index about to be discarded.
#[derive(Debug)]
pub(super) struct MakingLookups(Option<std::thread::JoinHandle<Result<()>>>);

impl Drop for MakingLookups {
    fn drop(&mut self) {
        if let Some(making) = self.0.take() {
            // Whatever it met, the next open makes what is missing.
            let _ = making.join();
        }
    }
}

impl PendingCheckpoint {
    /// The index it is saved into.
    #[must_use]
    pub fn index_path(&self) -> &std::path::Path {
        &self.index_path
    }

    /// Sync, then write the changes into the index. Returns the change set saved, for
    /// [`Judge::saved`].
    pub fn save(&self, index: &mut IndexWriter) -> Result<u64> {
        for (file, path) in &self.durable_first {
            crate::fault::check(path)
                .and_then(|()| file.sync_data())
                .map_err(Error::io("sync", path))?;
        }
        index.save(&self.changes)?;
        Ok(self.changes.seq)
    }
}

impl Judge {
    /// Save checkpoints on a thread of their own from now on ([`Judge::checkpoint_in_background`]).
    pub fn save_in_background(&mut self) {
        self.saver
            .get_or_insert_with(crate::checkpoint::Saver::start);
    }

    /// Judging is live: the saves give way to the judge when they contend for a core (a
    /// catch-up, which waits for its saves, gives them the judge's priority).
    pub fn saves_give_way(&self) {
        if let Some(saver) = &self.saver {
            saver.give_way();
        }
    }

    /// Hand a checkpoint to the saving thread unless one is still being saved (false then).
    /// A save that failed is this call's error: memory no longer matches the index, and the
    /// judge must [`Judge::reload`] (the journal has everything the index missed).
    pub fn checkpoint_in_background(&mut self) -> Result<bool> {
        self.lookups_made()?;
        let Some(saver) = &mut self.saver else {
            self.checkpoint()?;
            return Ok(true);
        };
        if let Some((result, saved)) = saver.poll() {
            self.taken_back(result, saved)?;
        }
        if self
            .saver
            .as_ref()
            .is_some_and(crate::checkpoint::Saver::is_busy)
        {
            return Ok(false);
        }
        let pending = self.prepare_checkpoint()?;
        if let Some(saver) = &mut self.saver {
            saver.hand_over(pending);
        }
        Ok(true)
    }

    /// Make a new index's lookups on a thread of their own, with a connection of its own; the
    /// next save waits for them ([`Judge::lookups_made`]). Where no thread can start, here.
    pub(super) fn make_lookups(&mut self) -> Result<()> {
        let path = self.index.path().to_path_buf();
        let started = std::thread::Builder::new()
            .name("lookups".into())
            .spawn(move || IndexWriter::open(&path)?.finish());
        match started {
            Ok(making) => self.making_lookups = Some(MakingLookups(Some(making))),
            Err(_) => self.index.finish()?,
        }
        Ok(())
    }

    /// Wait for the lookups being made, if they are: a save never contends with them for
    /// the index's write lock. Then the writer knows them made.
    pub(super) fn lookups_made(&mut self) -> Result<()> {
        let Some(making) = self.making_lookups.take().and_then(|mut m| m.0.take()) else {
            return Ok(());
        };
        making
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        // They are all there: nothing is written.
        self.index.finish()
    }

    /// Wait for the checkpoint the saving thread has in flight, if any.
    pub fn settle(&mut self) -> Result<()> {
        self.lookups_made()?;
        if let Some((result, saved)) = self
            .saver
            .as_mut()
            .and_then(crate::checkpoint::Saver::settle)
        {
            self.taken_back(result, saved)?;
        }
        Ok(())
    }

    /// Make everything judged so far durable and save what changed into the index.
    pub fn checkpoint(&mut self) -> Result<()> {
        // Saves happen in order: an older change set never lands after a newer one.
        self.settle()?;
        let pending = self.prepare_checkpoint()?;
        let result = pending.save(&mut self.index);
        self.taken_back(result, pending)
    }

    /// Save a checkpoint when anything was journaled since the last one: a command that
    /// judged nothing writes nothing.
    pub fn checkpoint_if_changed(&mut self) -> Result<()> {
        if self.journal.len() != self.saved_len {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// What changed since the last checkpoint, with what must be synced before it is saved:
    /// the slow half ([`PendingCheckpoint::save`]: fsyncs and the index's transaction) can
    /// run on another thread while this one judges on.
    pub fn prepare_checkpoint(&mut self) -> Result<PendingCheckpoint> {
        self.journal.flush()?;
        self.refused_log.flush()?;
        self.snapshot.journal_len = self.journal.len();
        self.saved_len = self.journal.len();
        let refused_path = self
            .journal_path
            .with_file_name(crate::refused::REFUSED_FILE);
        Ok(PendingCheckpoint {
            durable_first: [
                (self.journal.file()?, self.journal_path.clone()),
                (self.refused_log.file()?, refused_path),
            ],
            changes: self.snapshot.take_changes(&self.timing()),
            index_path: crate::index::index_path(
                self.journal_path
                    .parent()
                    .unwrap_or(std::path::Path::new(".")),
            ),
        })
    }

    /// The index holds change set `seq`: memory lets go of what it holds.
    pub fn saved(&mut self, seq: u64) {
        self.snapshot.saved(seq);
    }

    /// A checkpoint back from its save: its rows are filled again for the next ones, and
    /// when it was saved, memory lets go of what the index now holds.
    fn taken_back(&mut self, result: Result<u64>, saved: PendingCheckpoint) -> Result<()> {
        self.snapshot.recycle(saved.changes.messages);
        self.saved(result?);
        Ok(())
    }

    /// Seal the live journal as a segment and start the next one empty (see `segments`):
    /// only once everything journaled is saved in the index.
    pub fn roll(&mut self) -> Result<()> {
        self.checkpoint()?;
        let state = self.bridge.state_dir()?;
        let segment = self.snapshot.segment;
        crate::segments::seal(&state, &self.journal_path, segment)?;
        let next = crate::index::Changes {
            segment: segment + 1,
            journal_len: 0,
            ..crate::index::Changes::default()
        };
        self.index.save(&next)?;
        // From here the live file is the sealed one until it is replaced: a judge that dies
        // now finishes the roll when it starts.
        let copy = self.journal.keeps_copy();
        self.journal.abandon();
        crate::segments::start_empty(&self.journal_path)?;
        self.journal = JournalWriter::open(&self.journal_path, 0)?;
        if copy {
            // What the sealed file got since the last copy was never told: who follows
            // reads the file (and on into this one).
            self.journal.keep_copy();
            self.journal.lose_copy();
        }
        self.snapshot.segment = segment + 1;
        self.snapshot.journal_len = 0;
        self.saved_len = 0;
        tracing::info!(segment, "sealed a journal segment");
        Ok(())
    }

    /// Roll the journal once the live segment is over `bytes`.
    pub fn roll_if_over(&mut self, bytes: u64) -> Result<bool> {
        if self.journal.len() < bytes {
            return Ok(false);
        }
        self.roll()?;
        Ok(true)
    }

    /// Keep a copy of what is journaled from now on, for [`Judge::take_appended`]: the
    /// daemon hands it to its watchers, who need not read the journal file for it.
    pub fn keep_journal_copy(&mut self) {
        self.journal.keep_copy();
    }

    /// What was journaled since the last call, written to the file first.
    pub fn take_appended(&mut self) -> Result<Option<crate::journal::Appended>> {
        self.journal.take_copy()
    }

    /// How far the journal has grown since the last checkpoint.
    #[must_use]
    pub fn unsaved_bytes(&self) -> u64 {
        self.journal.len().saturating_sub(self.saved_len)
    }

    /// The journal's length: what a checkpoint would cover.
    #[must_use]
    pub fn journal_len(&self) -> u64 {
        self.journal.len()
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(
        &mut self,
        name: &str,
        gen: u32,
        offset: u64,
        span: u64,
        bytes: Bytes<'_>,
        verdict: &Verdict,
        identity: Option<(Option<String>, Option<String>)>,
        accepted: Option<Accepted>,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        let seen_at = now.timestamp_millis();
        let word = match verdict {
            Verdict::Accepted => Word::Accepted,
            Verdict::Duplicate => Word::Duplicate,
            Verdict::Refused(_) => Word::Refused,
        };
        let mut record = Record::new(name, gen, offset, word, seen_at);
        record.span = span;
        match verdict {
            Verdict::Accepted => stats.accepted += 1,
            Verdict::Duplicate => stats.duplicate += 1,
            Verdict::Refused(refusal) => {
                stats.refused += 1;
                record.reason = Some(refusal.reason.code().to_owned());
                record.detail = Some(refusal.detail.clone());
            }
        }
        if let Some((id, from)) = identity {
            record.tell = word == Word::Refused
                && from
                    .as_deref()
                    .is_some_and(|f| self.inbox_names.contains(f) && !BUILTIN_LOOPS.contains(&f));
            record.id = id;
            record.from = from;
            // A line read again after its inbox was restored: its sender heard of it once.
            if record.tell && self.snapshot.refused_before(&record) {
                record.tell = false;
            }
        }
        record.line = accepted;
        if record.line.is_none() {
            (record.hash, record.lines) = match bytes {
                Bytes::Line(bytes) => (Some(xxhash_rust::xxh3::xxh3_64(bytes)), 0),
                Bytes::Run { hash, lines } => (Some(hash), lines),
                Bytes::Unknown => (None, 0),
            };
        }
        // A verdict that rests on a lookup the index failed to answer is never journaled:
        // the judge stops, the index is rebuilt, and the line judged again.
        if let Some(error) = self.snapshot.failed_lookup() {
            tracing::error!(%error, "the index failed a lookup: it is rebuilt from the journal before judging goes on");
            if let Some(saver) = &mut self.saver {
                let _ = saver.settle();
            }
            // Nor may the lookups' thread open the index once its files are gone: it would
            // make an empty one, taken for the index at the next open.
            drop(self.making_lookups.take());
            crate::checkpoint::discard(&crate::index::index_path(
                self.bridge.state_dir()?.as_path(),
            ))?;
            return Err(error);
        }
        self.journal.append(&record)?;
        // Who prints for a watch prints an accepted line as it was judged, without reading
        // the inbox again.
        let line = match bytes {
            Bytes::Line(bytes) => Some(bytes),
            Bytes::Run { .. } | Bytes::Unknown => None,
        };
        self.journal
            .copy_line(name, gen, offset, span, word == Word::Accepted, line);
        self.refused_log.log(&record);
        self.snapshot.apply(record);
        // A long catch-up saves as it goes: memory holds a batch or two, never the whole
        // backlog. With a saving thread the save overlaps the judging of the next batch.
        let unsaved = self.snapshot.unsaved_lines();
        if unsaved >= crate::journal::REPLAY_BATCH {
            if self.saver.is_none() {
                self.checkpoint()?;
            } else if !self.checkpoint_in_background()? {
                // The saving thread is behind: wait for it rather than hold more. Memory
                // then holds two batches at most, whichever thread is the faster.
                self.settle()?;
                self.checkpoint_in_background()?;
            }
        }
        Ok(())
    }
}
