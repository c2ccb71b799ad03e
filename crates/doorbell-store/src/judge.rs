//! The judge: whoever holds the bridge lock. It reads every inbox from where the journal says
//! judging stopped, judges each complete line, journals the verdict, and only then applies it
//! to the ledger.
//!
//! Cross-inbox order: a response can sit in one inbox before the request it answers is read
//! from another. Such a line is held, not refused, until every inbox has been read to its
//! end; it is judged again the moment its request is accepted, and refused as
//! `unknown-request` only when the whole sweep found no such request.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::MetadataExt;

use chrono::{DateTime, Utc};
use doorbell_core::{judge_line, Kind, Limits, Refusal, RefusalReason, Registry, Verdict};

use crate::append::open_inbox;
use crate::hash::Marker;
use crate::journal::{journal_path, JournalWriter, Record, Snapshot, Word};
use crate::reader::{Line, LineReader};
use crate::{Bridge, BridgeLock, Error, Result};

/// What one catch-up did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CatchUp {
    pub accepted: u64,
    pub duplicate: u64,
    pub refused: u64,
    /// Inboxes found replaced or truncated and read again from the start.
    pub new_generations: u64,
}

impl CatchUp {
    #[must_use]
    pub fn judged(&self) -> u64 {
        self.accepted + self.duplicate + self.refused
    }
}

/// A line whose request has not been seen yet.
#[derive(Debug)]
struct Held {
    inbox: String,
    gen: u32,
    offset: u64,
    bytes: Vec<u8>,
}

/// The bridge's judge: the lock, the journal and the state it rebuilds.
#[derive(Debug)]
pub struct Judge {
    bridge: Bridge,
    _lock: BridgeLock,
    snapshot: Snapshot,
    journal: JournalWriter,
    limits: Limits,
    registry: Registry,
    /// Ids of lines the judge wrote itself (none yet: notices and rings come with the daemon).
    own_ids: BTreeSet<String>,
    reader: LineReader,
}

