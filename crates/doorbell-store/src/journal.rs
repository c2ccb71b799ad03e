//! The verdict journal, `.doorbell/journal.jsonl`: one record per judged line (inbox, file
//! generation, offset, length, verdict, reason, the judge's `seenAt`), plus `mark` records
//! that say which file and which bytes a position belongs to.
//!
//! Invariant: a verdict is journaled before anything acts on it, and a journaled line is
//! never judged again. Accepted records carry what the ledger needs, so replaying the journal
//! rebuilds the ledger without the inbox files. Only the judge (the lock holder) appends;
//! anyone may read. A torn last record is ignored by readers and cut off by the next judge.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use doorbell_core::debts::Due;
use doorbell_core::notice::{refusal_key, RefusedLine};
use doorbell_core::{Accepted, Ledger, RefusalReason};
use serde::{Deserialize, Serialize};

use crate::fault::Guarded;
use crate::hash::Marker;
use crate::index::{Changes, Index, IndexArchive, MessageRow, OtherRow, Timing};
use crate::reader::{Line, LineReader};
use crate::{Bridge, Error, Result};

pub const JOURNAL_FILE: &str = "journal.jsonl";

/// What a journal record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Word {
    #[serde(rename = "a")]
    Accepted,
    #[serde(rename = "d")]
    Duplicate,
    #[serde(rename = "r")]
    Refused,
    /// Not a verdict: the inbox's identity at an offset (its device, inode and marker).
    #[serde(rename = "m")]
    Mark,
    /// Not a verdict: the judge is about to write a line of its own (a notice). Journaled
    /// before the write, so a restart knows the id is the judge's and writes it at most once.
    #[serde(rename = "i")]
    Intent,
}

/// The version of [`Record`] this doorbell writes. A record says its version only when it is
/// not 1 (the first), so the one record per message stays short; a record of a version this
/// doorbell does not know is an error, never half read.
pub const RECORD_VERSION: u32 = 1;

fn first_version() -> u32 {
    1
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_first_version(version: &u32) -> bool {
    *version == 1
}

fn known_version<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u32, D::Error> {
    let version = u32::deserialize(d)?;
    if version > RECORD_VERSION {
        return Err(serde::de::Error::custom(format!(
            "a journal record of version {version}, written by a newer doorbell (this one reads up to {RECORD_VERSION})"
        )));
    }
    Ok(version)
}

/// One journal line: the journal's one entry type, read and written only through this (the
/// encoder in `journal_json.rs` writes the common shapes of it byte for byte as `serde_json`
/// would). Keys are short because there is one record per message; `doorbell show` and
/// `--json` outputs spell things out for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    #[serde(
        rename = "ver",
        default = "first_version",
        skip_serializing_if = "is_first_version",
        deserialize_with = "known_version"
    )]
    pub version: u32,
    #[serde(rename = "in")]
    pub inbox: String,
    #[serde(rename = "g", default, skip_serializing_if = "is_zero")]
    pub gen: u32,
    #[serde(rename = "o")]
    pub offset: u64,
    /// The line's length in the file, its `\n` included (0 for a mark).
    #[serde(rename = "n", default, skip_serializing_if = "is_zero")]
    pub span: u64,
    #[serde(rename = "v")]
    pub verdict: Word,
    /// The judge's clock, milliseconds since the epoch.
    #[serde(rename = "t")]
    pub seen_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The line's id, when it had a readable one (refused and duplicate lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    pub line: Option<Accepted>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ino: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<Marker>,
    /// A refused line whose sender is a station and must hear of it.
    #[serde(rename = "tell", default, skip_serializing_if = "std::ops::Not::not")]
    pub tell: bool,
    /// An intent's line, exactly as it will be written to `inbox`.
    #[serde(rename = "w", default, skip_serializing_if = "Option::is_none")]
    pub write: Option<String>,
    /// The refusals an intent's notice names, as `inbox/gen/offset` keys.
    #[serde(rename = "cv", default, skip_serializing_if = "Vec::is_empty")]
    pub covers: Vec<String>,
    /// A ring or escalation intent: which request, epoch and ring (0: the escalation).
    #[serde(rename = "rg", default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<RingRef>,
    /// A new generation's mark: what its reader had not read of the files before (none when
    /// its place there is unknown).
    #[serde(rename = "rd", default, skip_serializing_if = "Option::is_none")]
    pub unread_from: Option<Unread>,
    /// A new generation's mark: a hash of its reader's cursor as it was then (see
    /// [`crate::cursor::Settled::cursor`]). The same cursor when the next file replaces
    /// this one says that the reader read none of this one.
    #[serde(rename = "rc", default, skip_serializing_if = "Option::is_none")]
    pub reader_cursor: Option<u64>,
    /// A verdict on a line that carries no fingerprint (refused, duplicate, or shown
    /// again): the xxh3 of its bytes, its `\n` not included. It knows the line again at its
    /// offset when the mark after it was lost (see [`InboxJournal::last_line`]).
    #[serde(rename = "h", default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<u64>,
    /// A run of lines that name nobody refused as one (see the judge's `unnamed`): how many
    /// lines it holds. Its `hash` folds theirs in order, as [`LastLine::chained`] does.
    #[serde(rename = "l", default, skip_serializing_if = "at_most_one")]
    pub lines: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
fn at_most_one(n: &u64) -> bool {
    *n <= 1
}

/// What an inbox's reader had not read when a new file replaced the inbox's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unread {
    /// Nothing: the reader has no cursor.
    #[serde(rename = "all")]
    All,
    /// The file replaced from this offset on (the files before it were read).
    #[serde(rename = "from")]
    From(u64),
    /// Generation `.0` from offset `.1` on, and every file after it: the reader read none
    /// of the files that replaced that one before this.
    #[serde(rename = "since")]
    Since(u32, u64),
}

impl Unread {
    /// Whether the line at `offset` of generation `gen` was still unread when generation
    /// `now` began.
    #[must_use]
    pub fn holds(self, gen: u32, offset: u64, now: u32) -> bool {
        match self {
            Unread::All => gen < now,
            Unread::From(from) => gen.checked_add(1) == Some(now) && offset >= from,
            Unread::Since(since, from) => {
                (gen == since && offset >= from) || (gen > since && gen < now)
            }
        }
    }

    /// Whether the reader had passed the line at `offset` of generation `gen` when
    /// generation `now` began: known only for the file its cursor was in.
    #[must_use]
    pub fn read_before(self, gen: u32, offset: u64, now: u32) -> bool {
        match self {
            Unread::All => false,
            Unread::From(from) => gen.checked_add(1) == Some(now) && offset < from,
            Unread::Since(since, from) => gen == since && offset < from,
        }
    }

    /// What is still unread when the file of generation `now` (begun with `self`) is
    /// replaced in turn, the reader having read none of it.
    #[must_use]
    pub fn carried(self, now: u32) -> Unread {
        match self {
            Unread::From(from) => Unread::Since(now.saturating_sub(1), from),
            other => other,
        }
    }
}

/// What a ring intent is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingRef {
    #[serde(rename = "rq")]
    pub request: String,
    #[serde(rename = "ep")]
    pub epoch: u32,
    /// The ring's number, from 1; 0 for the escalation.
    #[serde(rename = "n")]
    pub ring: u32,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl Record {
    /// A record with only the common fields set.
    #[must_use]
    pub fn new(inbox: &str, gen: u32, offset: u64, verdict: Word, seen_at: i64) -> Record {
        Record {
            version: RECORD_VERSION,
            inbox: inbox.to_owned(),
            gen,
            offset,
            span: 0,
            verdict,
            seen_at,
            reason: None,
            detail: None,
            id: None,
            from: None,
            line: None,
            dev: None,
            ino: None,
            marker: None,
            tell: false,
            write: None,
            covers: Vec::new(),
            ring: None,
            unread_from: None,
            reader_cursor: None,
            hash: None,
            lines: 0,
        }
    }

    #[must_use]
    pub fn seen_at(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.seen_at).unwrap_or_default()
    }
}

