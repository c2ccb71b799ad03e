//! Opening the judge: the journal read (or the index and the journal's tail past it), a damaged
//! record cut, the index rebuilt from the sealed segments and the live journal when it is
//! missing, damaged or behind.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use chrono::Utc;
use doorbell_core::debts::Schedule;
use doorbell_core::notice::refusal_key;
use doorbell_core::Limits;

use super::Judge;
use crate::index::{Index, IndexWriter};
use crate::journal::{journal_path, JournalFollower, JournalWriter, Snapshot, Word};
use crate::reader::LineReader;
use crate::refused::RefusedLog;
use crate::{Bridge, BridgeLock, Error, Result};

/// The judge's state as the disk has it.
pub(super) struct Loaded {
    pub(super) snapshot: Snapshot,
    pub(super) journal: JournalWriter,
    pub(super) refused_log: RefusedLog,
    pub(super) index: IndexWriter,
}

/// The judge's state as the disk has it: the index's last save, the journal's tail replayed
/// onto it (the whole journal for a new or rebuilt index, saved as it goes so memory holds a
/// batch), the journal opened for appending (a torn last record cut off) and the refused log
/// (with what it missed of the tail written now).
///
/// A damaged record in the live journal (its checksum, its JSON) cuts the journal there: the
/// damaged part is kept beside it, and what it no longer says is judged again from the
/// inboxes, where the judge knows its own lines by their seal.
pub(super) fn load(bridge: &Bridge, journal_path: &std::path::Path) -> Result<Loaded> {
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

/// Keep the journal from `offset` on in a file beside it, then cut the journal there. Every
/// cut shortens the journal, so loading again ends.
pub(super) fn cut_damaged(
    journal: &std::path::Path,
    line: u64,
    offset: u64,
    message: &str,
) -> Result<()> {
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

pub(super) fn load_from_index(
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
    if !bridge.config.remotes.is_empty() {
        writer.ensure_pair_index()?;
    }
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
pub(super) fn finish_roll(
    state: &std::path::Path,
    live: &std::path::Path,
    segment: u64,
) -> Result<()> {
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
pub(super) fn replay_sealed(
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

pub(super) fn timing_of(bridge: &Bridge) -> crate::index::Timing {
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

pub(super) fn open_snapshot(index_path: &std::path::Path) -> Result<Snapshot> {
    let index = Index::open_read(index_path)?.ok_or_else(|| Error::Index {
        path: index_path.to_path_buf(),
        message: "missing".into(),
    })?;
    index.hold_lookups();
    Snapshot::from_index(Some(std::sync::Arc::new(index)))
}

impl Judge {
    /// Become the judge: load the checkpoint, replay the journal's tail, open it for appending.
    pub fn open(bridge: Bridge, lock: BridgeLock) -> Result<Judge> {
        // What a killed process left half-written (a reader's cursor, a board) goes, once
        // per judge rather than on every read.
        crate::atomic::remove_stale_temps(bridge.dir());
        if let Ok(state) = bridge.state_dir() {
            crate::atomic::remove_stale_temps(&state.join(crate::cursor::READS_DIR));
        }
        let limits = Limits {
            max_line_bytes: bridge.max_line_bytes(),
        };
        // The names this judge goes by, published before the journal is read (which can
        // take a while): a sender checks against them while this judge holds the bridge.
        let inboxes = bridge.inboxes()?;
        let registry = bridge.registry_of(inboxes.clone())?;
        let inbox_names: BTreeSet<String> = inboxes.into_iter().collect();
        let names = crate::bridge::names_file(&registry, &inbox_names, limits.max_line_bytes);
        let published_names = (bridge.published_names().as_ref() == Some(&names)
            || bridge.publish_names(&names).is_ok())
        .then_some(names);
        let journal_path = journal_path(&bridge);
        let Loaded {
            snapshot,
            journal,
            refused_log,
            index,
        } = load(&bridge, &journal_path)?;
        let (seal, made) = crate::seal::Seal::open(&bridge.state_dir()?)?;
        Ok(Judge {
            seal,
            adopting: made.then_some(0),
            reader: LineReader::new(limits.max_line_bytes),
            sharing: crate::halves::Sharing::of_this_machine(),
            registry,
            inbox_names,
            published_names,
            unreadable: BTreeSet::new(),
            waiting_on_unreadable: BTreeSet::new(),
            readable_again: false,
            doubles: BTreeSet::new(),
            locked_inboxes: BTreeSet::new(),
            unwritable_inboxes: BTreeSet::new(),
            spaced: false,
            told_at: HashMap::new(),
            bridge,
            lock,
            journal_path,
            saved_len: snapshot.journal_len,
            saver: None,
            making_lookups: None,
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
        // Lookups being made finish first too (the index read again makes what is missing).
        drop(self.making_lookups.take());
        if let Some(saver) = &mut self.saver {
            let _ = saver.settle();
            // Its connection may be to an index that is rebuilt now.
            let live = saver.gives_way();
            *saver = crate::checkpoint::Saver::start();
            if live {
                saver.give_way();
            }
        }
        let copy = self.journal.keeps_copy();
        self.journal.abandon();
        self.refused_log.abandon();
        let loaded = load(&self.bridge, &self.journal_path)?;
        self.saved_len = loaded.snapshot.journal_len;
        self.snapshot = loaded.snapshot;
        self.journal = loaded.journal;
        if copy {
            // What the given-up writer appended was never told: who follows reads the file.
            self.journal.keep_copy();
            self.journal.lose_copy();
        }
        self.refused_log = loaded.refused_log;
        self.index = loaded.index;
        if self.index.lookups_deferred() {
            // Rebuilt here from the journal (the index was lost or damaged), and saved whole:
            // a long-running judge has no first catch-up left to make the lookups after.
            self.index.finish()?;
        }
        // The open files stay: an old one not yet drained is compared with the reloaded
        // journal and drained from where it says.
        self.holds = 0;
        if std::mem::take(&mut self.open_loaded) {
            self.keep_open_in_memory()?;
        }
        self.refresh_registry()
    }
}