impl Judge {
    /// Become the judge: replay the journal and open it for appending.
    pub fn open(bridge: Bridge, lock: BridgeLock) -> Result<Judge> {
        bridge.state_dir()?;
        let path = journal_path(&bridge);
        let snapshot = Snapshot::load_path(&path)?;
        let journal = JournalWriter::open(&path, snapshot.journal_len)?;
        let limits = Limits {
            max_line_bytes: bridge.max_line_bytes(),
        };
        Ok(Judge {
            reader: LineReader::new(limits.max_line_bytes),
            registry: bridge.registry()?,
            bridge,
            _lock: lock,
            snapshot,
            journal,
            limits,
            own_ids: BTreeSet::new(),
        })
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

    /// Judge every unjudged complete line of every inbox, at the judge's time `now`.
    pub fn catch_up(&mut self, now: DateTime<Utc>) -> Result<CatchUp> {
        self.registry = self.bridge.registry()?;
        let mut stats = CatchUp::default();
        let mut held: HashMap<String, Vec<Held>> = HashMap::new();
        let names = self.bridge.inboxes()?;
        for name in &names {
            self.sweep(name, now, &mut held, &mut stats)?;
        }
        // Every inbox has been read to its end: what is still held answers no request.
        let mut rest: Vec<Held> = held.into_values().flatten().collect();
        rest.sort_by(|a, b| (&a.inbox, a.offset).cmp(&(&b.inbox, b.offset)));
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
        self.journal.sync()?;
        Ok(stats)
    }

    /// Read one inbox from where judging stopped to its end.
    fn sweep(
        &mut self,
        name: &str,
        now: DateTime<Utc>,
        held: &mut HashMap<String, Vec<Held>>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        let path = self.bridge.inbox_path(name)?;
        let file = match open_inbox(&path, false) {
            Ok(file) => file,
            Err(Error::NotRegularFile { path }) => {
                tracing::warn!(path = %path.display(), "refusing an inbox that is not a regular file");
                return Ok(());
            }
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(())
            }
            Err(e) => return Err(e),
        };
        let gen = self.check_generation(name, &file, now, stats)?;
        let start = self.snapshot.inboxes[name].judged_to;
        let beyond = self.snapshot.inboxes[name].judged_beyond.clone();
        let mut reader = std::mem::replace(&mut self.reader, LineReader::new(0));
        let result = reader.read(&file, start, |line| {
            if beyond.contains_key(&line.offset()) {
                return Ok(());
            }
            match line {
                Line::TooLong { offset, len } => {
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
        let marked = self.snapshot.inboxes[name].mark.map(|(offset, _)| offset);
        if end > 0 && marked != Some(end) {
            if let Some(marker) = Marker::of(&file, end).map_err(Error::io("read inbox", &path))? {
                self.mark(name, gen, end, &file, Some(marker), now)?;
            }
        }
        Ok(())
    }

    /// Make sure the journal's view of the inbox belongs to this very file; start a new
    /// generation when it was truncated, replaced or recreated.
    fn check_generation(
        &mut self,
        name: &str,
        file: &File,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<u32> {
        let meta = file.metadata().map_err(Error::io("stat inbox", name))?;
        let known = self.snapshot.inboxes.get(name);
        let Some(known) = known else {
            self.mark(name, 0, 0, file, None, now)?;
            return Ok(0);
        };
        let resume = known
            .judged_to
            .max(known.mark.map_or(0, |(offset, _)| offset));
        let same = known.dev == meta.dev()
            && known.ino == meta.ino()
            && meta.len() >= resume
            && match known.mark {
                Some((offset, marker)) => marker.matches(file, offset).unwrap_or(false),
                None => true,
            };
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
        self.mark(name, gen, 0, file, None, now)?;
        Ok(gen)
    }

    fn mark(
        &mut self,
        name: &str,
        gen: u32,
        offset: u64,
        file: &File,
        marker: Option<Marker>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let meta = file.metadata().map_err(Error::io("stat inbox", name))?;
        let record = Record {
            inbox: name.to_owned(),
            gen,
            offset,
            span: 0,
            verdict: Word::Mark,
            seen_at: now.timestamp_millis(),
            reason: None,
            detail: None,
            id: None,
            from: None,
            line: None,
            dev: Some(meta.dev()),
            ino: Some(meta.ino()),
            marker,
        };
        self.journal.append(&record)?;
        self.snapshot.apply(record);
        Ok(())
    }

    /// Judge one complete line; `held` is where a line waiting for its request goes while
    /// the sweep is still running (`None` once every inbox was read).
    #[allow(clippy::too_many_arguments)]
    fn judge_complete(
        &mut self,
        name: &str,
        gen: u32,
        offset: u64,
        bytes: &[u8],
        now: DateTime<Utc>,
        mut held: Option<&mut HashMap<String, Vec<Held>>>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        let own = |id: &str| self.own_ids.contains(id);
        let (verdict, envelope) = judge_line(
            bytes,
            name,
            &self.limits,
            &self.registry,
            &self.snapshot.ledger,
            &own,
        );
        if let (Verdict::Refused(refusal), Some(envelope), Some(held)) =
            (&verdict, &envelope, held.as_deref_mut())
        {
            if refusal.reason == RefusalReason::UnknownRequest {
                let request = envelope.correlates_to.as_deref().unwrap_or_default();
                held.entry(request.to_owned()).or_default().push(Held {
                    inbox: name.to_owned(),
                    gen,
                    offset,
                    bytes: bytes.to_vec(),
                });
                return Ok(());
            }
        }
        let accepted = match (&verdict, &envelope) {
            (Verdict::Accepted, Some(envelope)) => Some(self.snapshot.ledger.accepted(envelope)),
            _ => None,
        };
        let new_request = accepted
            .as_ref()
            .filter(|a| a.kind == Kind::Request)
            .map(|a| a.id.clone());
        // Refused and duplicate lines keep their id and sender for notices; accepted ones
        // carry them in `accepted`.
        let identity = envelope
            .as_ref()
            .filter(|_| accepted.is_none())
            .map(|e| (e.id.to_string(), e.from.to_string()));
        let span = bytes.len() as u64 + 1;
        self.record(
            name, gen, offset, span, &verdict, identity, accepted, now, stats,
        )?;
        // Lines that were waiting for this request can be judged now.
        if let (Some(id), Some(held)) = (new_request, held) {
            for line in held.remove(&id).unwrap_or_default() {
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
        identity: Option<(String, String)>,
        accepted: Option<doorbell_core::Accepted>,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        let (word, reason, detail) = match verdict {
            Verdict::Accepted => {
                stats.accepted += 1;
                (Word::Accepted, None, None)
            }
            Verdict::Duplicate => {
                stats.duplicate += 1;
                (Word::Duplicate, None, None)
            }
            Verdict::Refused(refusal) => {
                stats.refused += 1;
                (
                    Word::Refused,
                    Some(refusal.reason.code().to_owned()),
                    Some(refusal.detail.clone()),
                )
            }
        };
        let (id, from) = match (&accepted, identity) {
            (None, Some((id, from))) => (Some(id), Some(from)),
            _ => (None, None),
        };
        let line = accepted;
        let record = Record {
            inbox: name.to_owned(),
            gen,
            offset,
            span,
            verdict: word,
            seen_at: now.timestamp_millis(),
            reason,
            detail,
            id,
            from,
            line,
            dev: None,
            ino: None,
            marker: None,
        };
        self.journal.append(&record)?;
        self.snapshot.apply(record);
        Ok(())
    }
}
