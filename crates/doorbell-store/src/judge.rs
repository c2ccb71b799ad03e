//! The judge: whoever holds the bridge lock. It reads inboxes from where the journal says
//! judging stopped, judges each complete line, journals the verdict, and only then applies it
//! to the ledger or acts on it.
//!
//! Cross-inbox order: a response can sit in one inbox before the request it answers is read
//! from another. Such a line is held, not refused, until every inbox has been read to its
//! end; it is judged again the moment its request is accepted, and refused as
//! `unknown-request` only when the whole sweep found no such request.
//!
//! Side effects exactly once: a notice's intent (its reserved id and its exact line) is
//! journaled before the line is written. The judge's own lines are accepted when it reads them
//! back, which closes the intent; after a restart, only intents whose line never arrived are
//! written, and only after every inbox was read to its end.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use doorbell_core::debts::{escalation_note, next_due, ring_note, Due, Schedule};
use doorbell_core::notice::{refusal_key, refusal_notice, RefusedLine, MAX_PER_NOTICE};
use doorbell_core::{
    is_agent_name, judge_line, Accepted, Envelope, Kind, Limits, Refusal, RefusalReason, Registry,
    Verdict, BUILTIN_LOOPS,
};

use crate::append::{append_line_within, open_inbox};
use crate::hash::Marker;
use crate::index::{Changes, Index, IndexWriter};
use crate::journal::{
    journal_path, JournalFollower, JournalWriter, Record, RingRef, Snapshot, Word,
};
use crate::reader::{Line, LineReader};
use crate::refused::RefusedLog;
use crate::turns::{Pending, Place, Turns};
use crate::{Bridge, BridgeLock, Error, Result};

/// At most this many inbox files are kept open (to drain a replaced file's old inode).
const OPEN_FILES: usize = 256;

/// What reached one agent's inbox in a sweep: what its hook is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    pub count: u64,
    pub last_id: String,
    pub last_from: String,
    pub last_kind: Kind,
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatchUp {
    pub accepted: u64,
    pub duplicate: u64,
    pub refused: u64,
    /// Inboxes found replaced or truncated and read again from the start.
    pub new_generations: u64,
    /// Notices written.
    pub notices: u64,
    /// Accepted lines per inbox.
    pub arrivals: BTreeMap<String, Arrival>,
}

impl CatchUp {
    #[must_use]
    pub fn judged(&self) -> u64 {
        self.accepted + self.duplicate + self.refused
    }

    fn absorb(&mut self, other: CatchUp) {
        self.accepted += other.accepted;
        self.duplicate += other.duplicate;
        self.refused += other.refused;
        self.new_generations += other.new_generations;
        self.notices += other.notices;
        for (name, arrival) in other.arrivals {
            match self.arrivals.get_mut(&name) {
                Some(mine) => {
                    mine.count += arrival.count;
                    mine.last_id = arrival.last_id;
                    mine.last_from = arrival.last_from;
                    mine.last_kind = arrival.last_kind;
                }
                None => {
                    self.arrivals.insert(name, arrival);
                }
            }
        }
    }
}

/// A checkpoint ready to be saved: what changed since the last one. The journal and the
/// refused log are synced first, so the index never covers more than is durable.
#[derive(Debug)]
pub struct PendingCheckpoint {
    /// The files to sync first, with their paths.
    durable_first: [(File, PathBuf); 2],
    changes: Changes,
    index_path: PathBuf,
}

impl PendingCheckpoint {
    /// The index it is saved into.
    #[must_use]
    pub fn index_path(&self) -> &std::path::Path {
        &self.index_path
    }

    /// Sync, then write the changes into the index. Returns the change set saved, for
    /// [`Judge::saved`].
    pub fn save(self, index: &mut IndexWriter) -> Result<u64> {
        for (file, path) in &self.durable_first {
            crate::fault::check(path)
                .and_then(|()| file.sync_data())
                .map_err(Error::io("sync", path))?;
        }
        index.save(&self.changes)?;
        Ok(self.changes.seq)
    }
}

/// How long the judge waits for an inbox's lock to write a notice there.
const NOTICE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// A line of nothing but white space: no message, never accepted.
pub(crate) fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r'))
}

/// A line whose request has not been seen yet.
#[derive(Debug)]
struct Held {
    inbox: String,
    gen: u32,
    offset: u64,
    bytes: Vec<u8>,
    /// The line's id: a later line with the same id waits behind it.
    id: String,
}

/// The lines held in one sweep, by the request they wait for, and their ids (a later line
/// with a held id waits in the same place); and the responses that wait for their turn in a
/// crossing conversation (`turns.rs`).
#[derive(Debug, Default)]
struct HeldLines {
    by_request: HashMap<String, Vec<Held>>,
    ids: HashMap<String, String>,
    turns: Turns,
    waiting: HashMap<Place, Held>,
    /// Waiting lines whose turn came, to be judged by the outermost judging of a line (so
    /// that a long run of them is a loop, not a recursion).
    ready: std::collections::VecDeque<Place>,
    releasing: bool,
}

impl HeldLines {
    fn hold(&mut self, request: String, line: Held) {
        self.ids.insert(line.id.clone(), request.clone());
        self.by_request.entry(request).or_default().push(line);
    }

    /// The lines that waited for `request`, in the order they were held.
    fn release(&mut self, request: &str) -> Vec<Held> {
        let lines = self.by_request.remove(request).unwrap_or_default();
        for line in &lines {
            self.ids.remove(&line.id);
        }
        lines
    }

    fn is_empty(&self) -> bool {
        self.by_request.is_empty()
    }

    /// Keep the line at `place` aside when it is a response whose turn has not come.
    fn wait_for_turn(&mut self, place: &Place, bytes: &[u8]) -> bool {
        if self.turns.may_judge(place) {
            return false;
        }
        let (inbox, gen, offset) = place.clone();
        let id = identity_of(bytes).0.unwrap_or_default();
        self.waiting.insert(
            place.clone(),
            Held {
                inbox,
                gen,
                offset,
                bytes: bytes.to_vec(),
                id,
            },
        );
        true
    }
}

/// An inbox file the judge keeps open.
#[derive(Debug)]
struct OpenInbox {
    file: File,
    dev: u64,
    ino: u64,
    used: u64,
}

/// The bridge's judge: the lock, the journal and the state it rebuilds.
#[derive(Debug)]
pub struct Judge {
    bridge: Bridge,
    _lock: BridgeLock,
    journal_path: PathBuf,
    snapshot: Snapshot,
    journal: JournalWriter,
    refused_log: RefusedLog,
    index: IndexWriter,
    /// The journal length the index covers once the last checkpoint handed over is saved.
    saved_len: u64,
    /// Saves checkpoints on another thread, for a long-running judge.
    saver: Option<crate::checkpoint::Saver>,
    /// Whether memory holds every open request (a long-running judge's, to ring them); a
    /// short one asks the index for those due.
    open_loaded: bool,
    limits: Limits,
    registry: Registry,
    /// Inboxes that exist as files: the stations a notice can reach.
    inbox_names: BTreeSet<String>,
    reader: LineReader,
    files: HashMap<String, OpenInbox>,
    uses: u64,
    /// Intents written by this process and not yet read back.
    written: HashSet<String>,
    /// Set from another thread to stop a long sweep at the next line.
    interrupt: Arc<AtomicBool>,
    /// How many times a line was held for its request (a sweep reads again while this grows).
    holds: u64,
    /// The names file last written for the shell sender (`None`: write it at the next refresh).
    published_names: Option<String>,
    /// Inboxes that could not be opened (their mode): warned of once each.
    unreadable: BTreeSet<String>,
    /// Inboxes with a line left unjudged because the request it answers may be in an inbox
    /// that cannot be read: swept again once one can be.
    waiting_on_unreadable: BTreeSet<String>,
    /// An unreadable inbox could be read again since the last sweep ended.
    readable_again: bool,
    /// Inbox names that are another inbox's file (a hard link, a rename): warned of once.
    doubles: BTreeSet<String>,
    /// Inboxes whose lock another process held when a notice was due: warned of once.
    locked_inboxes: BTreeSet<String>,
    /// What seals the judge's own lines, so a rebuild knows them without the journal.
    seal: crate::seal::Seal,
}