/// What the journal knows of one inbox: its current generation, which file it is and how far
/// it is judged. Which lines were not accepted is in the index (and, for the journal's
/// unsaved tail, in the snapshot), never here: this stays a few hundred bytes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct InboxJournal {
    pub gen: u32,
    pub dev: u64,
    pub ino: u64,
    /// The last mark: an offset and the marker of the bytes before it.
    pub mark: Option<(u64, Marker)>,
    /// Every line before this offset has a verdict: where judging resumes.
    pub judged_to: u64,
    /// Lines past `judged_to` that already have a verdict (judged out of order): offset to
    /// span.
    pub judged_beyond: BTreeMap<u64, u64>,
    /// When the judge last accepted a line here from a station, not from a built-in loop
    /// (milliseconds since the epoch).
    #[serde(default)]
    pub last_accepted_at: i64,
    /// When this generation began (milliseconds since the epoch; 0 for the first, or one
    /// journaled before this was kept).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub since: i64,
    /// The files of the last few generations before this one, each with its last mark:
    /// a hard link that outlives a replacement still holds one, and is known by it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<EarlierFile>,
    /// From where the file this generation replaced was still unread by the inbox's reader
    /// (see [`Record::unread_from`]): a copy here of an accepted line from there is shown to
    /// the reader once, not hidden as a duplicate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread_from: Option<Unread>,
    /// The ids of those copies shown so far in this generation.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub redelivered: BTreeSet<String>,
    /// Its reader's cursor when this generation began (see [`Record::reader_cursor`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader_cursor: Option<u64>,
    /// The last line accepted in this generation and the lines judged after it, as far as
    /// each can be known again. When a lost record took the generation's marked bytes with
    /// it, these lines, found again where they were, are what still says which bytes were
    /// judged (see the judge's generation check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_line: Option<LastLine>,
}

/// The last accepted line of a generation (where it is, and its fingerprint, which hashes
/// its id), and the lines judged one after another behind it, up to `end`: `chain` hashes
/// the hashes of their bytes, in order. An accepted line alone cannot be taken for another
/// file's, a refused one can (`{}` is in many files); behind an accepted line, it cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastLine {
    pub offset: u64,
    pub span: u64,
    #[serde(default)]
    pub fingerprint: u64,
    #[serde(default)]
    pub end: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chain: u64,
    /// A line behind it cannot be known again (an over-long line, a verdict out of the
    /// inbox's order): nothing after the accepted line is evidence.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub broken: bool,
    /// `chain` folds the lines' hashes as [`LastLine::chained`] does now. A chain made
    /// before (another fold, which a run of lines judged as one could not follow) is no
    /// evidence past the accepted line.
    #[serde(rename = "folded", default)]
    pub folded: bool,
}

/// The multiplier of the chain's fold: odd, so that no line's hash is lost from it.
const FOLD: u64 = 0x9E37_79B9_7F4A_7C15;

impl LastLine {
    /// The chain of hashes `chain`, with the line whose bytes hash to `hash` after it. A
    /// polynomial fold, so that a run of lines judged as one can carry its own lines' fold
    /// ([`LastLine::chained_run`]) and extend a chain as they would one by one.
    #[must_use]
    pub fn chained(chain: u64, hash: u64) -> u64 {
        chain.wrapping_mul(FOLD).wrapping_add(hash)
    }

    /// The chain `chain` with a run of `lines` lines after it whose own fold, from 0, is
    /// `hash`.
    #[must_use]
    pub fn chained_run(chain: u64, hash: u64, lines: u64) -> u64 {
        let mut power = 1u64;
        let (mut base, mut exponent) = (FOLD, lines);
        while exponent > 0 {
            if exponent & 1 == 1 {
                power = power.wrapping_mul(base);
            }
            base = base.wrapping_mul(base);
            exponent >>= 1;
        }
        chain.wrapping_mul(power).wrapping_add(hash)
    }

    /// Whether the lines after the accepted one can be told by `chain`.
    #[must_use]
    pub fn knows_what_follows(&self) -> bool {
        !self.broken && (self.folded || self.end == self.offset.saturating_add(self.span))
    }

    /// Apply the verdict on the line at `offset` (`span` bytes): an accepted one's
    /// `fingerprint`, or the `hash` of another's bytes (of its `lines` lines' fold, for a
    /// run judged as one).
    fn after(
        last: &mut Option<LastLine>,
        offset: u64,
        span: u64,
        fingerprint: Option<u64>,
        hash: Option<u64>,
        lines: u64,
    ) {
        if let Some(fingerprint) = fingerprint {
            if last.is_none_or(|l| l.offset < offset) {
                *last = Some(LastLine {
                    offset,
                    span,
                    fingerprint,
                    end: offset.saturating_add(span),
                    chain: 0,
                    broken: false,
                    folded: true,
                });
            }
            return;
        }
        let Some(line) = last.as_mut().filter(|l| l.offset < offset) else {
            return;
        };
        match hash {
            Some(hash) if line.knows_what_follows() && offset == line.end => {
                line.chain = LastLine::chained_run(line.chain, hash, lines.max(1));
                line.end = offset.saturating_add(span);
                line.folded = true;
            }
            _ => line.broken = true,
        }
    }
}

/// A file an inbox had in an earlier generation: which file, and its last mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EarlierFile {
    pub dev: u64,
    pub ino: u64,
    pub offset: u64,
    pub marker: Marker,
}

/// The most copies shown again in one generation: what the inbox's row in the index carries
/// stays small (past it, copies are duplicates, as before a rewrite was looked into).
pub const MAX_SHOWN_AGAIN: usize = 1000;

/// How many earlier files an inbox remembers.
const EARLIER_FILES: usize = 4;

impl InboxJournal {
    fn add(&mut self, offset: u64, span: u64) {
        if offset == self.judged_to {
            self.judged_to += span;
            while let Some(span) = self.judged_beyond.remove(&self.judged_to) {
                self.judged_to += span;
            }
        } else if offset > self.judged_to {
            self.judged_beyond.insert(offset, span);
        }
    }

    fn new_generation(&mut self, gen: u32, dev: u64, ino: u64, since: i64) {
        let mut earlier = std::mem::take(&mut self.earlier);
        if let Some((offset, marker)) = self.mark {
            earlier.push(EarlierFile {
                dev: self.dev,
                ino: self.ino,
                offset,
                marker,
            });
            if earlier.len() > EARLIER_FILES {
                earlier.remove(0);
            }
        }
        *self = InboxJournal {
            gen,
            dev,
            ino,
            last_accepted_at: self.last_accepted_at,
            since,
            earlier,
            ..InboxJournal::default()
        };
    }

    /// Whether `file` is this inbox's file, now or in one of its last generations: the same
    /// device and inode, and the same bytes before a mark.
    fn holds(&self, file: &File, meta: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        let same = |dev: u64, ino: u64, offset: u64, marker: &Marker| {
            (dev, ino) == (meta.dev(), meta.ino())
                && meta.len() >= offset
                && marker.matches(file, offset).unwrap_or(false)
        };
        self.mark
            .is_some_and(|(offset, marker)| same(self.dev, self.ino, offset, &marker))
            || self
                .earlier
                .iter()
                .any(|e| same(e.dev, e.ino, e.offset, &e.marker))
    }

    /// Apply a mark or a verdict about this inbox. Returns whether it was a verdict of the
    /// current generation (a mark, or a stray verdict of another generation, is not).
    pub fn apply(&mut self, record: &Record) -> bool {
        match record.verdict {
            Word::Mark => {
                let (dev, ino) = (record.dev.unwrap_or(0), record.ino.unwrap_or(0));
                if record.gen != self.gen {
                    self.new_generation(record.gen, dev, ino, record.seen_at);
                    self.unread_from = record.unread_from;
                    self.reader_cursor = record.reader_cursor;
                } else if record.dev.is_some() {
                    // A mark says which file the generation is in now: its first marks, and
                    // a later one for the same bytes under a new inode (a copied or restored
                    // inbox). Verdicts already journaled (`judged_beyond`) stay.
                    self.dev = dev;
                    self.ino = ino;
                }
                if let Some(marker) = record.marker {
                    self.mark = Some((record.offset, marker));
                }
                false
            }
            Word::Intent => false,
            // A line of an earlier generation judged after the new one began (it was held
            // for its request, or waited for its turn, while the inbox was replaced): its
            // verdict stands (ledger, notices, index), where this generation stands does not
            // move.
            _ if record.gen < self.gen => true,
            // Verdicts always follow their generation's mark; a stray one is ignored.
            _ if record.gen != self.gen => false,
            verdict => {
                if verdict == Word::Accepted {
                    // A ring, a notice or a report note is no sign of life: a silent agent
                    // rung every hour must not look active.
                    let from = record.line.as_ref().map(|l| l.from.as_str());
                    if !from.is_some_and(|f| doorbell_core::BUILTIN_LOOPS.contains(&f)) {
                        self.last_accepted_at = record.seen_at;
                    }
                    // A copy of an unread line of the file replaced, shown again.
                    if let (None, Some(id)) = (&record.line, &record.id) {
                        self.redelivered.insert(id.clone());
                    }
                }
                LastLine::after(
                    &mut self.last_line,
                    record.offset,
                    record.span,
                    record.line.as_ref().map(|line| line.fingerprint),
                    record.hash,
                    record.lines,
                );
                self.add(record.offset, record.span);
                true
            }
        }
    }
}

