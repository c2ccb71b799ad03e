//! Tailing: each inbox's current file (its generation, a replaced file drained first), its
//! complete lines from where judging stopped (runs of lines that name nobody: `unnamed`), the
//! judge's own long lines, the marks that know an inbox by its bytes.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use doorbell_core::{Refusal, RefusalReason, Verdict};

use super::record::Bytes;
use super::unnamed::Unnamed;
use super::verdicts::{identity_of, names_reserved_id};
use super::{CatchUp, HeldLines, Judge};
use crate::append::open_inbox;
use crate::halves;
use crate::hash::Marker;
use crate::journal::{LastLine, Record, Unread, Word};
use crate::reader::{Line, LineReader};
use crate::{Error, Result};

/// At most this many inbox files are kept open (to drain a replaced file's old inode).
pub(super) const OPEN_FILES: usize = 256;

/// Whether the line at `offset` lies within a verdict already journaled past where judging
/// stopped: at one of its offsets, or inside a run of lines that name nobody judged as one.
pub(super) fn covered(beyond: &std::collections::BTreeMap<u64, u64>, offset: u64) -> bool {
    beyond
        .range(..=offset)
        .next_back()
        .is_some_and(|(start, span)| offset < start + span)
}

/// A line of nothing but white space: no message, never accepted.
pub(crate) fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r'))
}

/// The longest line under the judge's seal that [`Judge::own_line_at`] reads back whole: the
/// judge's own lines are far shorter (a notice names its refusals briefly).
const OWN_LINE_MOST: u64 = 1 << 20;

/// How much of an over-long line's head is read to see whether it names a reserved id.
const OWN_HEAD: u64 = 256;

/// An inbox file the judge keeps open.
#[derive(Debug)]
pub(super) struct OpenInbox {
    pub(super) file: File,
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) used: u64,
}

impl Judge {
    /// The inbox now at `name`'s path, with its metadata, draining the file the judge had open
    /// there when it was replaced or deleted since. The file already open is reused when the
    /// path still names it.
    pub(super) fn current_file(
        &mut self,
        name: &str,
        now: DateTime<Utc>,
        held: &mut HeldLines,
        stats: &mut CatchUp,
    ) -> Result<Option<(File, std::fs::Metadata)>> {
        let path = self.bridge.inbox_path(name)?;
        let meta_at_path = match std::fs::symlink_metadata(&path) {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io("stat inbox", &path)(e)),
        };
        let at_path = meta_at_path.as_ref().map(|meta| (meta.dev(), meta.ino()));
        if let Some(open) = self.files.remove(name) {
            if at_path == Some((open.dev, open.ino)) {
                // The same inode: what the path says of it is what the open file would.
                if let Some(meta) = meta_at_path {
                    return Ok(Some((open.file, meta)));
                }
            }
            if let Err(e) = self.drain(name, &open, now, held, stats) {
                // Keep the old file: the next sweep, or a stopping judge, drains the rest.
                self.files.insert(name.to_owned(), open);
                return Err(e);
            }
        }
        if at_path.is_none() {
            // Deleted or renamed: no station from now on (the stations are the inbox
            // files), as for a judge that starts after it.
            if self.inbox_names.contains(name) {
                self.refresh_registry()?;
            }
            return Ok(None);
        }
        let file = match open_inbox(&path, false) {
            Ok(file) => file,
            Err(Error::NotRegularFile { path }) => {
                tracing::warn!(path = %path.display(), "refusing an inbox that is not a regular file");
                return Ok(None);
            }
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                // Gone: nothing waits for what it held any more.
                if self.unreadable.remove(name) {
                    self.readable_again = true;
                }
                return Ok(None);
            }
            // One unreadable inbox (its mode) never stops the others: said once, skipped
            // until it can be read again, nothing of it judged meanwhile.
            Err(Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                if self.unreadable.insert(name.to_owned()) {
                    tracing::warn!(path = %path.display(), error = %source, "cannot read this inbox: skipping it, every other inbox is judged");
                }
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if self.unreadable.remove(name) {
            tracing::warn!(path = %path.display(), "the inbox can be read again: judging it");
            self.readable_again = true;
        }
        let meta = file.metadata().map_err(Error::io("stat inbox", &path))?;
        Ok(Some((file, meta)))
    }