impl Judge {
    /// Become the judge: load the checkpoint, replay the journal's tail, open it for appending.
    pub fn open(bridge: Bridge, lock: BridgeLock) -> Result<Judge> {
        // What a killed process left half-written (a reader's cursor, a board) goes, once
        // per judge rather than on every read.
        crate::atomic::remove_stale_temps(bridge.dir());
        let journal_path = journal_path(&bridge);
        let Loaded {
            snapshot,
            journal,
            refused_log,
            index,
        } = load(&bridge, &journal_path)?;
        let limits = Limits {
            max_line_bytes: bridge.max_line_bytes(),
        };
        let seal = crate::seal::Seal::open(&bridge.state_dir()?)?;
        Ok(Judge {
            seal,
            reader: LineReader::new(limits.max_line_bytes),
            registry: bridge.registry()?,
            inbox_names: bridge.inboxes()?.into_iter().collect(),
            published_names: None,
            unreadable: BTreeSet::new(),
            waiting_on_unreadable: BTreeSet::new(),
            readable_again: false,
            doubles: BTreeSet::new(),
            locked_inboxes: BTreeSet::new(),
            bridge,
            _lock: lock,
            journal_path,
            saved_len: snapshot.journal_len,
            saver: None,
            open_loaded: false,
            snapshot,
            journal,
            refused_log,
            index,
            limits,
            files: HashMap::new(),
            uses: 0,
            written: HashSet::new(),
            interrupt: Arc::new(AtomicBool::new(false)),
            holds: 0,
        })
    }

    /// Throw away what the judge knows and load it again from the disk: what to do after a
    /// write failed (a full disk, a read-only file system), when memory may hold verdicts the
    /// journal never got. Lines not journaled are judged again at the next sweep; the notices
    /// this process wrote stay known, so none is written twice.
    pub fn reload(&mut self) -> Result<()> {
        // What was buffered describes the state being thrown away: never write it. A save in
        // flight finishes first (its outcome no longer matters: the index is read again).
        if let Some(saver) = &mut self.saver {
            let _ = saver.settle();
            // Its connection may be to an index that is rebuilt now.
            *saver = crate::checkpoint::Saver::start();
        }
        self.journal.abandon();
        self.refused_log.abandon();
        let loaded = load(&self.bridge, &self.journal_path)?;
        self.saved_len = loaded.snapshot.journal_len;
        self.snapshot = loaded.snapshot;
        self.journal = loaded.journal;
        self.refused_log = loaded.refused_log;
        self.index = loaded.index;
        // The open files stay: an old one not yet drained is compared with the reloaded
        // journal and drained from where it says.
        self.holds = 0;
        if std::mem::take(&mut self.open_loaded) {
            self.keep_open_in_memory()?;
        }
        self.refresh_registry()
    }

    /// Bring every open request into memory and keep them there: a long-running judge rings
    /// them without asking the index.
    pub fn keep_open_in_memory(&mut self) -> Result<()> {
        self.snapshot.load_open_requests()?;
        self.open_loaded = true;
        Ok(())
    }

    /// What the due times in the index are computed with.
    fn timing(&self) -> crate::index::Timing {
        timing_of(&self.bridge)
    }