/// A line the judge means to write: where, and exactly what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub inbox: String,
    pub line: String,
}

/// Everything the journal says, as memory holds it: the ledger's working set, each inbox's
/// position, the judge's pending side effects, and what changed since the index was last
/// saved. The rest of the history is in the index.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub ledger: Ledger,
    pub inboxes: BTreeMap<String, InboxJournal>,
    pub refused: BTreeMap<RefusalReason, u64>,
    /// Ids of lines the judge wrote or means to write since the last save, with the change
    /// set that added them; older ones are in the index.
    own_ids: HashMap<String, u64>,
    /// Intents whose line has not been seen in its inbox yet, by id.
    pub intents: BTreeMap<String, Intent>,
    /// Refusals whose sender has not been told yet, by `inbox/gen/offset`.
    pub untold: BTreeMap<String, RefusedLine>,
    /// Refusals a notice named before they were judged: a notice the journal lost, found
    /// by its seal ahead of the lines it names, which are being judged again. Empty but in a
    /// rebuild.
    told_ahead: BTreeSet<String>,
    /// The live journal segment (see `segments`), and where its last complete record ends.
    pub segment: u64,
    pub journal_len: u64,
    /// How many lines the journal accepted so far: the next one's `seq` (see `MessageRow`).
    pub accepted: u64,
    /// What the index's due times were computed with (`Timing::key`).
    pub timing: Option<String>,
    index: Option<Arc<Index>>,
    /// The live journal file a reader replayed to its end: where following it goes on.
    journal: Option<File>,
    pending: Pending,
    /// Rows of a change set the index has saved, filled again for the next ones: a catch-up
    /// spent a tenth of its judging on allocating and freeing them.
    spare_rows: Vec<MessageRow>,
}

/// What changed since the last save, for the next one.
#[derive(Debug, Default)]
#[allow(clippy::struct_excessive_bools)] // one "changed" flag per table of the open state
struct Pending {
    messages: Vec<MessageRow>,
    others: Vec<OtherRow>,
    /// Where each refusal of `others` is in it, by inbox and offset.
    refused_at: HashMap<(String, u64), Vec<usize>>,
    own: Vec<String>,
    inboxes: BTreeSet<String>,
    intents: bool,
    untold: bool,
    told_ahead: bool,
    refused: bool,
}

impl Snapshot {
    /// The state saved in `index` (nothing when there is none), to replay the journal onto.
    pub fn from_index(index: Option<Arc<Index>>) -> Result<Snapshot> {
        let Some(index) = index else {
            return Ok(Snapshot::default());
        };
        let open = index.open_state()?;
        Ok(Snapshot {
            ledger: Ledger::with_archive(Box::new(IndexArchive(Arc::clone(&index)))),
            inboxes: open.inboxes,
            refused: open.refused,
            intents: open.intents,
            untold: open.untold,
            told_ahead: open.told_ahead,
            segment: open.segment,
            journal_len: open.journal_len,
            accepted: open.accepted,
            timing: open.timing,
            index: Some(index),
            ..Snapshot::default()
        })
    }

    /// The index behind this snapshot, if any.
    #[must_use]
    pub fn index(&self) -> Option<&Arc<Index>> {
        self.index.as_ref()
    }

    /// For an inbox name never judged: the known inbox whose file this is, now or in one of
    /// its last generations (the same inode and the same judged bytes), a hard link to it or
    /// it renamed.
    #[must_use]
    pub fn same_file_as_another(
        &self,
        name: &str,
        file: &File,
        meta: &std::fs::Metadata,
    ) -> Option<String> {
        if self.inboxes.contains_key(name) {
            return None;
        }
        self.inboxes
            .iter()
            .find(|(other, known)| other.as_str() != name && known.holds(file, meta))
            .map(|(other, _)| other.clone())
    }

    /// Load the open requests of which `station` is a party into the ledger.
    pub fn load_open_requests_of(&mut self, station: &str) -> Result<()> {
        if let Some(index) = &self.index {
            let open = index.open_requests_of(station)?;
            self.ledger.load(open);
        }
        Ok(())
    }

    /// Bring every open request into memory (the judge needs them all to ring).
    pub fn load_open_requests(&mut self) -> Result<()> {
        if let Some(index) = &self.index {
            let open = index.open_requests()?;
            self.ledger.load(open);
        }
        Ok(())
    }

    /// Whether the judge wrote, or means to write, a line with this id.
    #[must_use]
    pub fn is_own(&self, id: &str) -> bool {
        if self.own_ids.contains_key(id) {
            return true;
        }
        match &self.index {
            Some(index) => index.is_own(id).unwrap_or_else(|error| {
                tracing::error!(%error, "could not read the index");
                false
            }),
            None => false,
        }
    }

