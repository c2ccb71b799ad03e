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
//!
//! A line's way through, one file each: `tail.rs` reads it from its inbox, `verdicts.rs`
//! judges it (holding it when it must wait), `record.rs` journals the verdict before anything
//! acts on it, `emit.rs` writes what follows from it (notices, rings, report notes).
//! `open.rs` opens the judge from the journal and the index.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use doorbell_core::{Kind, Limits, Registry};

use crate::bridge::Stray;
use crate::index::IndexWriter;
use crate::journal::{JournalWriter, Snapshot};
use crate::reader::LineReader;
use crate::refused::RefusedLog;
use crate::{Bridge, BridgeLock, Result};

mod emit;
mod open;
mod record;
mod tail;
mod unnamed;
mod verdicts;

use open::timing_of;
pub use record::PendingCheckpoint;
pub(crate) use tail::is_blank;
use tail::OpenInbox;
use verdicts::{Held, HeldLines};

/// How much of each inbox a sweep of several reads before going on to the next: a round.
/// At 1 MiB a catch-up of 500,000 messages in ten inboxes took a fifth less time and a
/// fifth less memory than reading each inbox to its end in turn.
const ROUND_BYTES: u64 = 1 << 20;

/// How much of its inboxes a telling sweep ([`Judge::sweep_telling`]) judges before it tells
/// what it journaled: a burst reaches its watchers in steps while the rest is judged.
const TELL_BYTES: u64 = 64 << 10;