    /// Read a replaced or deleted inbox's old file to its end, as its own generation.
    pub(super) fn drain(
        &mut self,
        name: &str,
        old: &OpenInbox,
        now: DateTime<Utc>,
        held: &mut HeldLines,
        stats: &mut CatchUp,
    ) -> Result<()> {
        let Some(journal) = self.snapshot.inboxes.get(name) else {
            return Ok(());
        };
        if (journal.dev, journal.ino) != (old.dev, old.ino) {
            return Ok(());
        }
        tracing::warn!(
            inbox = name,
            gen = journal.gen,
            "inbox was replaced or deleted: draining the old file first"
        );
        let gen = journal.gen;
        self.read_lines(name, gen, &old.file, None, None, false, now, held, stats)?;
        Ok(())
    }

    /// Read one inbox from where judging stopped to its end, or about `budget` bytes of it
    /// (at least one line) from where its last round in this sweep stopped reading. Returns
    /// whether the budget stopped it before the end.
    pub(super) fn sweep_one(
        &mut self,
        name: &str,
        now: DateTime<Utc>,
        budget: Option<u64>,
        held: &mut HeldLines,
        stats: &mut CatchUp,
    ) -> Result<bool> {
        let Some((file, meta)) = self.current_file(name, now, held, stats)? else {
            return Ok(false);
        };
        if let Some(other) = self.snapshot.same_file_as_another(name, &file, &meta) {
            if self.doubles.insert(name.to_owned()) {
                tracing::warn!(
                    inbox = name,
                    of = %other,
                    "this inbox is {other}'s file under another name (a hard link, or {other}'s inbox renamed): its lines were judged as {other}'s and are not judged again; rename it back, or give the new agent an inbox of its own"
                );
            }
            // A line written under this name is in `other`'s file: judged as `other`'s, now
            // (the change is said under this name only). `other` is known to the journal, so
            // it is never a double itself.
            return self.sweep_one(&other, now, budget, held, stats);
        }
        // Whatever goes wrong (a stop, a failed write), the file stays open: if it is replaced
        // before the next sweep, its unread lines can still be drained.
        let known_gen = self.snapshot.inboxes.get(name).map(|known| known.gen);
        let size = meta.len();
        let mut stopped = false;
        let read = self
            .check_generation(name, &file, &meta, held, now, stats)
            .and_then(|gen| {
                let Some(budget) = budget else {
                    let end = self.read_lines(
                        name,
                        gen,
                        &file,
                        None,
                        Some(size),
                        false,
                        now,
                        held,
                        stats,
                    )?;
                    return Ok((gen, end));
                };
                // A round goes on from where this inbox's last round stopped, not from where
                // judging stopped: a held line keeps `judged_to` behind it.
                let judged_to = self.snapshot.inboxes[name].judged_to;
                let start = held
                    .read_to
                    .get(name)
                    .filter(|(read_gen, _)| *read_gen == gen)
                    .map_or(judged_to, |&(_, at)| at.max(judged_to));
                let mut room = budget;
                let end = loop {
                    let until = start.saturating_add(room);
                    stopped = until < size;
                    let end = self.read_lines(
                        name,
                        gen,
                        &file,
                        Some(start),
                        Some(if stopped { until } else { size }),
                        stopped,
                        now,
                        held,
                        stats,
                    )?;
                    if !stopped || end > start {
                        break end;
                    }
                    // One line (or run of blank lines) longer than the room: a larger one.
                    room = room.saturating_mul(2);
                };
                held.read_to.insert(name.to_owned(), (gen, end));
                Ok((gen, end))
            });
        let (gen, end) = match read {
            Ok(read) => read,
            Err(e) => {
                self.keep_open(name, file, &meta);
                return Err(e);
            }
        };
        // The head the generation check just read and matched, when it is this generation's:
        // the new mark reads only the bytes before its offset.
        let known = &self.snapshot.inboxes[name];
        let verified = known
            .mark
            .filter(|_| known_gen == Some(gen))
            .map(|(_, marker)| marker.head());
        let marked = known.mark.map(|(offset, _)| offset);
        if end > 0 && marked != Some(end) {
            let path = self.bridge.inbox_path(name)?;
            let now_marker = Marker::of_with_head(&file, end, verified);
            if let Some(marker) = now_marker.map_err(Error::io("read inbox", &path))? {
                self.mark(name, gen, end, &meta, Some(marker), now)?;
            }
        }
        self.keep_open(name, file, &meta);
        Ok(stopped)
    }