    /// The offsets of lines not accepted in the journal's tail that this snapshot replayed
    /// (or judged) and has not saved, for `inbox`'s generation `gen`.
    pub fn unsaved_others(&self, inbox: &str, gen: u32) -> impl Iterator<Item = &OtherRow> + '_ {
        let inbox = inbox.to_owned();
        self.pending
            .others
            .iter()
            .filter(move |o| o.inbox == inbox && o.gen == gen)
    }

    /// Whether refusal `record` was made before, word for word: a line at the same place of
    /// an earlier generation of its inbox, as long, with the same id and sender, was refused
    /// for the same reason with the same detail. So it is when an inbox is restored from an
    /// older copy, or replaced by a copy of itself, and read again from its start: its sender
    /// was told then (or could not be), and a notice now would say the same again. A line
    /// without an id is never taken for an earlier one: a notice could not tell them apart.
    #[must_use]
    pub fn refused_before(&self, record: &Record) -> bool {
        if record.gen == 0 || record.id.is_none() {
            return false;
        }
        let same = |o: &OtherRow| {
            !o.duplicate
                && o.gen < record.gen
                && o.span == record.span
                && o.reason == record.reason
                && o.detail == record.detail
                && o.id == record.id
                && o.from == record.from
        };
        let unsaved = self
            .pending
            .refused_at
            .get(&(record.inbox.clone(), record.offset))
            .is_some_and(|at| at.iter().any(|&i| same(&self.pending.others[i])));
        unsaved
            || self.index.as_ref().is_some_and(|index| {
                index
                    .refused_before(&record.inbox, record.gen, record.offset)
                    .iter()
                    .any(same)
            })
    }

    /// How many judged lines wait for the next save.
    #[must_use]
    pub fn unsaved_lines(&self) -> usize {
        self.pending.messages.len() + self.pending.others.len()
    }

    /// Lines not accepted in the unsaved tail, in every inbox.
    pub fn unsaved_others_all(&self) -> impl Iterator<Item = &OtherRow> + '_ {
        self.pending.others.iter()
    }

    /// Accepted messages of the unsaved tail.
    /// Whether message `id`, a duplicate at generation `gen` of `inbox`, is a copy of a line
    /// accepted in an earlier file of `inbox` that its reader had not read when this one
    /// replaced it (see [`Unread`]), and not shown again yet: an unread message a rewrite of its inbox (`sed -i`,
    /// a line deleted before the cursor) must not hide.
    #[must_use]
    pub fn unread_copy(&self, inbox: &str, gen: u32, id: &str) -> bool {
        let Some(journal) = self.inboxes.get(inbox).filter(|j| j.gen == gen && gen > 0) else {
            return false;
        };
        let Some(unread) = journal.unread_from else {
            return false;
        };
        if journal.redelivered.len() >= MAX_SHOWN_AGAIN || journal.redelivered.contains(id) {
            return false;
        }
        let original = match self.unsaved_messages().find(|m| m.id == id) {
            Some(row) => Some(row.clone()),
            None => self.index().and_then(|index| index.placed(id)),
        };
        original.is_some_and(|row| row.inbox == inbox && unread.holds(row.gen, row.offset, gen))
    }

    pub fn unsaved_messages(&self) -> impl Iterator<Item = &MessageRow> + '_ {
        self.pending.messages.iter()
    }

    /// Everything that changed since the last call, to be saved in the index. Memory keeps
    /// what lookups need until [`Snapshot::saved`] says the index has it.
    pub fn take_changes(&mut self, timing: &Timing) -> Changes {
        let ledger = self.ledger.take_changes();
        let pending = std::mem::take(&mut self.pending);
        // The next set is about as large as this one.
        self.pending.messages = Vec::with_capacity(pending.messages.len());
        Changes {
            seq: ledger.seq,
            segment: self.segment,
            journal_len: self.journal_len,
            accepted: self.accepted,
            messages: pending.messages,
            others: pending.others,
            own: pending.own,
            requests: ledger.requests,
            inboxes: pending
                .inboxes
                .into_iter()
                .filter_map(|name| {
                    let inbox = self.inboxes.get(&name)?.clone();
                    Some((name, inbox))
                })
                .collect(),
            intents: pending.intents.then(|| self.intents.clone()),
            untold: pending.untold.then(|| self.untold.clone()),
            told_ahead: pending.told_ahead.then(|| self.told_ahead.clone()),
            refused: pending.refused.then(|| self.refused.clone()),
            timing: Some(timing.clone()),
        }
    }

    /// The rows of a change set the index has saved: the next sets are filled in them.
    pub fn recycle(&mut self, rows: Vec<MessageRow>) {
        if rows.len() > self.spare_rows.len() {
            self.spare_rows = rows;
        }
    }

    /// The index holds every change set up to `seq`: let go of what it holds.
    pub fn saved(&mut self, seq: u64) {
        let Some(index) = &self.index else {
            return;
        };
        // What leaves memory now must be found by the next lookup: it reads the new save.
        index.release();
        self.ledger.saved(seq);
        self.own_ids.retain(|_, touched| *touched > seq);
    }

    /// A line the judge means to write (or, found by its seal, wrote): its ring counts,
    /// the refusals it names are told, and its id is the judge's.
    fn apply_intent(&mut self, record: Record) {
        if let Some(ring) = &record.ring {
            let due = match ring.ring {
                0 => Due::Escalate,
                n => Due::Ring(n),
            };
            let at = DateTime::from_timestamp_millis(record.seen_at).unwrap_or_default();
            self.ledger.rang(&ring.request, ring.epoch, due, at);
        }
        if let (Some(id), None) = (&record.id, &record.write) {
            // A void intent: the line is never to be written.
            if self.intents.remove(id).is_some() {
                self.pending.intents = true;
            }
            return;
        }
        if let (Some(id), Some(line)) = (record.id, record.write) {
            for key in &record.covers {
                if self.untold.remove(key).is_some() {
                    self.pending.untold = true;
                } else {
                    self.told_ahead.insert(key.clone());
                    self.pending.told_ahead = true;
                }
            }
            if !self.ledger.is_claimed(&id) {
                self.intents.insert(
                    id.clone(),
                    Intent {
                        inbox: record.inbox,
                        line,
                    },
                );
                self.pending.intents = true;
            }
            if !self.own_ids.contains_key(&id) {
                self.own_ids.insert(id.clone(), self.ledger.seq());
                self.pending.own.push(id);
            }
        }
    }

    /// Apply one record, in journal order.
    pub fn apply(&mut self, record: Record) {
        if record.verdict == Word::Intent {
            self.apply_intent(record);
            return;
        }
        let inbox = match self.inboxes.get_mut(&record.inbox) {
            Some(inbox) => inbox,
            None => self.inboxes.entry(record.inbox.clone()).or_default(),
        };
        let verdict = inbox.apply(&record);
        if !self.pending.inboxes.contains(&record.inbox) {
            self.pending.inboxes.insert(record.inbox.clone());
        }
        if !verdict {
            return;
        }
        let seen_at = DateTime::from_timestamp_millis(record.seen_at).unwrap_or_default();
        match record.verdict {
            Word::Accepted => {
                let mut row = self.spare_rows.pop().unwrap_or_default();
                if row.fill_from(&record, self.accepted) {
                    self.accepted += 1;
                    self.pending.messages.push(row);
                }
                if let Some(line) = record.line {
                    // The judge's own line has arrived: its intent is done.
                    if !self.intents.is_empty() && self.intents.remove(&line.id).is_some() {
                        self.pending.intents = true;
                    }
                    let request =
                        (line.kind == doorbell_core::Kind::Request).then(|| line.id.clone());
                    self.ledger.apply(line, seen_at);
                    if let Some(id) = request {
                        self.ledger.locate(&id, record.gen, record.offset);
                    }
                }
            }
            Word::Refused | Word::Duplicate => {
                let reason = record.reason.as_deref().and_then(RefusalReason::from_code);
                if let Some(reason) = reason {
                    *self.refused.entry(reason).or_default() += 1;
                    self.pending.refused = true;
                }
                let key = refusal_key(&record.inbox, record.gen, record.offset);
                let told = !self.told_ahead.is_empty() && self.told_ahead.remove(&key);
                if told {
                    self.pending.told_ahead = true;
                }
                if let (true, false, Some(from), Some(reason)) =
                    (record.tell, told, &record.from, reason)
                {
                    self.untold.insert(
                        key,
                        RefusedLine {
                            inbox: record.inbox.clone(),
                            gen: record.gen,
                            offset: record.offset,
                            id: record.id.clone(),
                            from: from.clone(),
                            reason,
                            detail: record.detail.clone().unwrap_or_default(),
                        },
                    );
                    self.pending.untold = true;
                }
                if record.verdict == Word::Refused {
                    self.pending
                        .refused_at
                        .entry((record.inbox.clone(), record.offset))
                        .or_default()
                        .push(self.pending.others.len());
                }
                self.pending.others.push(OtherRow {
                    inbox: record.inbox,
                    gen: record.gen,
                    offset: record.offset,
                    span: record.span,
                    duplicate: record.verdict == Word::Duplicate,
                    seen_at: record.seen_at,
                    id: record.id,
                    from: record.from,
                    reason: record.reason,
                    detail: record.detail,
                });
            }
            Word::Mark | Word::Intent => {}
        }
    }

    /// What the bridge's journal says, for a reader that is not the judge: the index's last
    /// save, read in one transaction, and the journal's tail past it. A reader never writes.
    pub fn load(bridge: &Bridge) -> Result<Snapshot> {
        let state = bridge.state_dir()?;
        let index = match Index::open_read(&crate::index::index_path(&state)) {
            Ok(index) => index.map(Arc::new),
            Err(error) => {
                // The judge rebuilds a damaged index; until then the journal says it all.
                tracing::warn!(%error, "the index cannot be read; reading the whole journal");
                None
            }
        };
        if let Some(index) = &index {
            index.begin_read()?;
        }
        let mut snapshot = Snapshot::from_index(index)?;
        let live = journal_path(bridge);
        // The index says which segment its position is in. When that one was sealed and a
        // new live file started since, the index covers all of it (a roll saves first), and
        // what follows is the new live file, from its start.
        let sealed = crate::segments::sealed_path(&state, snapshot.segment);
        let rolled = snapshot.index.is_some()
            && !crate::segments::same_file(&sealed, &live)
            && crate::segments::list(&state)?
                .iter()
                .any(|s| s.number == snapshot.segment);
        if rolled {
            snapshot.segment += 1;
            snapshot.journal_len = 0;
        }
        let file = match File::open(&live) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(snapshot),
            Err(e) => return Err(Error::io("open journal", &live)(e)),
        };
        let mut snapshot =
            Snapshot::replay_file(snapshot, &file, &live, &mut |_| {}, &mut |_| Ok(()))?;
        snapshot.journal = Some(file);
        Ok(snapshot)
    }

    /// Follow the journal from where this snapshot stopped reading it.
    #[must_use]
    pub fn follower(&self, path: PathBuf) -> JournalFollower {
        let file = self.journal.as_ref().and_then(|f| f.try_clone().ok());
        JournalFollower {
            file,
            ..JournalFollower::new(path, self.journal_len)
        }
    }

    /// Whether a lookup of the index failed since it was opened (see
    /// `Index::failed_lookup`).
    #[must_use]
    pub fn failed_lookup(&self) -> Option<Error> {
        self.index.as_ref()?.failed_lookup()
    }

    /// Apply the journal's records past `snapshot.journal_len`.
    pub fn replay(snapshot: Snapshot, path: &Path) -> Result<Snapshot> {
        Snapshot::replay_with(snapshot, path, &mut |_| {}, &mut |_| Ok(()))
    }

    /// Apply the journal's records past `snapshot.journal_len`, showing each to `seen` first;
    /// `between` may save (and so shrink) the snapshot between records, which it does only
    /// when memory has grown.
    pub fn replay_with(
        snapshot: Snapshot,
        path: &Path,
        seen: &mut dyn FnMut(&Record),
        between: &mut dyn FnMut(&mut Snapshot) -> Result<()>,
    ) -> Result<Snapshot> {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(snapshot),
            Err(e) => return Err(Error::io("open journal", path)(e)),
        };
        Snapshot::replay_file(snapshot, &file, path, seen, between)
    }

    /// [`Snapshot::replay_with`] over an open journal `file` (named `path` in errors).
    pub fn replay_file(
        mut snapshot: Snapshot,
        file: &File,
        path: &Path,
        seen: &mut dyn FnMut(&Record),
        between: &mut dyn FnMut(&mut Snapshot) -> Result<()>,
    ) -> Result<Snapshot> {
        let start = snapshot.journal_len;
        let mut number = 0u64;
        let end = LineReader::new(1 << 26).read(file, start, |line| {
            number += 1;
            let Line::Complete { bytes, offset } = line else {
                return Err(corrupt(
                    path,
                    number,
                    line.offset(),
                    "record too long".into(),
                ));
            };
            let record =
                parse_record(bytes).map_err(|bad| bad_record(path, number, offset, bad))?;
            seen(&record);
            snapshot.apply(record);
            snapshot.journal_len = offset + bytes.len() as u64 + 1;
            if snapshot.unsaved_lines() >= REPLAY_BATCH {
                between(&mut snapshot)?;
            }
            Ok(())
        })?;
        snapshot.journal_len = end;
        Ok(snapshot)
    }
}