/// How many times a catch-up reads back what it wrote and tells what that judged.
const READ_BACK_ROUNDS: usize = 8;

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
    /// `line` was accepted in `inbox`.
    pub fn arrived(&mut self, inbox: &str, line: &doorbell_core::Accepted) {
        let entry = match self.arrivals.get_mut(inbox) {
            Some(entry) => entry,
            None => self.arrivals.entry(inbox.to_owned()).or_insert(Arrival {
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

/// The bridge's judge: the lock, the journal and the state it rebuilds.
#[derive(Debug)]
pub struct Judge {
    /// A new index's lookups, being made on a thread of their own while the first
    /// catch-up writes its notices ([`Judge::lookups_made`]).
    making_lookups: Option<record::MakingLookups>,
    bridge: Bridge,
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
    /// How many threads help parse a long read's lines (`halves`).
    sharing: crate::halves::Sharing,
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
    /// Inboxes a notice could not be written to for another reason (a read-only file):
    /// said once, until a notice is written there.
    unwritable_inboxes: BTreeSet<String>,
    /// Whether refusal notices to one sender are spaced by the config's `notice_every` (a
    /// long-running judge's: a bot that repeats its mistake gets one notice for a run of
    /// them, not one each).
    spaced: bool,
    /// When each sender was last sent a refusal notice, by this process.
    told_at: HashMap<String, DateTime<Utc>>,
    /// What seals the judge's own lines, so a rebuild knows them without the journal.
    seal: crate::seal::Seal,
    /// `Some` when the key was made by this judge (lost with the state folder, or damaged):
    /// until its first catch-up ends, a line that carries a seal of the right shape under a
    /// reserved id is taken as the judge's own, written under the key that is gone, and
    /// counted here. Lines written after that catch-up must verify.
    adopting: Option<usize>,
    /// Last: fields are dropped in order, and a judge dropped lets the bridge go only once
    /// nothing of it writes the index (its lookups' thread, its connections).
    lock: BridgeLock,
}

impl Judge {
    /// Bring every open request into memory and keep them there: a long-running judge rings
    /// them without asking the index.
    pub fn keep_open_in_memory(&mut self) -> Result<()> {
        self.snapshot.load_open_requests()?;
        self.open_loaded = true;
        Ok(())
    }

    /// Judge a new id without asking the index (`ids.rs`). Whatever is judged and not yet
    /// saved (the journal's tail replayed at open) is saved first: the filter takes only
    /// the claims made after it, and the ids saved before its read.
    pub fn filter_ids(&mut self) -> Result<()> {
        if self.snapshot.unsaved_lines() > 0 || self.journal.len() != self.saved_len {
            self.checkpoint()?;
        }
        if let Some(index) = self.snapshot.index() {
            index.filter_ids();
        }
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

    pub(super) fn refresh_registry(&mut self) -> Result<()> {
        // One listing of the folder for both.
        let inboxes = self.bridge.inboxes()?;
        self.registry = self.bridge.registry_of(inboxes.clone())?;
        self.inbox_names = inboxes.into_iter().collect();
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
        let text = crate::bridge::names_file(
            &self.registry,
            &self.inbox_names,
            self.limits.max_line_bytes,
        );
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
        for file in self.bridge.files_nothing_reads()? {
            match file {
                Stray::NotRegular(path) => {
                    tracing::warn!(path = %path.display(), "refusing an inbox that is not a regular file");
                }
                Stray::Reserved(path) => {
                    tracing::warn!(path = %path.display(), "a file named as the inbox of a built-in loop or 'all' is no inbox: nothing reads it");
                }
                Stray::NearMiss { path, meant } => {
                    tracing::warn!(path = %path.display(), meant = meant.as_deref().unwrap_or("-"), "a file named close to an inbox is no inbox: nothing reads it");
                }
            }
        }
        let before = self.journal.len();
        let mut stats = self.sweep_all(now)?;
        if self.index.lookups_deferred() {
            // Everything judged goes into the new index before its lookups are made. They
            // are made beside the notices: nothing the notices ask needs them (the requests
            // due are found without them), and they are there before the next save.
            self.checkpoint()?;
            self.make_lookups()?;
        }
        let mut targets = self.emit(now, &mut stats)?;
        // Reading the notices back can find a refusal to tell in turn: a notice ends the
        // fragment a dying writer left in its inbox, and a fragment that names its sender is
        // told. Each round ends fragments, so a few are all there can be; what is left is
        // told by the next judge.
        for _ in 0..READ_BACK_ROUNDS {
            if targets.is_empty() {
                break;
            }
            let again = self.sweep(&targets, now)?;
            stats.absorb(again);
            if !self.has_untold() {
                break;
            }
            targets = self.emit(now, &mut stats)?;
        }
        if let Some(lines @ 1..) = self.adopting.take() {
            tracing::warn!(
                lines,
                "the seal key was missing or damaged (the state folder lost or restored without it): lines the judge sealed under its earlier key are taken as its own, so no ring, notice or escalation is written twice; lines written from now on must carry the new key's seal"
            );
        }
        self.lookups_made()?;
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

    /// Stop when the state folder is no longer this judge's. Judging on into files another
    /// judge no longer sees would judge every line twice; on after a journal restored under
    /// it, it would journal past what the restore left as if that were its own.
    pub(super) fn state_is_ours(&self) -> Result<()> {
        if self.lock.still_held()? && self.journal.is_still_ours()? {
            return Ok(());
        }
        // Named, never made: the folder may be missing half way through a restore.
        Err(crate::Error::StateReplaced {
            dir: self.bridge.dir().join(crate::bridge::STATE_DIR),
        })
    }

    /// Judge the unjudged lines of `names`. When a line waits for a request that is not in
    /// the ledger, every other inbox is read to its end before the line is refused.
    pub fn sweep(&mut self, names: &[String], now: DateTime<Utc>) -> Result<CatchUp> {
        self.sweep_with(names, now, None)
    }

    /// [`Judge::sweep`], telling `tell` what was journaled ([`Judge::take_appended`]) every
    /// [`TELL_BYTES`] or so of lines while no line is held, so that the first lines of a long
    /// run reach a watcher while the rest is judged. What the sweep journals after its last
    /// tell is left for the caller to take.
    pub fn sweep_telling(
        &mut self,
        names: &[String],
        now: DateTime<Utc>,
        tell: &mut dyn FnMut(crate::journal::Appended),
    ) -> Result<CatchUp> {
        self.sweep_with(names, now, Some(tell))
    }

    fn sweep_with(
        &mut self,
        names: &[String],
        now: DateTime<Utc>,
        mut tell: Option<&mut dyn FnMut(crate::journal::Appended)>,
    ) -> Result<CatchUp> {
        self.state_is_ours()?;
        // A file named for a loop of the config is no inbox (`Bridge::inboxes`).
        if names.iter().any(|name| self.bridge.is_config_loop(name)) {
            let inboxes: Vec<String> = names
                .iter()
                .filter(|name| !self.bridge.is_config_loop(name))
                .cloned()
                .collect();
            return self.sweep_with(&inboxes, now, tell);
        }
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
        // A long backlog in several inboxes is read in rounds, a little of each inbox in
        // turn, as a live judge sees them grow: each save of the index then covers a short
        // stretch of time (ids made in time order go in near each other, not all over its
        // B-trees), and fewer lines wait for their turn in memory.
        let budget = if tell.is_some() {
            Some(TELL_BYTES)
        } else {
            (names.len() > 1).then_some(ROUND_BYTES)
        };
        loop {
            let mut more = false;
            for name in names {
                more |= self.sweep_one(name, now, budget, &mut held, &mut stats)?;
            }
            if !more {
                break;
            }
            // While a line is held, the lines read after it are journaled before it: nothing
            // is told until the sweep's end judges it, so what is told never runs ahead of
            // an unjudged line.
            if let Some(tell) = tell.as_mut().filter(|_| held.none_aside()) {
                if let Some(appended) = self.take_appended()? {
                    tell(appended);
                }
            }
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
                self.sweep_one(name, now, None, &mut held, &mut stats)?;
            }
        }
        // Every inbox has been read to its end after the held lines were read: what is still
        // held answers no request. Unless an inbox could not be read: its request may be
        // there, so the line waits, unjudged, and its inbox is swept again once that one
        // can be read.
        let mut rest = verdicts::last_held_in_order(held.by_request);
        if !self.unreadable.is_empty() {
            self.waiting_on_unreadable
                .extend(rest.drain(..).map(|line| line.inbox));
        }
        // What still waits for its turn (the line before it was never judged in this sweep)
        // is judged now, in the order of the turns, and before the held lines: a line with
        // the id of a waiting one waits among them.
        let mut waiting: Vec<(Option<crate::turns::Rank>, Held)> = held
            .waiting
            .drain()
            .map(|(place, line)| (held.turns.order_of(&place), line))
            .collect();
        waiting.sort_by_key(|(rank, _)| *rank);
        // A held line that comes before a waiting one in its turns (an id's first claim, held
        // for its request) is judged before it, as it was written before it; and so is every
        // held line judged before that one (the lines written before it in its own inbox
        // among them), but those written after the waiting line in its inbox.
        let mut lines = Vec::with_capacity(waiting.len() + rest.len());
        for (_, line) in waiting {
            let before = held
                .turns
                .before(&(line.inbox.clone(), line.gen, line.offset));
            let last_before = rest.iter().rposition(|held: &verdicts::Held| {
                before.contains(&(held.inbox.clone(), held.gen, held.offset))
            });
            if let Some(last) = last_before {
                let (after_it, first): (Vec<_>, Vec<_>) =
                    rest.drain(..=last).partition(|held: &verdicts::Held| {
                        (&held.inbox, held.gen) == (&line.inbox, line.gen)
                            && held.offset > line.offset
                    });
                lines.extend(first);
                rest.splice(0..0, after_it);
            }
            lines.push(line);
        }
        lines.extend(rest);
        for line in lines {
            self.judge_held(&line, None, now, &mut stats)?;
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
}

/// Become the judge for a moment: judge everything waiting, write what is due, save, let go.
/// What `daemon --once` does.
pub fn once(bridge: Bridge, lock: BridgeLock) -> Result<CatchUp> {
    let mut judge = Judge::open(bridge, lock)?;
    judge.save_in_background();
    judge.filter_ids()?;
    let stats = judge.catch_up(Utc::now())?;
    judge.checkpoint()?;
    Ok(stats)
}

/// What `compact` did.
#[derive(Debug, Default)]
pub struct Compaction {
    /// The segment sealed, when no other judge ran and the live journal held lines.
    pub sealed: Option<u64>,
    /// Another judge (a daemon) holds the bridge: it seals its live journal itself.
    pub judge_running: bool,
    pub compressed: crate::segments::Compacted,
}

/// Seal the live journal (when no other judge holds the bridge: a running daemon seals its
/// own), then compress every sealed segment below the live one.
pub fn compact(bridge: &Bridge) -> Result<Compaction> {
    let state = bridge.state_dir()?;
    let mut done = Compaction::default();
    let live = if let Some(lock) = BridgeLock::try_acquire(bridge, "doorbell compact")? {
        let mut judge = Judge::open(bridge.clone(), lock)?;
        judge.catch_up(Utc::now())?;
        let sealed = judge.snapshot.segment;
        if !judge.journal.is_empty() {
            judge.roll()?;
            done.sealed = Some(sealed);
        }
        judge.snapshot.segment
    } else {
        done.judge_running = true;
        Snapshot::load(bridge)?.segment
    };
    done.compressed = crate::segments::compress_below(&state, live)?;
    Ok(done)
}