    pub(super) fn keep_open(&mut self, name: &str, file: File, meta: &std::fs::Metadata) {
        self.uses += 1;
        if self.files.len() >= OPEN_FILES && !self.files.contains_key(name) {
            if let Some(oldest) = self
                .files
                .iter()
                .min_by_key(|(_, f)| f.used)
                .map(|(n, _)| n.clone())
            {
                self.files.remove(&oldest);
            }
        }
        self.files.insert(
            name.to_owned(),
            OpenInbox {
                file,
                dev: meta.dev(),
                ino: meta.ino(),
                used: self.uses,
            },
        );
    }

    /// Judge the complete lines of `file` from where judging stopped in generation `gen` (or
    /// from `from`, when that is further: a later round of one sweep), up to `size` when its
    /// size was just seen. Returns where the last complete line ends,
    /// or, with `round`, where a run of lines that name nobody that reaches `size` starts: a
    /// round that stops inside the run leaves it to be judged whole, as one fragment.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_lines(
        &mut self,
        name: &str,
        gen: u32,
        file: &File,
        from: Option<u64>,
        size: Option<u64>,
        round: bool,
        now: DateTime<Utc>,
        held: &mut HeldLines,
        stats: &mut CatchUp,
    ) -> Result<u64> {
        let judged_to = self.snapshot.inboxes[name].judged_to;
        let start = from.map_or(judged_to, |from| from.max(judged_to));
        // The verdicts journaled past where judging stopped that this read can meet: those
        // from `start` on, and the one before it (a blank run `start` may lie inside). A
        // later round starts past a held line, and all the inbox's verdicts since lie behind.
        let known = &self.snapshot.inboxes[name].judged_beyond;
        let beyond: std::collections::BTreeMap<u64, u64> = known
            .range(..start)
            .next_back()
            .into_iter()
            .chain(known.range(start..))
            .map(|(&offset, &span)| (offset, span))
            .collect();
        // Lines already held in this sweep are read again, not judged again.
        let holding = held.offsets_in(name, gen);
        let mut reader = std::mem::replace(&mut self.reader, LineReader::new(0));
        let interrupt = Arc::clone(&self.interrupt);
        // A run of lines that name nobody (blank lines, `1`, `{}`) is one refused fragment,
        // one record: a megabyte of newlines must not become hundreds of megabytes of
        // journal, refused log and index.
        let mut run: Option<Unnamed> = None;
        let limits = self.limits;
        let sharing = self.sharing;
        let result = reader.read_batches_until(file, start, size, |lines| {
            halves::judge_batch(lines, name, &limits, sharing, |line, mut parsed| {
                let line = line.clone();
                if interrupt.load(Ordering::Relaxed) {
                    return Err(Error::Interrupted);
                }
                if let Line::Complete { offset, bytes } = &line {
                    if !covered(&beyond, *offset) && !holding.contains(offset) {
                        let nameless = Unnamed::refused(bytes, &mut parsed, name, limits)
                            .filter(|_| !held.takes_turn(name, gen, *offset));
                        if let Some(nameless) = nameless {
                            let before = Unnamed::join(&mut run, *offset, bytes, nameless);
                            return self.refuse_unnamed(name, gen, before, now, stats);
                        }
                    }
                }
                self.refuse_unnamed(name, gen, run.take(), now, stats)?;
                if covered(&beyond, line.offset()) || holding.contains(&line.offset()) {
                    return Ok(());
                }
                match line {
                    Line::TooLong { offset, len } => {
                        // The judge's own notices, rings and report notes can be longer than a
                        // small `max_line_bytes`: it wrote them, so it reads them back whole.
                        // Refusing one would leave its intent open, and every restart would write
                        // it again, never delivered.
                        if let Some(own) = self.own_line_at(name, file, offset, len)? {
                            return self.judge_complete(
                                name,
                                gen,
                                offset,
                                &own,
                                None,
                                now,
                                Some(held),
                                stats,
                            );
                        }
                        let refusal = Refusal::new(
                            RefusalReason::LineTooLong,
                            format!("{len} bytes, the limit is {}", self.limits.max_line_bytes),
                        );
                        // Its sender is told: who it is, its first bytes say.
                        let identity = Some(identity_of(&line_head(file, offset, len)));
                        self.record(
                            name,
                            gen,
                            offset,
                            len + 1,
                            Bytes::Unknown,
                            &Verdict::Refused(refusal),
                            identity,
                            None,
                            now,
                            stats,
                        )
                    }
                    Line::Complete { offset, bytes } => self.judge_complete(
                        name,
                        gen,
                        offset,
                        bytes,
                        parsed,
                        now,
                        Some(held),
                        stats,
                    ),
                }
            })
        });
        self.reader = reader;
        let end = result?;
        if let Some(run) = run.as_ref().filter(|run| round && run.end == end) {
            debug_assert!(run.start < run.end);
            return Ok(run.start);
        }
        self.refuse_unnamed(name, gen, run, now, stats)?;
        Ok(end)
    }

    /// The bytes of the over-long line at `offset` when it is the judge's own (see
    /// [`Judge::is_own_line`]). Only a line of a size the judge writes, whose head names a
    /// reserved id (no one else may use one), or of the length of a line it means to write
    /// here, is read whole to check it.
    pub(super) fn own_line_at(
        &self,
        name: &str,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>> {
        let read = |len: u64| -> Result<Option<Vec<u8>>> {
            let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
            match std::os::unix::fs::FileExt::read_exact_at(file, &mut bytes, offset) {
                Ok(()) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
                Err(e) => Err(Error::io("read inbox", name)(e)),
            }
        };
        let intended = self
            .snapshot
            .intents
            .values()
            .any(|i| i.inbox == name && i.line.len() as u64 == len);
        if !intended {
            if len > OWN_LINE_MOST {
                return Ok(None);
            }
            let Some(head) = read(len.min(OWN_HEAD))? else {
                return Ok(None);
            };
            if !names_reserved_id(&head) {
                return Ok(None);
            }
        }
        let Some(bytes) = read(len)? else {
            return Ok(None);
        };
        Ok(self.is_own_line(name, &bytes).then_some(bytes))
    }

    /// Make sure the journal's view of the inbox belongs to this very file; start a new
    /// generation when it was truncated, replaced or recreated. `held`: the lines this sweep
    /// holds (one read from the generation the journal knows ties the file to it).
    pub(super) fn check_generation(
        &mut self,
        name: &str,
        file: &File,
        meta: &std::fs::Metadata,
        held: &HeldLines,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<u32> {
        let known = self.snapshot.inboxes.get(name);
        let Some(known) = known else {
            self.mark(name, 0, 0, meta, None, now)?;
            return Ok(0);
        };
        let resume = known
            .judged_to
            .max(known.mark.map_or(0, |(offset, _)| offset));
        let moved = (known.dev, known.ino) != (meta.dev(), meta.ino());
        // A generation nothing was judged, marked or held from yet names no line: a file
        // under a new inode goes on as it, all of it still to be read. A new generation would
        // only renumber it: the numbers that key the refusals and notices would then differ
        // from a judge's that reads the same files afresh (after losing its journal).
        let untouched = resume == 0 && known.mark.is_none() && known.judged_beyond.is_empty();
        if moved && untouched && !held.any_from(name, known.gen) {
            let gen = known.gen;
            tracing::info!(
                inbox = name,
                "an inbox with nothing judged yet has a new inode: reading it from the start"
            );
            self.mark(name, gen, 0, meta, None, now)?;
            return Ok(gen);
        }
        // An inbox is known by its bytes: the marker of what was judged. A file with those
        // bytes under a new inode (a copy, a restore, a move to another disk) is the same
        // inbox. Without a marker (the record that carried it was lost) the last line
        // accepted says it, found whole at its offset by its fingerprint, with every line
        // judged after it found by the hash of its bytes: bytes judged and not compared
        // would be taken for the same unseen. Without either only the inode can say (and a
        // freed inode's number may come back as another file's).
        //
        // The lines judged since the last line accepted, found again where they were (see
        // `holds_lines`); `None` when they cannot be.
        let judged_since = || {
            known
                .last_line
                .filter(|line| {
                    line.end == known.judged_to
                        && line.knows_what_follows()
                        && known.judged_beyond.is_empty()
                })
                .and_then(|line| self.holds_lines(file, line))
        };
        // A mark behind where judging stands (the newest mark lost with the journal's last
        // records, or a sweep stopped before it marked) knows the bytes up to itself only:
        // the lines judged since, when they can be found, must be there too (a file restored
        // with another message after the older mark would have it passed over as judged).
        let same = meta.len() >= resume
            && match known.mark {
                Some((offset, marker)) => {
                    marker.matches(file, offset).unwrap_or(false)
                        && (offset >= known.judged_to || judged_since().unwrap_or(true))
                }
                None => judged_since().unwrap_or(!moved),
            };
        if same && moved {
            let (gen, mark, last_line) = (known.gen, known.mark, known.last_line);
            tracing::warn!(
                inbox = name,
                "inbox has a new inode but the same bytes (copied, restored or moved): it is the same inbox"
            );
            let (offset, marker) = match (mark, last_line) {
                (Some((offset, marker)), _) => (offset, Some(marker)),
                // Marked at the end of the lines that told, so that the next look has bytes
                // to know them by.
                (None, Some(line)) => {
                    let marker =
                        Marker::of(file, line.end).map_err(Error::io("read inbox", name))?;
                    (line.end, marker)
                }
                (None, None) => (0, None),
            };
            self.mark(name, gen, offset, meta, marker, now)?;
            return Ok(gen);
        }
        if same {
            return Ok(known.gen);
        }
        let gen = known.gen + 1;
        tracing::warn!(
            inbox = name,
            gen,
            old_offset = resume,
            size = meta.len(),
            "inbox was truncated, replaced or recreated: reading it from the start as a new generation"
        );
        stats.new_generations += 1;
        // What its reader had not read of the file replaced: a copy of it here is shown.
        // The reader's turn is held until the mark is in the journal: a reader that takes it
        // next sees the new generation, and prints nothing more of the file replaced.
        // A reader whose cursor is as it was when the file replaced began read none of it:
        // what it had not read then is still unread, and all of that file (a restored copy
        // after a file in between, or an inbox renamed back after one).
        let settled = crate::cursor::settled_place(&self.bridge, name);
        let cursor = settled.as_ref().map(|s| s.cursor);
        let unread_from = match settled.as_ref().map(|s| s.place) {
            Some(_) if known.gen > 0 && cursor.is_some() && cursor == known.reader_cursor => {
                known.unread_from.map(|unread| unread.carried(known.gen))
            }
            Some(None) => Some(Unread::All),
            Some(Some((dev, ino, offset))) if (dev, ino) == (known.dev, known.ino) => {
                Some(Unread::From(offset))
            }
            Some(Some(_)) | None => None,
        };
        let mut record = Record::new(name, gen, 0, Word::Mark, now.timestamp_millis());
        record.unread_from = unread_from;
        record.reader_cursor = cursor;
        self.mark_record(record, meta)?;
        if settled.is_some() {
            self.journal.flush()?;
        }
        drop(settled);
        Ok(gen)
    }

    /// Whether `file` holds the lines `line` knows where they were: the accepted line whole,
    /// with the same fingerprint, then lines whose bytes hash to the same chain, ending
    /// where it ends. `None` when that cannot be told: more bytes than are read back for it
    /// (lengths are not judged again, only bounded: the judge's own lines may be longer
    /// than the limit, and the limit may have changed since), or a failed read.
    fn holds_lines(&self, file: &File, line: LastLine) -> Option<bool> {
        // From the byte before it, which must end the line before.
        let start = line.offset.saturating_sub(1);
        let most = (self.limits.max_line_bytes as u64).max(OWN_LINE_MOST) * 2;
        let accepted_end = line.offset.checked_add(line.span)?;
        let len = Some(line.end)
            .filter(|end| accepted_end <= *end)
            .map(|end| end - start)
            .filter(|len| *len <= most)?;
        let mut bytes = vec![0u8; usize::try_from(len).ok()?];
        if let Err(e) = std::os::unix::fs::FileExt::read_exact_at(file, &mut bytes, start) {
            // A file shorter than the lines is not the file they were in.
            return (e.kind() == std::io::ErrorKind::UnexpectedEof).then_some(false);
        }
        Some(Self::are_the_lines(&bytes, line))
    }

    /// Whether `bytes`, read from the byte before `line`'s offset (or from 0) to its end,
    /// are the lines it knows.
    fn are_the_lines(bytes: &[u8], line: LastLine) -> bool {
        let bytes = match bytes.split_first() {
            Some((b'\n', rest)) if line.offset > 0 => rest,
            _ if line.offset == 0 => bytes,
            _ => return false,
        };
        let Some((accepted, after)) = usize::try_from(line.span)
            .ok()
            .and_then(|span| bytes.split_at_checked(span))
        else {
            return false;
        };
        let Some(text) = accepted.strip_suffix(b"\n") else {
            return false;
        };
        let unlimited = doorbell_core::Limits {
            max_line_bytes: usize::MAX,
        };
        let fingerprint = doorbell_core::judge_stateless(text, None, &unlimited)
            .is_ok_and(|envelope| envelope.fingerprint == line.fingerprint);
        if !fingerprint || !(after.is_empty() || after.ends_with(b"\n")) {
            return false;
        }
        let chain = after
            .split_inclusive(|&b| b == b'\n')
            .map(|l| xxhash_rust::xxh3::xxh3_64(&l[..l.len() - 1]))
            .fold(0, LastLine::chained);
        chain == line.chain
    }

    pub(super) fn mark(
        &mut self,
        name: &str,
        gen: u32,
        offset: u64,
        meta: &std::fs::Metadata,
        marker: Option<Marker>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut record = Record::new(name, gen, offset, Word::Mark, now.timestamp_millis());
        record.marker = marker;
        self.mark_record(record, meta)
    }

    /// Journal and apply the mark `record`, of the file `meta` describes.
    fn mark_record(&mut self, mut record: Record, meta: &std::fs::Metadata) -> Result<()> {
        record.dev = Some(meta.dev());
        record.ino = Some(meta.ino());
        self.journal.append(&record)?;
        self.snapshot.apply(record);
        Ok(())
    }
}

/// How much of a line over the limit is read to find who sent it.
const HEAD_OF_LONG_LINE: u64 = 64 << 10;

/// The first bytes of the line of `len` bytes at `offset` (none when they cannot be read).
fn line_head(file: &File, offset: u64, len: u64) -> Vec<u8> {
    let mut head = vec![0; usize::try_from(len.min(HEAD_OF_LONG_LINE)).unwrap_or(0)];
    match std::os::unix::fs::FileExt::read_exact_at(file, &mut head, offset) {
        Ok(()) => head,
        Err(_) => Vec::new(),
    }
}