/// A judge replaying a long journal (a rebuild), or catching up on a long backlog, saves
/// every this many lines, so memory holds a batch, never the history. Each save rewrites the
/// index pages it touches (the B-trees' right edges, the requests its answers closed): with
/// half as many saves a catch-up of 500,000 messages took 5% less time and 20 MB more peak
/// memory; twice as large again held 50 MB more.
pub(crate) const REPLAY_BATCH: usize = 40_000;

fn corrupt(path: &Path, line: u64, offset: u64, message: String) -> Error {
    Error::CorruptJournal {
        path: path.to_path_buf(),
        line,
        offset,
        message,
    }
}

/// Every record ends with its checksum, `,"k":"<8 hex>"}`, over the bytes before that field:
/// a flipped byte, a record cut short or two records run together are found, never half read.
const SUM_FIELD: &[u8] = b",\"k\":\"";
const SUM_TAIL: usize = SUM_FIELD.len() + 8 + 2;

#[allow(clippy::cast_possible_truncation)] // 32 bits of the hash are the checksum
fn sum_of(body: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(body) as u32
}

fn hex8(sum: u32) -> [u8; 8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 8];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = DIGITS[((sum >> (28 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// End the serialised record in `out` (one JSON object) with its checksum.
fn add_checksum(out: &mut Vec<u8>) {
    debug_assert_eq!(out.last(), Some(&b'}'));
    out.pop();
    let sum = sum_of(out);
    out.extend_from_slice(SUM_FIELD);
    out.extend_from_slice(&hex8(sum));
    out.extend_from_slice(b"\"}");
}

/// Why a journal line is not a record.
pub(crate) enum BadRecord {
    /// Its bytes are not the ones written (the checksum, or the JSON of one without): the
    /// journal is cut there.
    Damaged(String),
    /// Intact (its checksum matches) but not a record this doorbell reads: a newer one wrote
    /// it. The judge stops rather than cut what it cannot read.
    Unknown(String),
}

/// One journal line as a record, its checksum checked. A record without one (written before
/// checksums, or by a doorbell from before them) is read as it is.
pub(crate) fn parse_record(bytes: &[u8]) -> std::result::Result<Record, BadRecord> {
    let tail = bytes
        .len()
        .checked_sub(SUM_TAIL)
        .filter(|&at| bytes[at..].starts_with(SUM_FIELD) && bytes.ends_with(b"\"}"));
    if let Some(at) = tail {
        let hex = &bytes[at + SUM_FIELD.len()..bytes.len() - 2];
        if hex != hex8(sum_of(&bytes[..at])) {
            return Err(BadRecord::Damaged(
                "its checksum does not match: the record is damaged".into(),
            ));
        }
    }
    serde_json::from_slice(bytes).map_err(|e| match tail {
        Some(_) => BadRecord::Unknown(e.to_string()),
        None => BadRecord::Damaged(e.to_string()),
    })
}

/// The error for a journal line that is not a record.
fn bad_record(path: &Path, line: u64, offset: u64, bad: BadRecord) -> Error {
    match bad {
        BadRecord::Damaged(message) => corrupt(path, line, offset, message),
        BadRecord::Unknown(message) => Error::UnknownJournalRecord {
            path: path.to_path_buf(),
            line,
            message,
        },
    }
}

impl From<std::io::Error> for Error {
    fn from(source: std::io::Error) -> Self {
        Error::Io {
            action: "read",
            path: PathBuf::from("(journal)"),
            source,
        }
    }
}

#[must_use]
pub fn journal_path(bridge: &Bridge) -> PathBuf {
    bridge
        .dir()
        .join(crate::bridge::STATE_DIR)
        .join(JOURNAL_FILE)
}

/// The judge's appender. Records are buffered; `flush` hands them to the kernel (enough for a
/// killed process), `sync` makes them durable.
#[derive(Debug)]
pub struct JournalWriter {
    /// `None` once a write failed: what was buffered is thrown away, never written later
    /// behind records a reopened writer appends. The judge reloads from the disk instead.
    out: Option<BufWriter<Guarded>>,
    path: PathBuf,
    /// The journal's length once everything buffered is written.
    len: u64,
    scratch: Vec<u8>,
    /// The file's device and inode: what a copy of its bytes names.
    identity: (u64, u64),
    /// A copy of what was appended since it was last taken, while someone wants one.
    copy: Option<Appended>,
    /// Bytes were appended that no copy holds (let go for its size, or with a writer that
    /// was given up): the next copy says so, empty, so that who follows reads the file.
    copy_lost: bool,
    /// The copy holds the last record appended: a line it judges may join it.
    last_copied: bool,
    /// The bytes of the lines the copy holds.
    copied_line_bytes: usize,
}

/// Bytes appended to the journal file `dev`/`ino` from `from` on: whole records. The daemon
/// hands them to its watchers, who read them as if from the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Appended {
    pub dev: u64,
    pub ino: u64,
    pub from: u64,
    pub bytes: Vec<u8>,
    /// The lines these records judge, as the judge read them, in the order it judged them
    /// (some of them, or none: what a copy leaves out, a watcher reads from the inbox).
    pub lines: Vec<JudgedLine>,
}

/// A line of an inbox and its verdict's span, with its bytes when it was accepted: what the
/// judge read and judged, for printing it without reading the inbox again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgedLine {
    pub inbox: String,
    pub gen: u32,
    pub offset: u64,
    /// The bytes the verdict covers, the line break included.
    pub span: u64,
    pub accepted: bool,
    /// The line without its break, as judged: kept for an accepted line.
    pub bytes: Option<Vec<u8>>,
}

impl Appended {
    /// Where the bytes end in the file.
    #[must_use]
    pub fn to(&self) -> u64 {
        self.from + self.bytes.len() as u64
    }

    /// The bytes it holds: the records' and the accepted lines'.
    #[must_use]
    pub fn held_bytes(&self) -> usize {
        let lines: usize = self
            .lines
            .iter()
            .filter_map(|line| line.bytes.as_ref())
            .map(Vec::len)
            .sum();
        self.bytes.len() + lines
    }
}

/// A copy of appended bytes longer than this is let go (and the next starts where the journal
/// stands): a watcher that needs them reads the file. Below what a socket holds unread, so
/// that a watcher that reads is never let go for one step's size.
const COPY_BYTES: usize = 128 << 10;

impl JournalWriter {
    /// Open the journal for appending, cutting off a torn last record at `valid_len`.
    pub fn open(path: &Path, valid_len: u64) -> Result<JournalWriter> {
        crate::fault::check(path).map_err(Error::io("open journal", path))?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(Error::io("open journal", path))?;
        let meta = file.metadata().map_err(Error::io("stat journal", path))?;
        let len = meta.len();
        if len > valid_len {
            tracing::warn!(path = %path.display(), cut = len - valid_len, "cutting a torn record off the journal");
            file.set_len(valid_len)
                .map_err(Error::io("repair journal", path))?;
        }
        let file = Guarded {
            file,
            path: path.to_path_buf(),
        };
        Ok(JournalWriter {
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            path: path.to_path_buf(),
            len: valid_len,
            scratch: Vec::with_capacity(1024),
            identity: (meta.dev(), meta.ino()),
            copy: None,
            copy_lost: false,
            last_copied: false,
            copied_line_bytes: 0,
        })
    }

    /// Keep a copy of every record appended from now on, for [`JournalWriter::take_copy`].
    pub fn keep_copy(&mut self) {
        self.copy.get_or_insert_with(|| Appended {
            dev: self.identity.0,
            ino: self.identity.1,
            from: self.len,
            ..Appended::default()
        });
    }

    /// Whether a copy is kept.
    #[must_use]
    pub fn keeps_copy(&self) -> bool {
        self.copy.is_some()
    }

    /// Appends were made that no copy holds (another writer's, given up): the next copy
    /// says so.
    pub fn lose_copy(&mut self) {
        self.copy_lost = true;
    }

    /// Everything appended since the last call, written to the file first (`None` when no
    /// copy is kept or nothing was appended). Empty, from where the journal stands, when
    /// appends were made that no copy holds: who follows must read the file.
    pub fn take_copy(&mut self) -> Result<Option<Appended>> {
        if self
            .copy
            .as_ref()
            .is_none_or(|copy| copy.bytes.is_empty() && !self.copy_lost)
        {
            return Ok(None);
        }
        self.copy_lost = false;
        self.flush()?;
        let Some(copy) = &mut self.copy else {
            return Ok(None);
        };
        let next = Appended {
            dev: copy.dev,
            ino: copy.ino,
            from: self.len,
            ..Appended::default()
        };
        self.last_copied = false;
        self.copied_line_bytes = 0;
        Ok(Some(std::mem::replace(copy, next)))
    }

    /// The writer, or the error that it already failed.
    fn out(&mut self) -> Result<&mut BufWriter<Guarded>> {
        match &mut self.out {
            Some(out) => Ok(out),
            None => Err(Error::io("write journal", &self.path)(
                std::io::Error::other("an earlier write failed; the journal must be reopened"),
            )),
        }
    }

    /// Give up the writer after a failed write, dropping what it had buffered unwritten.
    fn fail(&mut self, error: std::io::Error, doing: &'static str) -> Error {
        self.abandon();
        Error::io(doing, &self.path)(error)
    }

    /// Close the writer without writing what it still buffers; every later call fails.
    pub fn abandon(&mut self) {
        self.copy = None;
        if let Some(out) = self.out.take() {
            let (_file, _unwritten) = out.into_parts();
        }
    }

    pub fn append(&mut self, record: &Record) -> Result<()> {
        // Serialise into a reused buffer first: one copy into the writer per record, and the
        // length known exactly.
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        if !crate::journal_json::write_plain(&mut scratch, record) {
            serde_json::to_writer(&mut scratch, record)
                .map_err(|e| Error::io("write journal", &self.path)(e.into()))?;
        }
        add_checksum(&mut scratch);
        scratch.push(b'\n');
        let written = self.out()?.write_all(&scratch);
        let len = scratch.len() as u64;
        self.scratch = scratch;
        match written {
            Ok(()) => {
                self.len += len;
                self.last_copied = false;
                if let Some(copy) = &mut self.copy {
                    if copy.bytes.len() + self.scratch.len() > COPY_BYTES {
                        // Too much for a copy: who follows reads the file.
                        copy.bytes = Vec::new();
                        copy.lines = Vec::new();
                        copy.from = self.len;
                        self.copy_lost = true;
                        self.copied_line_bytes = 0;
                    } else {
                        copy.bytes.extend_from_slice(&self.scratch);
                        self.last_copied = true;
                    }
                }
                Ok(())
            }
            Err(e) => Err(self.fail(e, "write journal")),
        }
    }

    /// The line the record just appended judged: `span` bytes of `inbox` (generation `gen`)
    /// from `offset`, whether it was accepted, and the line itself (kept when it was). Kept
    /// with the copy that holds the record, up to a copy's size in lines; nothing when no
    /// copy holds it.
    pub fn copy_line(
        &mut self,
        inbox: &str,
        gen: u32,
        offset: u64,
        span: u64,
        accepted: bool,
        line: Option<&[u8]>,
    ) {
        let Some(copy) = self.copy.as_mut().filter(|_| self.last_copied) else {
            return;
        };
        let line = line.filter(|_| accepted);
        let bytes = line.map_or(0, <[u8]>::len);
        self.copied_line_bytes = self.copied_line_bytes.saturating_add(bytes);
        if self.copied_line_bytes > COPY_BYTES {
            // This line and the rest of this copy's are read from the inbox.
            self.copied_line_bytes = usize::MAX;
            return;
        }
        copy.lines.push(JudgedLine {
            inbox: inbox.to_owned(),
            gen,
            offset,
            span,
            accepted,
            bytes: line.map(<[u8]>::to_vec),
        });
    }

    /// Whether the file at the journal's path is still the one this writer appends to, as
    /// long as it made it: not when another took its place (a restore renamed over it) or
    /// was copied into it (its length is not what this writer wrote).
    pub fn is_still_ours(&self) -> Result<bool> {
        // A writer given up after a failed write knows no length to compare: the failure's
        // own path (a reload from the disk) takes it from there.
        let Some(out) = self.out.as_ref() else {
            return Ok(true);
        };
        let buffered = out.buffer().len() as u64;
        match std::fs::symlink_metadata(&self.path) {
            Ok(now) => {
                Ok((now.dev(), now.ino()) == self.identity && now.len() == self.len - buffered)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("stat journal", &self.path)(e)),
        }
    }

    /// The journal's length once everything appended is written.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn flush(&mut self) -> Result<()> {
        match self.out()?.flush() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(e, "write journal")),
        }
    }

    /// Another handle on the journal file, for syncing it from elsewhere (a sync covers
    /// every write made before it, through any handle).
    pub fn file(&mut self) -> Result<File> {
        let cloned = self.out()?.get_ref().file.try_clone();
        cloned.map_err(Error::io("open journal", &self.path))
    }

    pub fn sync(&mut self) -> Result<()> {
        self.flush()?;
        match self.out()?.get_ref().sync_data() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(e, "sync journal")),
        }
    }
}