    /// A flag that, once set, makes the current and every later sweep stop at the next line
    /// with `Error::Interrupted`. Everything journaled until then stays valid.
    #[must_use]
    pub fn interrupt_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.interrupt)
    }

    #[must_use]
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Give up the judge's role and keep what it knows.
    #[must_use]
    pub fn into_snapshot(self) -> Snapshot {
        self.snapshot
    }

    #[must_use]
    pub fn bridge(&self) -> &Bridge {
        &self.bridge
    }

    /// Use a new config (after a validated reload). Only lines judged from now on see it.
    pub fn set_config(&mut self, config: crate::Config) -> Result<()> {
        let before = self.timing();
        self.bridge.config = config;
        if self.timing() != before {
            // Every open request's saved due time is now wrong: save them all again.
            self.keep_open_in_memory()?;
            self.snapshot.ledger.touch_open();
        }
        self.limits = Limits {
            max_line_bytes: self.bridge.max_line_bytes(),
        };
        self.reader = LineReader::new(self.limits.max_line_bytes);
        self.refresh_registry()
    }

    fn refresh_registry(&mut self) -> Result<()> {
        self.registry = self.bridge.registry()?;
        self.inbox_names = self.bridge.inboxes()?.into_iter().collect();
        // An unreadable inbox that is gone (deleted, renamed) holds nothing to wait for.
        let before = self.unreadable.len();
        let names = &self.inbox_names;
        self.unreadable.retain(|name| names.contains(name));
        if self.unreadable.len() < before {
            self.readable_again = true;
        }
        self.publish_names();
        Ok(())
    }

    /// Keep `.doorbell/names` equal to the judge's registry, so the shell sender, which cannot
    /// read the config, refuses what this judge would. Written only when it changes; a failed
    /// write is retried at the next refresh and never stops judging.
    fn publish_names(&mut self) {
        let text = crate::bridge::names_file(&self.registry, &self.inbox_names);
        if self.published_names.as_ref() == Some(&text) {
            return;
        }
        // Another judge may have written the same names: a short judge (a command) then
        // writes nothing.
        if self.bridge.published_names().as_ref() == Some(&text) {
            self.published_names = Some(text);
            return;
        }
        match self.bridge.publish_names(&text) {
            Ok(()) => self.published_names = Some(text),
            Err(e) => tracing::warn!(error = %e, "could not write the names file; will try again"),
        }
    }

    /// Judge everything waiting in every inbox, write every notice due, and judge those
    /// notices too: what `daemon --once` does, and what a command does when no judge runs.
    pub fn catch_up(&mut self, now: DateTime<Utc>) -> Result<CatchUp> {
        // A symlink, FIFO or device named like an inbox is never read: say so, loudly, rather
        // than skip it in silence.
        for path in self.bridge.refused_inboxes()? {
            tracing::warn!(path = %path.display(), "refusing an inbox that is not a regular file");
        }
        let before = self.journal.len();
        let mut stats = self.sweep_all(now)?;
        let targets = self.emit(now, &mut stats)?;
        if !targets.is_empty() {
            let again = self.sweep(&targets, now)?;
            stats.absorb(again);
        }
        // Nothing journaled: nothing to make durable (a command's catch-up is mostly this).
        if self.journal.len() != before {
            self.journal.sync()?;
        }
        self.refused_log.flush()?;
        Ok(stats)
    }

    /// Judge every unjudged line of every inbox.
    pub fn sweep_all(&mut self, now: DateTime<Utc>) -> Result<CatchUp> {
        self.refresh_registry()?;
        let names: Vec<String> = self.inbox_names.iter().cloned().collect();
        self.sweep(&names, now)
    }

    /// Judge the unjudged lines of `names`. When a line waits for a request that is not in
    /// the ledger, every other inbox is read to its end before the line is refused.
    pub fn sweep(&mut self, names: &[String], now: DateTime<Utc>) -> Result<CatchUp> {
        let mut stats = CatchUp::default();
        let mut held = HeldLines::default();
        let mut holds = self.holds;
        // An inbox new to the judge (made, or renamed back) is a station before any line of
        // this sweep is judged: a line from it may sit in an inbox read before its own.
        if names.iter().any(|name| !self.inbox_names.contains(name)) {
            self.refresh_registry()?;
        }
        // Lines waiting in several inboxes: the responses of a conversation that crosses
        // them take turns, in the order they were written.
        if names.len() > 1 {
            held.turns = self.turns(names);
        }
        for name in names {
            self.sweep_one(name, now, &mut held, &mut stats)?;
        }
        // A held line's request was appended before the line was read, but perhaps to an
        // inbox this sweep had already read. So every inbox (those already read included) is
        // read to its end once more, starting after every held line was read; and again while
        // such a pass holds more lines.
        while !held.is_empty() && self.holds != holds {
            holds = self.holds;
            self.refresh_registry()?;
            let all: Vec<String> = self.inbox_names.iter().cloned().collect();
            for name in &all {
                self.sweep_one(name, now, &mut held, &mut stats)?;
            }
        }
        // Every inbox has been read to its end after the held lines were read: what is still
        // held answers no request. Unless an inbox could not be read: its request may be
        // there, so the line waits, unjudged, and its inbox is swept again once that one
        // can be read.
        let mut rest: Vec<Held> = held.by_request.into_values().flatten().collect();
        if !self.unreadable.is_empty() {
            self.waiting_on_unreadable
                .extend(rest.drain(..).map(|line| line.inbox));
        }
        rest.sort_by(|a, b| (&a.inbox, a.offset).cmp(&(&b.inbox, b.offset)));
        // What still waits for its turn (the line before it was never judged in this sweep)
        // is judged now, in the order of the turns.
        let mut waiting: Vec<(Option<(String, usize)>, Held)> = held
            .waiting
            .drain()
            .map(|(place, line)| (held.turns.order_of(&place), line))
            .collect();
        waiting.sort_by(|a, b| a.0.cmp(&b.0));
        rest.extend(waiting.into_iter().map(|(_, line)| line));
        for line in rest {
            self.judge_complete(
                &line.inbox,
                line.gen,
                line.offset,
                &line.bytes,
                now,
                None,
                &mut stats,
            )?;
        }
        self.journal.flush()?;
        self.refused_log.flush()?;
        // Between sweeps nothing holds a read of the index (the WAL can be checkpointed).
        if let Some(index) = self.snapshot.index() {
            index.release();
        }
        if std::mem::take(&mut self.readable_again) && !self.waiting_on_unreadable.is_empty() {
            let waiting: Vec<String> = std::mem::take(&mut self.waiting_on_unreadable)
                .into_iter()
                .collect();
            let again = self.sweep(&waiting, now)?;
            stats.absorb(again);
        }
        Ok(stats)
    }

    /// Before the judge lets go: when a file it holds open no longer sits at its inbox's path
    /// (replaced or deleted), read every inbox to its end, that old file first, even if a stop
    /// interrupted the last sweep. Once this process exits nobody can reach the old file's
    /// unread lines; what is still at the path waits for the next start as usual.
    pub fn drain_replaced(&mut self, now: DateTime<Utc>) -> Result<CatchUp> {
        let replaced: Vec<String> = self
            .files
            .iter()
            .filter(|(name, open)| {
                let at_path = self
                    .bridge
                    .inbox_path(name)
                    .ok()
                    .and_then(|path| std::fs::symlink_metadata(path).ok())
                    .map(|meta| (meta.dev(), meta.ino()));
                at_path != Some((open.dev, open.ino))
            })
            .map(|(name, _)| name.clone())
            .collect();
        if replaced.is_empty() {
            return Ok(CatchUp::default());
        }
        let interrupted = self.interrupt.swap(false, Ordering::Relaxed);
        // A deleted inbox is no longer listed: name it, so its old file is drained too.
        let stats = self.refresh_registry().and_then(|()| {
            let mut names: BTreeSet<String> = self.inbox_names.clone();
            names.extend(replaced);
            let names: Vec<String> = names.into_iter().collect();
            self.sweep(&names, now)
        });
        self.interrupt.store(interrupted, Ordering::Relaxed);
        stats
    }

    /// Whether any refusal waits for its notice.
    #[must_use]
    pub fn has_untold(&self) -> bool {
        !self.snapshot.untold.is_empty()
    }

    /// Whether a line the judge means to write is not written yet (its inbox was locked by
    /// another process, or could not be written): the daemon tries again on a timer.
    pub fn has_unwritten(&self) -> bool {
        self.snapshot
            .intents
            .keys()
            .any(|id| !self.written.contains(id))
    }

    /// Write what is due: intents never written (after a crash) and a notice for every
    /// refusal not yet told, coalesced per sender. Returns the inboxes written to.
    pub fn emit(&mut self, now: DateTime<Utc>, stats: &mut CatchUp) -> Result<Vec<String>> {
        let mut targets = BTreeSet::new();
        let mut by_sender: BTreeMap<String, Vec<RefusedLine>> = BTreeMap::new();
        for line in self.snapshot.untold.values() {
            by_sender
                .entry(line.from.clone())
                .or_default()
                .push(line.clone());
        }
        for (_, lines) in by_sender {
            for chunk in lines.chunks(MAX_PER_NOTICE) {
                let notice = refusal_notice(chunk, now);
                let mut record =
                    Record::new(&notice.to, 0, 0, Word::Intent, now.timestamp_millis());
                record.id = Some(notice.id.clone());
                record.write = Some(self.seal.seal(&notice.line));
                record.covers = chunk.iter().map(RefusedLine::key).collect();
                self.journal.append(&record)?;
                self.snapshot.apply(record);
            }
        }
        self.intend_rings(now)?;
        self.intend_reports(now)?;
        // The intents are in the journal before any line is written.
        self.journal.flush()?;
        let pending: Vec<(String, crate::journal::Intent)> = self
            .snapshot
            .intents
            .iter()
            .filter(|(id, _)| !self.written.contains(*id))
            .map(|(id, intent)| (id.clone(), intent.clone()))
            .collect();
        for (id, intent) in pending {
            let path = self.bridge.inbox_path(&intent.inbox)?;
            // A notice waits a moment for an inbox another process holds, never longer:
            // every other inbox is judged meanwhile, and the notice is written later.
            match append_line_within(&path, intent.line.as_bytes(), NOTICE_WAIT) {
                Ok(_) => {
                    self.written.insert(id);
                    stats.notices += 1;
                    if self.locked_inboxes.remove(&intent.inbox) {
                        tracing::warn!(inbox = %intent.inbox, "the inbox's lock was released: its notices are written");
                    }
                    targets.insert(intent.inbox);
                }
                Err(Error::InboxLocked { .. }) => {
                    if self.locked_inboxes.insert(intent.inbox.clone()) {
                        tracing::warn!(inbox = %intent.inbox, "another process holds this inbox's lock (a writer that hangs?): its notices wait, every other inbox is judged");
                    }
                }
                Err(e) => {
                    tracing::warn!(inbox = %intent.inbox, id = %id, error = %e, "could not write a notice; will try again");
                }
            }
        }
        Ok(targets.into_iter().collect())
    }

    fn schedule(&self) -> Schedule {
        let debts = &self.bridge.config.debts;
        Schedule {
            ring_after: debts.ring_after,
            backoff: debts.backoff,
            max_rings: debts.max_rings,
        }
    }

    /// Everything the doorbell will ring or escalate, with when: only for debts whose
    /// recipient has an inbox (an agent without one cannot be rung; `status` warns of it).
    fn due_items(&self) -> Vec<(String, DateTime<Utc>, Due)> {
        let schedule = self.schedule();
        let human = &self.bridge.config.human;
        self.snapshot
            .ledger
            .requests()
            .filter(|r| r.is_open())
            .filter_map(|r| {
                let (at, due) = next_due(r, &schedule, human)?;
                let to = match due {
                    Due::Ring(_) => r.debtor_station(),
                    Due::Escalate => human.as_str(),
                };
                self.inbox_names
                    .contains(to)
                    .then(|| (r.id.clone(), at, due))
            })
            .collect()
    }

    /// When the doorbell next has something to ring or escalate, if ever. Without every
    /// open request in memory, the index's earliest due time counts too (it may be one since
    /// answered: an early look finds nothing due, never a late one).
    #[must_use]
    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        let in_memory = self.due_items().into_iter().map(|(_, at, _)| at).min();
        if self.open_loaded {
            return in_memory;
        }
        let saved = self
            .snapshot
            .index()
            .and_then(|index| index.first_due().ok().flatten())
            .and_then(DateTime::from_timestamp_millis);
        match (in_memory, saved) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Bring the open requests due by `now` into memory, when not all of them are.
    fn load_due(&mut self, now: DateTime<Utc>) -> Result<()> {
        if self.open_loaded {
            return Ok(());
        }
        if let Some(index) = self.snapshot.index() {
            let due = index.due_by(now.timestamp_millis())?;
            self.snapshot.ledger.load(due);
        }
        Ok(())
    }

    /// Journal the intent of every ring and escalation due at `now`: at most one per debt, so
    /// after a downtime each debt gets one late ring, not a burst.
    fn intend_rings(&mut self, now: DateTime<Utc>) -> Result<()> {
        self.load_due(now)?;
        let max_rings = self.bridge.config.debts.max_rings;
        let human = self.bridge.config.human.clone();
        for (id, at, due) in self.due_items() {
            if at > now {
                continue;
            }
            let request = self
                .snapshot
                .ledger
                .request(&id)
                .expect("listed just now")
                .into_owned();
            let (notice, ring) = match due {
                Due::Ring(n) => (ring_note(&request, n, max_rings, now), n),
                Due::Escalate => (escalation_note(&request, &human, now), 0),
            };
            let mut record = Record::new(&notice.to, 0, 0, Word::Intent, now.timestamp_millis());
            record.id = Some(notice.id);
            record.write = Some(self.seal.seal(&notice.line));
            record.ring = Some(RingRef {
                request: id,
                epoch: request.epoch,
                ring,
            });
            self.journal.append(&record)?;
            self.snapshot.apply(record);
        }
        Ok(())
    }

    /// Journal the intent of the note that announces each daily report not yet announced.
    fn intend_reports(&mut self, now: DateTime<Utc>) -> Result<()> {
        let human = self.bridge.config.human.clone();
        if !self.inbox_names.contains(&human) {
            return Ok(());
        }
        for (date, path) in crate::reports::daily_reports(&self.bridge)? {
            let id = crate::reports::note_id(&date);
            if self.snapshot.is_own(&id) {
                continue;
            }
            let summary = crate::reports::summary_of(&path).unwrap_or_default();
            let line = crate::reports::note_line(&id, &human, &date, &path, &summary, now);
            let mut record = Record::new(&human, 0, 0, Word::Intent, now.timestamp_millis());
            record.id = Some(id);
            record.write = Some(self.seal.seal(&line));
            self.journal.append(&record)?;
            self.snapshot.apply(record);
        }
        Ok(())
    }

    /// Save checkpoints on a thread of their own from now on ([`Judge::checkpoint_in_background`]).
    pub fn save_in_background(&mut self) {
        self.saver
            .get_or_insert_with(crate::checkpoint::Saver::start);
    }

    /// Hand a checkpoint to the saving thread unless one is still being saved (false then).
    /// A save that failed is this call's error: memory no longer matches the index, and the
    /// judge must [`Judge::reload`] (the journal has everything the index missed).
    pub fn checkpoint_in_background(&mut self) -> Result<bool> {
        let Some(saver) = &mut self.saver else {
            self.checkpoint()?;
            return Ok(true);
        };
        if let Some(result) = saver.poll() {
            self.snapshot.saved(result?);
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

    /// Wait for the checkpoint the saving thread has in flight, if any.
    pub fn settle(&mut self) -> Result<()> {
        if let Some(result) = self
            .saver
            .as_mut()
            .and_then(crate::checkpoint::Saver::settle)
        {
            self.snapshot.saved(result?);
        }
        Ok(())
    }

    /// Make everything judged so far durable and save what changed into the index.
    pub fn checkpoint(&mut self) -> Result<()> {
        // Saves happen in order: an older change set never lands after a newer one.
        self.settle()?;
        let pending = self.prepare_checkpoint()?;
        let seq = pending.save(&mut self.index)?;
        self.saved(seq);
        Ok(())
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
        self.journal.abandon();
        crate::segments::start_empty(&self.journal_path)?;
        self.journal = JournalWriter::open(&self.journal_path, 0)?;
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

    /// The inbox now at `name`'s path, with its metadata, draining the file the judge had open
    /// there when it was replaced or deleted since. The file already open is reused when the
    /// path still names it.
    fn current_file(
        &mut self,
        name: &str,
        now: DateTime<Utc>,
        held: &mut HeldLines,
        stats: &mut CatchUp,
    ) -> Result<Option<(File, std::fs::Metadata)>> {
        let path = self.bridge.inbox_path(name)?;
        let at_path = match std::fs::symlink_metadata(&path) {
            Ok(meta) => Some((meta.dev(), meta.ino())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io("stat inbox", &path)(e)),
        };
        if let Some(open) = self.files.remove(name) {
            if at_path == Some((open.dev, open.ino)) {
                match open.file.metadata() {
                    Ok(meta) => return Ok(Some((open.file, meta))),
                    Err(e) => {
                        self.files.insert(name.to_owned(), open);
                        return Err(Error::io("stat inbox", &path)(e));
                    }
                }
            }
            if let Err(e) = self.drain(name, &open, now, held, stats) {
                // Keep the old file: the next sweep, or a stopping judge, drains the rest.
                self.files.insert(name.to_owned(), open);
                return Err(e);
            }
        }
        if at_path.is_none() {
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
    fn drain(
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
        self.read_lines(name, gen, &old.file, now, held, stats)?;
        Ok(())
    }

    /// Read one inbox from where judging stopped to its end.
    fn sweep_one(
        &mut self,
        name: &str,
        now: DateTime<Utc>,
        held: &mut HeldLines,
        stats: &mut CatchUp,
    ) -> Result<()> {
        let Some((file, meta)) = self.current_file(name, now, held, stats)? else {
            return Ok(());
        };
        if let Some(other) = self.snapshot.same_file_as_another(name, &file, &meta) {
            if self.doubles.insert(name.to_owned()) {
                tracing::warn!(
                    inbox = name,
                    of = %other,
                    "this inbox is {other}'s file under another name (a hard link, or {other}'s inbox renamed): its lines were judged as {other}'s and are not judged again; rename it back, or give the new agent an inbox of its own"
                );
            }
            return Ok(());
        }
        // Whatever goes wrong (a stop, a failed write), the file stays open: if it is replaced
        // before the next sweep, its unread lines can still be drained.
        let read = self
            .check_generation(name, &file, &meta, now, stats)
            .and_then(|gen| Ok((gen, self.read_lines(name, gen, &file, now, held, stats)?)));
        let (gen, end) = match read {
            Ok(read) => read,
            Err(e) => {
                self.keep_open(name, file, &meta);
                return Err(e);
            }
        };
        let marked = self.snapshot.inboxes[name].mark.map(|(offset, _)| offset);
        if end > 0 && marked != Some(end) {
            let path = self.bridge.inbox_path(name)?;
            if let Some(marker) = Marker::of(&file, end).map_err(Error::io("read inbox", &path))? {
                self.mark(name, gen, end, &meta, Some(marker), now)?;
            }
        }
        self.keep_open(name, file, &meta);
        Ok(())
    }

    fn keep_open(&mut self, name: &str, file: File, meta: &std::fs::Metadata) {
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

    /// Judge the complete lines of `file` from where judging stopped in generation `gen`.
    /// Returns where the last complete line ends.
    fn read_lines(
        &mut self,
        name: &str,
        gen: u32,
        file: &File,
        now: DateTime<Utc>,
        held: &mut HeldLines,
        stats: &mut CatchUp,
    ) -> Result<u64> {
        let start = self.snapshot.inboxes[name].judged_to;
        let beyond = self.snapshot.inboxes[name].judged_beyond.clone();
        // Lines already held in this sweep are read again, not judged again.
        let holding: HashSet<u64> = held
            .by_request
            .values()
            .flatten()
            .filter(|h| h.inbox == name && h.gen == gen)
            .map(|h| h.offset)
            .chain(
                held.waiting
                    .keys()
                    .filter(|(inbox, g, _)| inbox == name && *g == gen)
                    .map(|(_, _, offset)| *offset),
            )
            .collect();
        let mut reader = std::mem::replace(&mut self.reader, LineReader::new(0));
        let interrupt = Arc::clone(&self.interrupt);
        // A run of blank lines is one refused fragment, one record: a megabyte of newlines
        // must not become hundreds of megabytes of journal, refused log and index.
        let mut blank: Option<(u64, u64)> = None;
        let result = reader.read(file, start, |line| {
            if interrupt.load(Ordering::Relaxed) {
                return Err(Error::Interrupted);
            }
            if let Line::Complete { offset, bytes } = &line {
                if is_blank(bytes) && !beyond.contains_key(offset) && !holding.contains(offset) {
                    let end = offset + bytes.len() as u64 + 1;
                    match &mut blank {
                        Some((_, run_end)) if *run_end == *offset => *run_end = end,
                        _ => {
                            self.refuse_blanks(name, gen, blank.take(), now, stats)?;
                            blank = Some((*offset, end));
                        }
                    }
                    return Ok(());
                }
            }
            self.refuse_blanks(name, gen, blank.take(), now, stats)?;
            if beyond.contains_key(&line.offset()) || holding.contains(&line.offset()) {
                return Ok(());
            }
            match line {
                Line::TooLong { offset, len } => {
                    // The judge's own notices, rings and report notes can be longer than a
                    // small `max_line_bytes`: it wrote them, so it reads them back whole.
                    // Refusing one would leave its intent open, and every restart would write
                    // it again, never delivered.
                    if let Some(own) = self.own_line_at(name, file, offset, len)? {
                        let limits = std::mem::replace(
                            &mut self.limits,
                            Limits {
                                max_line_bytes: usize::MAX,
                            },
                        );
                        let judged =
                            self.judge_complete(name, gen, offset, &own, now, Some(held), stats);
                        self.limits = limits;
                        return judged;
                    }
                    let refusal = Refusal::new(
                        RefusalReason::LineTooLong,
                        format!("{len} bytes, the limit is {}", self.limits.max_line_bytes),
                    );
                    self.record(
                        name,
                        gen,
                        offset,
                        len + 1,
                        &Verdict::Refused(refusal),
                        None,
                        None,
                        now,
                        stats,
                    )
                }
                Line::Complete { offset, bytes } => {
                    self.judge_complete(name, gen, offset, bytes, now, Some(held), stats)
                }
            }
        });
        self.reader = reader;
        let end = result?;
        self.refuse_blanks(name, gen, blank, now, stats)?;
        Ok(end)
    }

    /// Refuse a run of blank lines, `[start, end)`, with one verdict.
    fn refuse_blanks(
        &mut self,
        name: &str,
        gen: u32,
        run: Option<(u64, u64)>,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        let Some((start, end)) = run else {
            return Ok(());
        };
        let detail = if end - start == 1 {
            "blank line".to_owned()
        } else {
            format!("blank lines ({} bytes)", end - start)
        };
        let refusal = Refusal::new(RefusalReason::BadJson, detail);
        let verdict = Verdict::Refused(refusal);
        self.record(
            name,
            gen,
            start,
            end - start,
            &verdict,
            None,
            None,
            now,
            stats,
        )
    }

    /// The bytes of the over-long line at `offset` when they are exactly a line the judge
    /// intended to write to this inbox and has not read back yet.
    fn own_line_at(
        &self,
        name: &str,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>> {
        let Some(intent) = self
            .snapshot
            .intents
            .values()
            .find(|i| i.inbox == name && i.line.len() as u64 == len)
        else {
            return Ok(None);
        };
        let mut bytes = vec![0u8; intent.line.len()];
        match std::os::unix::fs::FileExt::read_exact_at(file, &mut bytes, offset) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(Error::io("read inbox", name)(e)),
        }
        let own = self
            .snapshot
            .intents
            .values()
            .any(|i| i.inbox == name && i.line.as_bytes() == bytes.as_slice());
        Ok(own.then_some(bytes))
    }

    /// Make sure the journal's view of the inbox belongs to this very file; start a new
    /// generation when it was truncated, replaced or recreated.
    fn check_generation(
        &mut self,
        name: &str,
        file: &File,
        meta: &std::fs::Metadata,
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
        // An inbox is known by its bytes: the marker of what was judged. A file with those
        // bytes under a new inode (a copy, a restore, a move to another disk) is the same
        // inbox; without a marker only the inode can say.
        let same = meta.len() >= resume
            && match known.mark {
                Some((offset, marker)) => marker.matches(file, offset).unwrap_or(false),
                None => !moved,
            };
        if same && moved {
            let (gen, mark) = (known.gen, known.mark);
            tracing::warn!(
                inbox = name,
                "inbox has a new inode but the same bytes (copied, restored or moved): it is the same inbox"
            );
            let (offset, marker) = mark.map_or((0, None), |(o, m)| (o, Some(m)));
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
        self.mark(name, gen, 0, meta, None, now)?;
        Ok(gen)
    }

    fn mark(
        &mut self,
        name: &str,
        gen: u32,
        offset: u64,
        meta: &std::fs::Metadata,
        marker: Option<Marker>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut record = Record::new(name, gen, offset, Word::Mark, now.timestamp_millis());
        record.dev = Some(meta.dev());
        record.ino = Some(meta.ino());
        record.marker = marker;
        self.journal.append(&record)?;
        self.snapshot.apply(record);
        Ok(())
    }

    /// Judge one complete line; `held` is where a line waiting for its request goes while
    /// inboxes are still being read (`None` once every inbox was read).
    #[allow(clippy::too_many_arguments)]
    fn judge_complete(
        &mut self,
        name: &str,
        gen: u32,
        offset: u64,
        bytes: &[u8],
        now: DateTime<Utc>,
        mut held: Option<&mut HeldLines>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        let place: Place = (name.to_owned(), gen, offset);
        if let Some(held) = held.as_deref_mut() {
            if held.wait_for_turn(&place, bytes) {
                return Ok(());
            }
        }
        let (verdict, envelope, sealed) = self.judge_bytes(name, bytes);
        if let (Some(envelope), Some(held)) = (&envelope, held.as_deref_mut()) {
            let unknown_request = matches!(
                &verdict,
                Verdict::Refused(refusal) if refusal.reason == RefusalReason::UnknownRequest
            );
            // A line whose id a held line already carries is judged after it, as it was
            // written after it: otherwise a reuse would claim the id first.
            let behind = held.ids.get(&*envelope.id).cloned();
            let bucket = match (unknown_request, behind) {
                (_, Some(request)) => Some(request),
                (true, None) => Some(
                    envelope
                        .correlates_to
                        .as_deref()
                        .unwrap_or_default()
                        .to_owned(),
                ),
                (false, None) => None,
            };
            if let Some(request) = bucket {
                self.holds += 1;
                held.hold(
                    request,
                    Held {
                        inbox: name.to_owned(),
                        gen,
                        offset,
                        bytes: bytes.to_vec(),
                        id: envelope.id.to_string(),
                    },
                );
                return Ok(());
            }
        }
        if let (true, Verdict::Accepted, Some(envelope)) = (sealed, &verdict, &envelope) {
            self.recognise_own(name, bytes, envelope, now)?;
        }
        let accepted = match (&verdict, &envelope) {
            (Verdict::Accepted, Some(envelope)) => {
                let mut accepted = self.snapshot.ledger.accepted(envelope);
                // A loop's request carries the station that answers for it.
                if accepted.kind == Kind::Request {
                    accepted.owner = self.registry.owners.get(&accepted.from).cloned();
                }
                Some(accepted)
            }
            _ => None,
        };
        let new_request = accepted
            .as_ref()
            .filter(|a| a.kind == Kind::Request)
            .map(|a| a.id.clone());
        // Refused and duplicate lines keep their id and sender for notices; accepted ones
        // carry them in `accepted`.
        let identity = match (&accepted, &envelope) {
            (Some(_), _) => None,
            (None, Some(e)) => Some((Some(e.id.to_string()), Some(e.from.to_string()))),
            (None, None) => Some(identity_of(bytes)),
        };
        let span = bytes.len() as u64 + 1;
        if let Some(line) = &accepted {
            let entry = match stats.arrivals.get_mut(name) {
                Some(entry) => entry,
                None => stats.arrivals.entry(name.to_owned()).or_insert(Arrival {
                    count: 0,
                    last_id: String::new(),
                    last_from: String::new(),
                    last_kind: line.kind,
                }),
            };
            entry.count += 1;
            // Reuses the strings' buffers: one arrival per line adds up in a catch-up.
            entry.last_id.clone_from(&line.id);
            entry.last_from.clone_from(&line.from);
            entry.last_kind = line.kind;
        }
        self.record(
            name, gen, offset, span, &verdict, identity, accepted, now, stats,
        )?;
        let Some(held) = held else {
            return Ok(());
        };
        // Lines that were waiting for this request can be judged now.
        if let Some(id) = new_request {
            for line in held.release(&id) {
                self.judge_complete(
                    &line.inbox,
                    line.gen,
                    line.offset,
                    &line.bytes,
                    now,
                    Some(held),
                    stats,
                )?;
            }
        }
        self.next_turn(held, &place, now, stats)
    }

    /// The line at `place` was judged: the next response of its conversation, if it waits,
    /// has its turn. The outermost judging of a line judges what became ready, in a loop.
    fn next_turn(
        &mut self,
        held: &mut HeldLines,
        place: &Place,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        if let Some(next) = held.turns.judged(place) {
            if held.waiting.contains_key(&next) {
                held.ready.push_back(next);
            }
        }
        if held.releasing {
            return Ok(());
        }
        held.releasing = true;
        while let Some(next) = held.ready.pop_front() {
            let Some(line) = held.waiting.remove(&next) else {
                continue;
            };
            self.judge_complete(
                &line.inbox,
                line.gen,
                line.offset,
                &line.bytes,
                now,
                Some(held),
                stats,
            )?;
        }
        held.releasing = false;
        Ok(())
    }

    /// The turns of the responses waiting in `names` (`turns.rs`): each inbox read from where
    /// judging stopped, when its file is the one the journal knows.
    fn turns(&self, names: &[String]) -> Turns {
        let mut pending = Vec::new();
        for name in names {
            let Ok(path) = self.bridge.inbox_path(name) else {
                continue;
            };
            let Ok(file) = open_inbox(&path, false) else {
                continue;
            };
            let Ok(meta) = file.metadata() else {
                continue;
            };
            let (gen, from, judged) = match self.snapshot.inboxes.get(name) {
                Some(known) if (known.dev, known.ino) == (meta.dev(), meta.ino()) => {
                    (known.gen, known.judged_to, Some(&known.judged_beyond))
                }
                // Replaced, moved or restored: its lines take no turns in this sweep.
                Some(_) => continue,
                None => (0, 0, None),
            };
            pending.push((name.as_str(), file, gen, from, judged));
        }
        let judged: Vec<Box<dyn Fn(u64) -> bool + '_>> = pending
            .iter()
            .map(|(_, _, _, _, judged)| {
                let judged = *judged;
                Box::new(move |offset| judged.is_some_and(|j| j.contains_key(&offset)))
                    as Box<dyn Fn(u64) -> bool + '_>
            })
            .collect();
        let inboxes: Vec<Pending<'_>> = pending
            .into_iter()
            .zip(&judged)
            .map(|((name, file, gen, from, _), judged)| Pending {
                name,
                file,
                gen,
                from,
                judged: judged.as_ref(),
            })
            .collect();
        Turns::scan(&inboxes, self.limits.max_line_bytes)
    }

    /// The verdict on one complete line, and whether it is a line of the judge's own that
    /// only its seal shows (the journal lost its intent).
    fn judge_bytes<'a>(
        &self,
        name: &str,
        bytes: &'a [u8],
    ) -> (Verdict, Option<Envelope<'a>>, bool) {
        // The judge's own line: an id it journaled and, while its intent is open, exactly the
        // line it means to write, in the inbox it means; or a line under its seal (one the
        // journal lost). Anyone can predict a reserved id; a copy elsewhere or with other
        // words must not pass for the bridge's line, close the intent and stop the real one.
        let snapshot = &self.snapshot;
        let intents = &self.snapshot.intents;
        let seal = &self.seal;
        let sealed = std::cell::Cell::new(false);
        let own = |id: &str| match intents.get(id) {
            Some(intent) => {
                intent.inbox == name && (intent.line.as_bytes() == bytes || seal.verifies(bytes))
            }
            None if snapshot.is_own(id) => true,
            None => {
                let verified = seal.verifies(bytes);
                sealed.set(verified);
                verified
            }
        };
        let (verdict, envelope) = judge_line(
            bytes,
            name,
            &self.limits,
            &self.registry,
            &self.snapshot.ledger,
            &own,
        );
        (verdict, envelope, sealed.get())
    }

    /// A line of the judge's own that the journal does not know (it was lost or damaged):
    /// journal the intent it was written for, so the ledger counts its ring and nothing
    /// writes it again. The intent is dated when the line was written.
    fn recognise_own(
        &mut self,
        name: &str,
        bytes: &[u8],
        envelope: &Envelope<'_>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let id: &str = &envelope.id;
        // When it was written, as it says (never later than now).
        let at = envelope.created_at.min(now);
        let mut record = Record::new(name, 0, 0, Word::Intent, at.timestamp_millis());
        record.id = Some(id.to_owned());
        record.write = Some(String::from_utf8_lossy(bytes).into_owned());
        let request = envelope.correlates_to.as_deref().unwrap_or_default();
        let parts: Vec<&str> = id.split(':').collect();
        record.ring = match parts.as_slice() {
            ["ring", _, epoch, n] => epoch.parse().ok().zip(n.parse().ok()),
            ["escalation", _, epoch] => epoch.parse().ok().map(|e| (e, 0)),
            _ => None,
        }
        .map(|(epoch, ring)| RingRef {
            request: request.to_owned(),
            epoch,
            ring,
        });
        // A refusal notice names its lines in its data part: they are told already.
        if id.starts_with("bridge:refused:") {
            record.covers = notice_covers(bytes);
        }
        tracing::info!(
            inbox = name,
            id,
            "a line of the judge's own that the journal lost: known by its seal, not written again"
        );
        self.journal.append(&record)?;
        self.snapshot.apply(record);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        name: &str,
        gen: u32,
        offset: u64,
        span: u64,
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
        }
        record.line = accepted;
        // A verdict that rests on a lookup the index failed to answer is never journaled:
        // the judge stops, the index is rebuilt, and the line judged again.
        if let Some(error) = self.snapshot.failed_lookup() {
            tracing::error!(%error, "the index failed a lookup: it is rebuilt from the journal before judging goes on");
            if let Some(saver) = &mut self.saver {
                let _ = saver.settle();
            }
            crate::checkpoint::discard(&crate::index::index_path(
                self.bridge.state_dir()?.as_path(),
            ))?;
            return Err(error);
        }
        self.journal.append(&record)?;
        self.refused_log.log(&record);
        self.snapshot.apply(record);
        // A long catch-up saves as it goes: memory holds a batch or two, never the whole
        // backlog. With a saving thread the save overlaps the judging of the next batch.
        let unsaved = self.snapshot.unsaved_lines();
        if unsaved >= crate::journal::REPLAY_BATCH {
            if self.saver.is_none() {
                self.checkpoint()?;
            } else if !self.checkpoint_in_background()?
                && unsaved >= 2 * crate::journal::REPLAY_BATCH
            {
                // The saving thread is behind: wait for it rather than hold more.
                self.settle()?;
                self.checkpoint_in_background()?;
            }
        }
        Ok(())
    }
}

/// Become the judge for a moment: judge everything waiting, write what is due, save, let go.
/// What `daemon --once` does.
pub fn once(bridge: Bridge, lock: BridgeLock) -> Result<CatchUp> {
    let mut judge = Judge::open(bridge, lock)?;
    judge.save_in_background();
    let stats = judge.catch_up(Utc::now())?;
    judge.checkpoint()?;
    Ok(stats)
}

/// What `compact` did.
#[derive(Debug, Default)]
pub struct Compaction {
    /// The segment sealed, when no other judge ran.
    pub sealed: Option<u64>,
    pub compressed: crate::segments::Compacted,
}

/// Seal the live journal (when no other judge holds the bridge: a running daemon seals its
/// own), then compress every sealed segment below the live one.
pub fn compact(bridge: &Bridge) -> Result<Compaction> {
    let state = bridge.state_dir()?;
    let mut done = Compaction::default();
    let live = match BridgeLock::try_acquire(bridge, "doorbell compact")? {
        Some(lock) => {
            let mut judge = Judge::open(bridge.clone(), lock)?;
            judge.catch_up(Utc::now())?;
            let sealed = judge.snapshot.segment;
            if !judge.journal.is_empty() {
                judge.roll()?;
                done.sealed = Some(sealed);
            }
            judge.snapshot.segment
        }
        None => Snapshot::load(bridge)?.segment,
    };
    done.compressed = crate::segments::compress_below(&state, live)?;
    Ok(done)
}

/// The judge's state as the disk has it.
struct Loaded {
    snapshot: Snapshot,
    journal: JournalWriter,
    refused_log: RefusedLog,
    index: IndexWriter,
}

/// The judge's state as the disk has it: the index's last save, the journal's tail replayed
/// onto it (the whole journal for a new or rebuilt index, saved as it goes so memory holds a
/// batch), the journal opened for appending (a torn last record cut off) and the refused log
/// (with what it missed of the tail written now).
///
/// A damaged record in the live journal (its checksum, its JSON) cuts the journal there: the
/// damaged part is kept beside it, and what it no longer says is judged again from the
/// inboxes, where the judge knows its own lines by their seal.
fn load(bridge: &Bridge, journal_path: &std::path::Path) -> Result<Loaded> {
    let mut rebuilding = false;
    let mut lost = false;
    loop {
        match load_from_index(bridge, journal_path, rebuilding, lost) {
            Err(Error::Index { path, message }) if !rebuilding => {
                tracing::error!(path = %path.display(), %message, "the index cannot be used: rebuilding it from the journal (no line is judged again)");
                crate::checkpoint::discard(&path)?;
                rebuilding = true;
            }
            Err(Error::JournalBehindIndex {
                path,
                index_len,
                journal_len,
            }) if !rebuilding => {
                tracing::error!(index = %path.display(), index_covers = index_len, journal_has = journal_len, "the journal is shorter than the index says (cut, lost or restored from an older backup): rebuilding the index from what the journal still has; the lines it no longer judges are judged again from the inboxes, and the judge's own lines are known by their seal, so no ring or notice is written twice");
                crate::checkpoint::discard(&path)?;
                rebuilding = true;
            }
            Err(Error::CorruptJournal {
                path,
                line,
                offset,
                message,
            }) if path == journal_path => {
                cut_damaged(journal_path, line, offset, &message)?;
                lost = true;
            }
            other => return other,
        }
    }
}

/// The `inbox/gen/offset` keys of the refusals a notice line names in its data part.
fn notice_covers(bytes: &[u8]) -> Vec<String> {
    let Ok(line) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return Vec::new();
    };
    let parts = line["message"]["parts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    parts
        .iter()
        .filter_map(|part| part["data"]["refused"].as_array())
        .flatten()
        .filter_map(|r| {
            let gen = u32::try_from(r["generation"].as_u64()?).ok()?;
            Some(refusal_key(
                r["inbox"].as_str()?,
                gen,
                r["offset"].as_u64()?,
            ))
        })
        .collect()
}

/// Keep the journal from `offset` on in a file beside it, then cut the journal there. Every
/// cut shortens the journal, so loading again ends.
fn cut_damaged(journal: &std::path::Path, line: u64, offset: u64, message: &str) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let mut input = File::open(journal).map_err(Error::io("open journal", journal))?;
    let stamp = Utc::now().timestamp_millis();
    let (aside, made) = (0..u32::MAX)
        .map(|n| {
            let suffix = if n == 0 {
                String::new()
            } else {
                format!("-{n}")
            };
            let aside = journal.with_file_name(format!("journal.damaged-{stamp}{suffix}.jsonl"));
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&aside);
            (aside, made)
        })
        .find(|(_, made)| !matches!(made, Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists))
        .expect("a free name");
    let mut out = made.map_err(Error::io("keep damaged journal", &aside))?;
    input
        .seek(SeekFrom::Start(offset))
        .and_then(|_| std::io::copy(&mut input, &mut out))
        .and_then(|_| out.sync_all())
        .map_err(Error::io("keep damaged journal", &aside))?;
    let cut = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(journal)
        .and_then(|f| f.set_len(offset).and_then(|()| f.sync_all()));
    cut.map_err(Error::io("cut damaged journal", journal))?;
    tracing::error!(
        journal = %journal.display(),
        record = line,
        byte = offset,
        problem = message,
        kept = %aside.display(),
        "the journal is damaged: cut at the damaged record, the rest kept beside it; what it no longer says is judged again from the inboxes, and the judge's own lines are known by their seal, so no ring or notice is written twice"
    );
    Ok(())
}

fn load_from_index(
    bridge: &Bridge,
    journal_path: &std::path::Path,
    rebuilding: bool,
    lost: bool,
) -> Result<Loaded> {
    let state = bridge.state_dir()?;
    let index_path = crate::index::index_path(&state);
    if !rebuilding && crate::index::damage_mark(&index_path).exists() {
        return Err(Error::Index {
            path: index_path,
            message: "a reader found it damaged".into(),
        });
    }
    let (mut writer, fresh) = crate::checkpoint::open_index(&index_path)?;
    let mut snapshot = open_snapshot(&index_path)?;
    finish_roll(&state, journal_path, snapshot.segment)?;
    let journal_size = std::fs::metadata(journal_path).map_or(0, |m| m.len());
    if snapshot.journal_len > journal_size {
        return Err(Error::JournalBehindIndex {
            path: index_path,
            index_len: snapshot.journal_len,
            journal_len: journal_size,
        });
    }
    let tail_from = snapshot.journal_len;
    let timing = timing_of(bridge);
    if fresh && journal_size > 0 && !rebuilding {
        if crate::checkpoint::OLD_FILES
            .iter()
            .any(|name| state.join(name).exists())
        {
            tracing::info!(journal = %journal_path.display(), bytes = journal_size, "migrating: building the index from the journal");
        } else {
            tracing::warn!(path = %index_path.display(), journal = journal_size, "the index is missing: rebuilding it from the journal (no line is judged again)");
        }
    }
    if fresh && journal_size > 0 {
        // The index saved during the replay must never cover what is not durable.
        File::open(journal_path)
            .and_then(|f| f.sync_data())
            .map_err(Error::io("sync journal", journal_path))?;
    }
    if fresh {
        snapshot = replay_sealed(snapshot, &state, journal_path, &timing, &mut writer)?;
    }
    // Only refusals journaled after the last save can be missing from the refused log (a
    // crash between the two writes), so only their keys are looked for in it: memory
    // follows the journal's unsaved tail, never every refusal there ever was.
    let mut tail = HashSet::new();
    snapshot = Snapshot::replay_with(
        snapshot,
        journal_path,
        &mut |record| {
            if record.verdict == Word::Refused {
                tail.insert(refusal_key(&record.inbox, record.gen, record.offset));
            }
        },
        &mut |snapshot| {
            let changes = snapshot.take_changes(&timing);
            writer.save(&changes)?;
            snapshot.saved(changes.seq);
            Ok(())
        },
    )?;
    if fresh {
        let changes = snapshot.take_changes(&timing);
        writer.save(&changes)?;
        snapshot.saved(changes.seq);
        snapshot.timing = Some(timing.key());
        crate::checkpoint::retire_old(&state);
    }
    if snapshot.timing.as_deref() != Some(timing.key().as_str()) {
        // The due times were saved with another schedule (or none yet): save them again.
        snapshot.load_open_requests()?;
        snapshot.ledger.touch_open();
        let changes = snapshot.take_changes(&timing);
        writer.save(&changes)?;
        snapshot.saved(changes.seq);
        snapshot.timing = Some(timing.key());
    }
    // A new index, or a journal cut short: refusals judged again may be in the log already.
    let mut refused_log = RefusedLog::open(&state, (!(fresh || lost)).then_some(&tail))?;
    if !tail.is_empty() {
        drop(tail);
        JournalFollower::new(journal_path.to_path_buf(), tail_from)
            .read(&mut |record| refused_log.log(&record))?;
    }
    refused_log.flush()?;
    let journal = JournalWriter::open(journal_path, snapshot.journal_len)?;
    Ok(Loaded {
        snapshot,
        journal,
        refused_log,
        index: writer,
    })
}

/// Step 3 of a roll that died before it: the index already names the next segment, but the
/// live file is still the sealed one. Replace it with an empty one.
fn finish_roll(state: &std::path::Path, live: &std::path::Path, segment: u64) -> Result<()> {
    let Some(previous) = segment.checked_sub(1) else {
        return Ok(());
    };
    if crate::segments::same_file(&crate::segments::sealed_path(state, previous), live) {
        tracing::warn!(
            segment = previous,
            "finishing a journal roll that stopped half way"
        );
        crate::segments::start_empty(live)?;
    }
    Ok(())
}

/// A new index is built from every sealed segment first, oldest first, saving as it goes;
/// the live journal (the next segment) is replayed after, as a tail.
fn replay_sealed(
    mut snapshot: Snapshot,
    state: &std::path::Path,
    live: &std::path::Path,
    timing: &crate::index::Timing,
    writer: &mut IndexWriter,
) -> Result<Snapshot> {
    for sealed in crate::segments::list(state)? {
        // A roll that stopped after its first step: that segment is the live one.
        if !sealed.compressed && crate::segments::same_file(&sealed.path, live) {
            snapshot.segment = sealed.number;
            snapshot.journal_len = 0;
            break;
        }
        tracing::info!(segment = sealed.number, path = %sealed.path.display(), "building the index: replaying a sealed journal segment");
        let (file, _unpacked) = crate::segments::open(&sealed)?;
        snapshot.segment = sealed.number;
        snapshot.journal_len = 0;
        let mut save = |snapshot: &mut Snapshot| -> Result<()> {
            let changes = snapshot.take_changes(timing);
            writer.save(&changes)?;
            snapshot.saved(changes.seq);
            Ok(())
        };
        snapshot = Snapshot::replay_file(snapshot, &file, &sealed.path, &mut |_| {}, &mut save)?;
        // Saved as covering the whole segment: a load after this one starts at the next.
        snapshot.segment = sealed.number + 1;
        snapshot.journal_len = 0;
        save(&mut snapshot)?;
    }
    Ok(snapshot)
}

fn timing_of(bridge: &Bridge) -> crate::index::Timing {
    let debts = &bridge.config.debts;
    crate::index::Timing {
        schedule: Schedule {
            ring_after: debts.ring_after,
            backoff: debts.backoff,
            max_rings: debts.max_rings,
        },
        human: bridge.config.human.clone(),
    }
}

fn open_snapshot(index_path: &std::path::Path) -> Result<Snapshot> {
    let index = Index::open_read(index_path)?.ok_or_else(|| Error::Index {
        path: index_path.to_path_buf(),
        message: "missing".into(),
    })?;
    index.hold_lookups();
    Snapshot::from_index(Some(std::sync::Arc::new(index)))
}

/// The id and sender a line claims, read as leniently as possible, for telling the sender
/// about a line that could not be judged as an envelope.
fn identity_of(bytes: &[u8]) -> (Option<String>, Option<String>) {
    #[derive(serde::Deserialize)]
    struct Claimed {
        id: Option<serde_json::Value>,
        from: Option<serde_json::Value>,
    }
    let Ok(claimed) = serde_json::from_slice::<Claimed>(bytes.strip_suffix(b"\r").unwrap_or(bytes))
    else {
        return (None, None);
    };
    let id = claimed
        .id
        .and_then(|v| v.as_str().map(str::to_owned))
        .filter(|id| doorbell_core::is_id(id));
    let from = claimed
        .from
        .and_then(|v| v.as_str().map(str::to_owned))
        .filter(|f| is_agent_name(f));
    (id, from)
}