/// Reads the records a judge appends, as it appends them. A reader that is not the judge
/// keeps its own view up to date this way instead of replaying the journal.
#[derive(Debug)]
pub struct JournalFollower {
    path: PathBuf,
    /// The file being followed: the live journal when following began. When a roll replaces
    /// it (nothing is appended to it after that), it is read to its end, then the new live
    /// file from its start.
    file: Option<File>,
    /// The followed file's device and inode.
    identity: (u64, u64),
    pos: u64,
    reader: LineReader,
}

impl JournalFollower {
    /// Follow the journal at `path` from `pos` (the end of a complete record).
    #[must_use]
    pub fn new(path: PathBuf, pos: u64) -> JournalFollower {
        JournalFollower {
            path,
            file: None,
            identity: (0, 0),
            pos,
            reader: LineReader::new(1 << 26),
        }
    }

    /// Every complete record appended since the last call.
    pub fn read(&mut self, each: &mut dyn FnMut(Record)) -> Result<()> {
        loop {
            if self.file.is_none() {
                let file = match File::open(&self.path) {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(Error::io("open journal", &self.path)(e)),
                };
                let meta = file
                    .metadata()
                    .map_err(Error::io("stat journal", &self.path))?;
                self.identity = (meta.dev(), meta.ino());
                self.file = Some(file);
            }
            let file = self.file.as_ref().expect("opened just now");
            let path = &self.path;
            self.pos = self.reader.read(file, self.pos, |line| -> Result<()> {
                if let Line::Complete { bytes, offset } = line {
                    let record =
                        parse_record(bytes).map_err(|bad| bad_record(path, 0, offset, bad))?;
                    each(record);
                }
                Ok(())
            })?;
            let following = self.identity;
            let at_path = match std::fs::metadata(&self.path) {
                Ok(meta) => (meta.dev(), meta.ino()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(Error::io("stat journal", &self.path)(e)),
            };
            if at_path == following {
                return Ok(());
            }
            // Rolled: the old file was read to its end; the new one starts at 0.
            self.file = None;
            self.pos = 0;
        }
    }

    /// Take the records of `appended` (what the judge says it appended) as if read from the
    /// file: when they are of the file followed and begin at or before where it stands. False
    /// when they do not continue it (another file, or bytes missed in between): then
    /// [`JournalFollower::read`] the file instead.
    pub fn take(&mut self, appended: &Appended, each: &mut dyn FnMut(Record)) -> Result<bool> {
        if self.file.is_none()
            || self.identity != (appended.dev, appended.ino)
            || appended.from > self.pos
        {
            return Ok(false);
        }
        let Some(new) = usize::try_from(self.pos - appended.from)
            .ok()
            .and_then(|skip| appended.bytes.get(skip..))
        else {
            // Read past them already.
            return Ok(true);
        };
        let mut offset = self.pos;
        for line in new.split_inclusive(|b| *b == b'\n') {
            let Some(bytes) = line.strip_suffix(b"\n") else {
                // Not whole records: not what a judge appends; read the file.
                return Ok(false);
            };
            let record =
                parse_record(bytes).map_err(|bad| bad_record(&self.path, 0, offset, bad))?;
            each(record);
            offset += line.len() as u64;
        }
        self.pos = offset;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row filled again after its save holds only its new line: nothing of the response it
    /// held before (its request, its state) stays on a note.
    #[test]
    fn a_row_filled_again_is_its_new_lines_alone() {
        let response: Record = serde_json::from_str(r#"{"in":"design","o":6814,"n":533,"v":"a","t":1796459546266,"a":{"id":"01RESPONSE","f":"data","to":"design","k":"response","re":"01REQUEST","cx":"01REQUEST","s":"working","ca":1788249618261,"fp":776}}"#).unwrap();
        let note: Record = serde_json::from_str(r#"{"in":"data","o":1,"n":373,"v":"a","t":1796459546267,"a":{"id":"01N","f":"docs","to":"data","k":"note","cx":"01N","ca":1788249603953,"fp":127}}"#).unwrap();
        let mut row = MessageRow::from_record(&response, 7).unwrap();
        assert_eq!(row.correlates_to.as_deref(), Some("01REQUEST"));
        assert!(row.fill_from(&note, 8));
        assert_eq!(Some(row.clone()), MessageRow::from_record(&note, 8));
        assert_eq!((row.correlates_to, row.state), (None, None));
        let refused: Record = serde_json::from_str(
            r#"{"in":"data","o":400,"n":3,"v":"r","t":1796459546268,"reason":"bad-json"}"#,
        )
        .unwrap();
        let mut kept = MessageRow::from_record(&note, 8).unwrap();
        assert!(!kept.fill_from(&refused, 9), "no accepted line");
        assert_eq!(Some(kept), MessageRow::from_record(&note, 8));
    }

    fn summed(text: &str) -> Vec<u8> {
        let mut bytes = text.as_bytes().to_vec();
        add_checksum(&mut bytes);
        bytes
    }

    #[test]
    fn appends_no_copy_holds_are_said_by_an_empty_copy_from_where_the_journal_stands() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let mut writer = JournalWriter::open(&path, 0).unwrap();
        writer.keep_copy();
        // The append that takes the copy past its size is the last before it is taken.
        let mut offset = 0;
        while writer.len() <= COPY_BYTES as u64 {
            writer
                .append(&Record::new("web", 0, offset, Word::Accepted, 1))
                .unwrap();
            offset += 10;
        }
        let told = writer
            .take_copy()
            .unwrap()
            .expect("a copy that says bytes were missed");
        assert!(told.bytes.is_empty());
        assert_eq!(told.from, writer.len());
        // A follower that stood before them does not take it: it reads the file.
        let mut follower = JournalFollower::new(path.clone(), 0);
        follower.read(&mut |_| {}).unwrap();
        let mut behind = JournalFollower::new(path.clone(), 0);
        behind.read(&mut |_| {}).unwrap();
        assert!(
            follower.take(&told, &mut |_| {}).unwrap(),
            "read to the end: nothing missed"
        );
        let stale = Appended {
            from: told.from + 1,
            ..told.clone()
        };
        assert!(!behind.take(&stale, &mut |_| {}).unwrap());
        assert!(writer.take_copy().unwrap().is_none(), "said once");
        // A writer given up for a new one (a roll, a reload): the new one's first copy says so.
        let mut next = JournalWriter::open(&path, writer.len()).unwrap();
        next.keep_copy();
        next.lose_copy();
        let told = next.take_copy().unwrap().expect("the loss is said");
        assert!(told.bytes.is_empty());
    }

    /// A run of lines refused as one carries the fold of its lines' hashes: it extends a
    /// chain exactly as the lines read back one by one do. A chain saved before this fold
    /// is no evidence past its accepted line.
    #[test]
    fn a_runs_fold_extends_a_chain_as_its_lines_one_by_one() {
        let hashes = [3u64, 0xdead_beef, 7, u64::MAX, 0];
        let by_line = hashes.iter().fold(11, |c, h| LastLine::chained(c, *h));
        let run = hashes.iter().fold(0, |c, h| LastLine::chained(c, *h));
        assert_eq!(LastLine::chained_run(11, run, 5), by_line);
        assert_ne!(LastLine::chained_run(11, run, 4), by_line);
        assert_eq!(LastLine::chained_run(11, 3, 1), LastLine::chained(11, 3));
        let mut last = None;
        LastLine::after(&mut last, 0, 10, Some(7), None, 0);
        LastLine::after(&mut last, 10, 20, None, Some(run), 5);
        let line = last.unwrap();
        assert_eq!(
            (line.end, line.chain),
            (30, LastLine::chained_run(0, run, 5))
        );
        assert!(line.knows_what_follows());
        let saved: LastLine =
            serde_json::from_str(r#"{"offset":0,"span":10,"fingerprint":7,"end":30,"chain":99}"#)
                .unwrap();
        assert!(!saved.knows_what_follows(), "a chain of the fold before");
        let mut saved = Some(saved);
        LastLine::after(&mut saved, 30, 5, None, Some(1), 1);
        assert!(saved.is_some_and(|l| l.broken), "{saved:?}");
        let fresh: LastLine =
            serde_json::from_str(r#"{"offset":0,"span":10,"fingerprint":7,"end":10}"#).unwrap();
        assert!(fresh.knows_what_follows(), "nothing after it yet");
    }

    #[test]
    fn the_last_lines_judged_chain_behind_an_accepted_line_and_break_where_one_cannot_be_known() {
        let mut last = None;
        let after = |last: &mut Option<LastLine>, offset, span, fp, hash| {
            LastLine::after(last, offset, span, fp, hash, 1);
            last.map(|l: LastLine| (l.offset, l.end, l.chain, l.broken))
        };
        // A refused line before any accepted one is no evidence.
        assert_eq!(after(&mut last, 0, 10, None, Some(1)), None);
        assert_eq!(
            after(&mut last, 10, 20, Some(7), None),
            Some((10, 30, 0, false))
        );
        let one = LastLine::chained(0, 5);
        assert_eq!(
            after(&mut last, 30, 5, None, Some(5)),
            Some((10, 35, one, false))
        );
        let two = LastLine::chained(one, 6);
        assert_eq!(
            after(&mut last, 35, 5, None, Some(6)),
            Some((10, 40, two, false))
        );
        // An accepted line held and judged late, before the last: nothing changes.
        assert_eq!(
            after(&mut last, 5, 5, Some(8), None),
            Some((10, 40, two, false))
        );
        // A line that cannot be known again (no hash), or one out of order, breaks it.
        let mut gap = last;
        assert_eq!(
            after(&mut gap, 45, 5, None, Some(9)).map(|l| l.3),
            Some(true)
        );
        assert_eq!(
            after(&mut last, 40, 100, None, None).map(|l| l.3),
            Some(true)
        );
        // Once broken, a line in order after it does not mend it; the next accepted starts anew.
        assert_eq!(
            after(&mut last, 140, 5, None, Some(3)).map(|l| l.3),
            Some(true)
        );
        assert_eq!(
            after(&mut last, 145, 5, Some(9), None),
            Some((145, 150, 0, false))
        );
    }

    /// The lines a copy carries are those its records judge, each once, with the bytes of
    /// the accepted ones; a copy let go for its size carries none of the lines it let go.
    #[test]
    fn a_copy_carries_the_lines_its_records_judge_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let mut writer = JournalWriter::open(&path, 0).unwrap();
        let record = |offset, word| Record::new("web", 2, offset, word, 1);
        // No copy kept: no line either.
        writer.append(&record(0, Word::Accepted)).unwrap();
        writer.copy_line("web", 2, 0, 11, true, Some(b"0123456789"));
        writer.keep_copy();
        writer.append(&record(11, Word::Refused)).unwrap();
        writer.copy_line("web", 2, 11, 4, false, Some(b"bad"));
        writer.append(&record(15, Word::Accepted)).unwrap();
        writer.copy_line("web", 2, 15, 3, true, Some(b"ok"));
        let told = writer.take_copy().unwrap().unwrap();
        let lines: Vec<_> = told
            .lines
            .iter()
            .map(|l| (l.offset, l.span, l.accepted, l.bytes.clone()))
            .collect();
        assert_eq!(
            lines,
            [(11, 4, false, None), (15, 3, true, Some(b"ok".to_vec()))]
        );
        // What it holds in memory counts the accepted line's bytes too.
        assert_eq!(told.held_bytes(), told.bytes.len() + 2);
        // A line is said with the record it follows, never with the next copy's.
        writer.copy_line("web", 2, 15, 3, true, Some(b"ok"));
        writer.append(&record(18, Word::Accepted)).unwrap();
        let told = writer.take_copy().unwrap().unwrap();
        assert!(told.lines.is_empty());
        // Let go for its size: the lines of what was let go go with it, and the next
        // record's line starts the copy again.
        let mut offset = 20;
        while !writer.copy_lost {
            assert!(offset < 1 << 20, "a copy of a megabyte was never let go");
            let mut long = record(offset, Word::Refused);
            long.detail = Some("x".repeat(1000));
            writer.append(&long).unwrap();
            writer.copy_line("web", 2, offset, 1001, false, None);
            offset += 1001;
        }
        let lost = writer.take_copy().unwrap().unwrap();
        assert!(lost.bytes.is_empty() && lost.lines.is_empty());
        writer.append(&record(offset, Word::Accepted)).unwrap();
        writer.copy_line("web", 2, offset, 3, true, Some(b"ok"));
        let told = writer.take_copy().unwrap().unwrap();
        assert_eq!(told.lines.len(), 1);
        assert_eq!(told.lines[0].offset, offset);
    }

    #[test]
    fn a_follower_takes_a_copy_of_appended_bytes_only_where_it_continues_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let mut writer = JournalWriter::open(&path, 0).unwrap();
        writer.keep_copy();
        let record = |offset| Record::new("web", 0, offset, Word::Accepted, 1);
        writer.append(&record(0)).unwrap();
        writer.append(&record(10)).unwrap();
        let first = writer.take_copy().unwrap().unwrap();
        assert_eq!(first.from, 0);
        assert!(writer.take_copy().unwrap().is_none(), "nothing new");
        writer.append(&record(20)).unwrap();
        let second = writer.take_copy().unwrap().unwrap();
        assert_eq!(second.from, first.to());

        let offsets = |follower: &mut JournalFollower, copy: &Appended| {
            let mut seen = Vec::new();
            let took = follower
                .take(copy, &mut |r: Record| seen.push(r.offset))
                .unwrap();
            (took, seen)
        };
        // A follower that has not read the file yet does not know it: it reads the file.
        let mut follower = JournalFollower::new(path.clone(), 0);
        assert_eq!(offsets(&mut follower, &first), (false, vec![]));
        let mut read = Vec::new();
        follower.read(&mut |r| read.push(r.offset)).unwrap();
        assert_eq!(read, [0, 10, 20]);
        // What it read already is skipped; so is a copy of another file.
        assert_eq!(offsets(&mut follower, &first), (true, vec![]));
        assert_eq!(offsets(&mut follower, &second), (true, vec![]));
        let other = Appended {
            ino: second.ino + 1,
            ..second.clone()
        };
        writer.append(&record(30)).unwrap();
        let third = writer.take_copy().unwrap().unwrap();
        assert_eq!(
            offsets(
                &mut follower,
                &Appended {
                    from: third.from,
                    ..other
                }
            ),
            (false, vec![])
        );
        // The next copy continues it: taken without reading the file.
        assert_eq!(offsets(&mut follower, &third), (true, vec![30]));
        // A copy that starts past where it stands leaves a gap: read the file.
        writer.append(&record(40)).unwrap();
        let _missed = writer.take_copy().unwrap().unwrap();
        writer.append(&record(50)).unwrap();
        let after_gap = writer.take_copy().unwrap().unwrap();
        assert_eq!(offsets(&mut follower, &after_gap), (false, vec![]));
        let mut read = Vec::new();
        follower.read(&mut |r| read.push(r.offset)).unwrap();
        assert_eq!(read, [40, 50]);
        // A copy that overlaps where it stands gives only what is new.
        writer.append(&record(60)).unwrap();
        writer.append(&record(70)).unwrap();
        writer.flush().unwrap();
        let mut read = Vec::new();
        follower.read(&mut |r| read.push(r.offset)).unwrap();
        writer.append(&record(80)).unwrap();
        let overlapping = writer.take_copy().unwrap().unwrap();
        assert_eq!(read, [60, 70]);
        assert_eq!(offsets(&mut follower, &overlapping), (true, vec![80]));
    }

    #[test]
    fn a_record_is_read_damaged_or_unknown_by_its_checksum() {
        let plain = r#"{"in":"web","o":0,"v":"m","t":1}"#;
        // With its checksum, and without (written before checksums): both read.
        assert!(parse_record(&summed(plain)).is_ok());
        assert!(parse_record(plain.as_bytes()).is_ok());
        // A changed byte under the checksum is damage; so is a record without one that is
        // not JSON.
        let mut flipped = summed(plain);
        flipped[8] ^= 0x01;
        assert!(matches!(parse_record(&flipped), Err(BadRecord::Damaged(_))));
        assert!(matches!(
            parse_record(br#"{"in":"web","o":0,"v""#),
            Err(BadRecord::Damaged(_))
        ));
        // Intact but of a version this doorbell does not read: never cut, the judge stops.
        let newer = summed(r#"{"ver":99,"in":"web","o":0,"v":"m","t":1}"#);
        assert!(matches!(parse_record(&newer), Err(BadRecord::Unknown(_))));
    }
}
