//! The bridge API: the one handle every front end (the CLI's commands, hooks, servers) asks
//! its questions through. Opening it catches up once when no judge runs (becoming the judge
//! for that moment, exactly as `daemon --once` would) and otherwise reads the index's last
//! save and the journal's tail past it. Every answer then comes from the index by key, plus
//! that tail: what is unread for an agent, one message by id, a thread, the open debts, a
//! request's state, the counts behind `status` and `report`.
//!
//! Nothing above the store reads journal records, parses accepted lines or judges on its
//! own: it asks a `View`, or follows one with [`Updates`].

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};

use chrono::{DateTime, Utc};
use doorbell_core::report::Activity;
use doorbell_core::{
    Envelope, Kind, Limits, MessageSummary, RefusalReason, Registry, Request, Verdict,
};

use crate::append::open_inbox;
use crate::index::{MessageRow, OtherRow};
use crate::journal::{
    journal_path, Appended, InboxJournal, JournalFollower, Record, Snapshot, Word,
};
use crate::reader::{Line, LineReader};
use crate::{Bridge, BridgeLock, CatchUp, Error, Judge, Result};

/// An open view of the bridge, caught up as of when it was opened.
#[derive(Debug)]
pub struct View {
    bridge: Bridge,
    snapshot: Snapshot,
    /// Who holds the bridge lock, when another process judges.
    judge: Option<String>,
    /// Whether every open request is in memory.
    open_loaded: bool,
    caught_up: CatchUp,
}

/// A message found by id: where it is, what the judge said, and its line when the inbox
/// still holds it.
#[derive(Debug, Clone)]
pub struct Found {
    pub id: String,
    pub inbox: String,
    pub gen: u32,
    pub offset: u64,
    pub verdict: Word,
    pub seen_at: i64,
    pub reason: Option<String>,
    pub detail: Option<String>,
    /// The thread, for an accepted line.
    pub context_id: Option<String>,
    /// The line as written (without its `\n`), when its file still holds it.
    pub line: Option<Vec<u8>>,
    /// Whether the agent's cursor has passed it.
    pub read: bool,
}

impl Found {
    /// The envelope, parsed from the line, when its file still holds it.
    #[must_use]
    pub fn envelope(&self) -> Option<Envelope<'_>> {
        envelope_of(self.line.as_deref()?)
    }
}

/// An accepted message and its line.
#[derive(Debug, Clone)]
pub struct Message {
    pub row: MessageRow,
    /// The line as written, when its file still holds it (an inbox replaced since does not).
    pub line: Option<Vec<u8>>,
}

impl Message {
    /// The envelope, parsed from the line (accepted lines always parse).
    #[must_use]
    pub fn envelope(&self) -> Option<Envelope<'_>> {
        envelope_of(self.line.as_deref()?)
    }
}

/// Parse an accepted line for display: any length, since the judge already let it through.
#[must_use]
pub fn envelope_of(line: &[u8]) -> Option<Envelope<'_>> {
    let limits = Limits {
        max_line_bytes: usize::MAX,
    };
    doorbell_core::judge_stateless(line, None, &limits).ok()
}

impl View {
    /// Catch up when no judge runs (and save what that judged); otherwise read the index
    /// and the journal's tail as they stand: a view never judges behind a judge's back.
    pub fn open(bridge: &Bridge) -> Result<View> {
        let role = crate::lock::TRANSIENT[0];
        match BridgeLock::after_catch_ups(bridge, role, std::time::Duration::from_secs(10))? {
            Some(lock) => {
                let mut judge = Judge::open(bridge.clone(), lock)?;
                let caught_up = judge.catch_up(Utc::now())?;
                judge.checkpoint_if_changed()?;
                Ok(View {
                    bridge: bridge.clone(),
                    snapshot: judge.into_snapshot(),
                    judge: None,
                    open_loaded: false,
                    caught_up,
                })
            }
            None => Ok(View {
                bridge: bridge.clone(),
                snapshot: Snapshot::load(bridge)?,
                judge: Some(crate::lock::holder(bridge)),
                open_loaded: false,
                caught_up: CatchUp::default(),
            }),
        }
    }

    /// [`View::open`], or, when its catch-up cannot write (a full or read-only disk), the
    /// bridge as the index and the journal say, with the error that stopped the catch-up:
    /// `status` must show what is stuck when the disk is what is stuck.
    pub fn open_or_as_journaled(bridge: &Bridge) -> Result<(View, Option<Error>)> {
        match View::open(bridge) {
            Ok(view) => Ok((view, None)),
            Err(error) if error.is_no_room() => Ok((View::unjudged(bridge)?, Some(error))),
            Err(error) => Err(error),
        }
    }

    /// The bridge as the index and the journal say, without judging anything: what `open`
    /// gives while another judge runs.
    pub fn unjudged(bridge: &Bridge) -> Result<View> {
        Ok(View {
            bridge: bridge.clone(),
            snapshot: Snapshot::load(bridge)?,
            judge: None,
            open_loaded: false,
            caught_up: CatchUp::default(),
        })
    }

    /// The bridge as the index and the journal say, for the judge that holds it (the daemon
    /// writing its board).
    pub fn unjudged_as_judge(bridge: &Bridge) -> Result<View> {
        Ok(View {
            judge: Some(crate::lock::holder(bridge)),
            ..View::unjudged(bridge)?
        })
    }

    /// What opening the view judged (nothing when another judge runs).
    #[must_use]
    pub fn caught_up(&self) -> &CatchUp {
        &self.caught_up
    }

    #[must_use]
    pub fn bridge(&self) -> &Bridge {
        &self.bridge
    }

    /// Who judges: `None` when no judge ran and this view caught up itself.
    #[must_use]
    pub fn judge(&self) -> Option<&str> {
        self.judge.as_deref()
    }

    /// Request `id` as the ledger has it.
    #[must_use]
    pub fn request(&self, id: &str) -> Option<Cow<'_, Request>> {
        self.snapshot.ledger.request(id)
    }

    fn load_open(&mut self) -> Result<()> {
        if !self.open_loaded {
            self.snapshot.load_open_requests()?;
            self.open_loaded = true;
        }
        Ok(())
    }

    /// Every open debt, oldest state first.
    pub fn debts(&mut self) -> Result<Vec<Request>> {
        self.load_open()?;
        Ok(self
            .snapshot
            .ledger
            .debts()
            .into_iter()
            .map(|d| d.request.clone())
            .collect())
    }

    /// The requests an id names: the request itself, or a broadcast's, one per station
    /// (`<id>.<station>`). Empty when the ledger has neither.
    pub fn requests_named(&self, id: &str) -> Result<Vec<String>> {
        if self.request(id).is_some() {
            return Ok(vec![id.to_owned()]);
        }
        let prefix = format!("{id}.");
        let mut ids: Vec<String> = self
            .snapshot
            .ledger
            .requests()
            .filter(|r| r.id.starts_with(&prefix))
            .map(|r| r.id.clone())
            .collect();
        if let Some(index) = self.snapshot.index() {
            ids.extend(index.broadcast_requests(id)?);
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// The known inbox whose file `agent`'s inbox is, when it is another's under a new name
    /// (a hard link, a rename): the judge does not judge it.
    pub fn inbox_is_another(&self, agent: &str) -> Result<Option<String>> {
        if self.snapshot.inboxes.contains_key(agent) {
            // Judged under its own name: cheap, and the common case.
            return Ok(None);
        }
        let path = self.bridge.inbox_path(agent)?;
        let Ok(file) = crate::append::open_inbox(&path, false) else {
            return Ok(None);
        };
        let meta = file
            .metadata()
            .map_err(crate::Error::io("stat inbox", &path))?;
        Ok(self.snapshot.same_file_as_another(agent, &file, &meta))
    }

    /// The open debts of which `station` is a party (it owes, or it is owed), oldest state
    /// first: read from the index by party, so a hook pays for this station's debts only.
    pub fn debts_of(&mut self, station: &str) -> Result<Vec<Request>> {
        if !self.open_loaded {
            self.snapshot.load_open_requests_of(station)?;
        }
        Ok(self
            .snapshot
            .ledger
            .debts()
            .into_iter()
            .filter(|d| d.request.addressee == station || d.request.requester_station() == station)
            .map(|d| d.request.clone())
            .collect())
    }

    /// The stateful rules as the ledger stands, for a sender's pre-check (the judge's
    /// verdict stays final).
    #[must_use]
    pub fn precheck(&self, envelope: &Envelope<'_>, owner: &str, registry: &Registry) -> Verdict {
        self.snapshot
            .ledger
            .judge(envelope, owner, registry, &|_| false)
    }

    /// What the judge knows of each inbox.
    #[must_use]
    pub fn inboxes(&self) -> &BTreeMap<String, InboxJournal> {
        &self.snapshot.inboxes
    }

    /// How many lines the judge means to write into `agent`'s inbox (notices, rings, report
    /// notes) and has not found there yet.
    #[must_use]
    pub fn unwritten_for(&self, agent: &str) -> usize {
        self.snapshot
            .intents
            .values()
            .filter(|intent| intent.inbox == agent)
            .count()
    }

    /// Refused lines ever, by reason.
    #[must_use]
    pub fn refused(&self) -> &BTreeMap<RefusalReason, u64> {
        &self.snapshot.refused
    }

    /// Where the journal the view has read ends: where [`Updates`] start.
    #[must_use]
    pub fn updates(&self) -> Updates {
        Updates {
            follower: JournalFollower::new(journal_path(&self.bridge), self.snapshot.journal_len),
            accepted: self.snapshot.accepted,
        }
    }

    /// One message by id: the accepted line that claimed it, else the first refused or
    /// duplicate line that carried it.
    pub fn message(&self, id: &str) -> Result<Option<Found>> {
        let accepted = match self.snapshot.unsaved_messages().find(|m| m.id == id) {
            Some(row) => Some(row.clone()),
            None => match self.snapshot.index() {
                Some(index) => index.message(id)?,
                None => None,
            },
        };
        let found = if let Some(row) = accepted {
            Found {
                id: row.id,
                line: self.line_at(&row.inbox, row.gen, row.offset, row.span),
                inbox: row.inbox,
                gen: row.gen,
                offset: row.offset,
                verdict: Word::Accepted,
                seen_at: row.seen_at,
                reason: None,
                detail: None,
                context_id: Some(row.context_id),
                read: false,
            }
        } else {
            let Some(other) = self.others_with_id(id)?.into_iter().next() else {
                return Ok(None);
            };
            let OtherRow {
                inbox,
                gen,
                offset,
                span,
                duplicate,
                seen_at,
                reason,
                detail,
                ..
            } = other;
            Found {
                id: id.to_owned(),
                line: self.line_at(&inbox, gen, offset, span),
                inbox,
                gen,
                offset,
                verdict: if duplicate {
                    Word::Duplicate
                } else {
                    Word::Refused
                },
                seen_at,
                reason,
                detail,
                context_id: None,
                read: false,
            }
        };
        let read = self.has_read(&found.inbox, found.gen, found.offset);
        Ok(Some(Found { read, ..found }))
    }

    /// The verdict on the line with id `id` at `offset` of `inbox` (its current file), with
    /// the reason of a refusal: `None` while it is not judged yet.
    pub fn verdict_at(
        &self,
        id: &str,
        inbox: &str,
        offset: u64,
    ) -> Result<Option<(Word, Option<String>)>> {
        let Some(journal) = self.snapshot.inboxes.get(inbox) else {
            return Ok(None);
        };
        let gen = journal.gen;
        if let Some(found) = self.message(id)? {
            if found.verdict == Word::Accepted
                && (found.inbox.as_str(), found.gen, found.offset) == (inbox, gen, offset)
            {
                return Ok(Some((Word::Accepted, None)));
            }
        }
        Ok(self
            .others_with_id(id)?
            .into_iter()
            .find(|o| (o.inbox.as_str(), o.gen, o.offset) == (inbox, gen, offset))
            .map(|o| {
                let word = if o.duplicate {
                    Word::Duplicate
                } else {
                    Word::Refused
                };
                let reason = match (o.reason, o.detail) {
                    (Some(reason), Some(detail)) => Some(format!("{reason}: {detail}")),
                    (reason, _) => reason,
                };
                (word, reason)
            }))
    }

    /// The refused and duplicate lines that carried id `id`: the index's, then those not
    /// saved yet.
    fn others_with_id(&self, id: &str) -> Result<Vec<OtherRow>> {
        let mut others = match self.snapshot.index() {
            Some(index) => index.others_with_id(id)?,
            None => Vec::new(),
        };
        others.extend(
            self.snapshot
                .unsaved_others_all()
                .filter(|o| o.id.as_deref() == Some(id))
                .cloned(),
        );
        Ok(others)
    }

    /// Whether `agent`'s cursor has passed `offset` of generation `gen`.
    fn has_read(&self, agent: &str, gen: u32, offset: u64) -> bool {
        let Some(journal) = self.snapshot.inboxes.get(agent) else {
            return false;
        };
        // In a file the current one replaced: read when its reader had passed it then.
        if gen < journal.gen {
            return journal
                .unread_from
                .is_some_and(|unread| unread.read_before(gen, offset, journal.gen));
        }
        let Some(file) = self.current_file(agent, journal) else {
            return false;
        };
        journal.gen == gen
            && crate::cursor::load(&self.bridge, agent, &file)
                .is_ok_and(|position| position.offset() > offset)
    }

    /// The inbox file now at `agent`'s path, when it is the one the journal describes.
    fn current_file(&self, agent: &str, journal: &InboxJournal) -> Option<File> {
        let file = open_inbox(&self.bridge.inbox_path(agent).ok()?, false).ok()?;
        let meta = file.metadata().ok()?;
        ((meta.dev(), meta.ino()) == (journal.dev, journal.ino)).then_some(file)
    }

    /// The bytes of the line at `offset` (its `\n` left out), when `inbox`'s current file is
    /// still generation `gen`.
    fn line_at(&self, inbox: &str, gen: u32, offset: u64, span: u64) -> Option<Vec<u8>> {
        let journal = self.snapshot.inboxes.get(inbox)?;
        if journal.gen != gen {
            return None;
        }
        let file = self.current_file(inbox, journal)?;
        let mut buf = vec![0; usize::try_from(span.checked_sub(1)?).ok()?];
        file.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    }

    /// Every accepted message of thread `context`, in the order they were accepted.
    pub fn thread(&self, context: &str) -> Result<Vec<Message>> {
        Ok(self
            .thread_rows(context)?
            .into_iter()
            .map(|row| self.with_line(row))
            .collect())
    }

    /// An accepted line's row with its line, read from its inbox.
    fn with_line(&self, row: MessageRow) -> Message {
        Message {
            line: self.line_at(&row.inbox, row.gen, row.offset, row.span),
            row,
        }
    }

    /// The rows of thread `context`'s accepted lines, in the order they were accepted,
    /// without reading the lines.
    fn thread_rows(&self, context: &str) -> Result<Vec<MessageRow>> {
        let mut rows = match self.snapshot.index() {
            Some(index) => index.thread(context)?,
            None => Vec::new(),
        };
        let known: BTreeSet<String> = rows.iter().map(|r| r.id.clone()).collect();
        rows.extend(
            self.snapshot
                .unsaved_messages()
                .filter(|m| m.context_id == context && !known.contains(&m.id))
                .cloned(),
        );
        Ok(rows)
    }

    /// `agent`'s inbox as the judge sees it, to read accepted lines from `from` on.
    pub fn inbox(&self, agent: &str, from: u64) -> Result<Option<InboxView>> {
        let Some(journal) = self.snapshot.inboxes.get(agent) else {
            return Ok(None);
        };
        let mut not_accepted: BTreeMap<u64, u64> = match self.snapshot.index() {
            Some(index) => index
                .others_between(agent, journal.gen, from, u64::MAX)?
                .into_iter()
                .collect(),
            None => BTreeMap::new(),
        };
        not_accepted.extend(
            self.snapshot
                .unsaved_others(agent, journal.gen)
                .map(|o| (o.offset, o.span.max(1))),
        );
        Ok(Some(InboxView {
            agent: agent.to_owned(),
            journal: journal.clone(),
            not_accepted,
            reader: None,
            max_line_bytes: self.bridge.max_line_bytes(),
        }))
    }

    /// `agent`'s accepted lines from `from`, when this view is of `file` as it is now (see
    /// [`InboxView::describes`]); `None` when the judge has not read this file, or not since
    /// it was truncated or overwritten in place: nothing in it is known accepted yet.
    pub fn inbox_of(
        &self,
        agent: &str,
        from: u64,
        file: &File,
        meta: &std::fs::Metadata,
    ) -> Result<Option<InboxView>> {
        Ok(self
            .inbox(agent, from)?
            .filter(|inbox| inbox.describes(file, meta)))
    }

    /// How many accepted lines wait past `agent`'s cursor.
    pub fn unread(&self, agent: &str) -> Result<u64> {
        let path = self.bridge.inbox_path(agent)?;
        let file = open_inbox(&path, false)?;
        let meta = file
            .metadata()
            .map_err(crate::Error::io("stat inbox", &path))?;
        let from = crate::cursor::load(&self.bridge, agent, &file)?.offset();
        let Some(mut inbox) = self.inbox_of(agent, from, &file, &meta)? else {
            return Ok(0);
        };
        let mut count = 0;
        inbox.accepted_lines(&file, from, |_, _| -> Result<()> {
            count += 1;
            Ok(())
        })?;
        Ok(count)
    }

    /// What was sent and refused since `since`.
    pub fn activity(&self, since: DateTime<Utc>) -> Result<Activity> {
        let since = since.timestamp_millis();
        let mut activity = Activity::default();
        if let Some(index) = self.snapshot.index() {
            let (sent, refused) = index.activity_since(since)?;
            for ((from, kind), n) in sent {
                *activity
                    .sent
                    .entry(from)
                    .or_default()
                    .entry(kind)
                    .or_default() += n;
            }
            for (reason, n) in refused {
                *activity.refused.entry(reason).or_default() += n;
            }
        }
        for m in self
            .snapshot
            .unsaved_messages()
            .filter(|m| m.seen_at >= since)
        {
            *activity
                .sent
                .entry(m.from.clone())
                .or_default()
                .entry(m.kind)
                .or_default() += 1;
        }
        for o in self
            .snapshot
            .unsaved_others_all()
            .filter(|o| o.seen_at >= since && !o.duplicate)
        {
            *activity
                .refused
                .entry(o.reason.clone().unwrap_or_default())
                .or_default() += 1;
        }
        Ok(activity)
    }

    /// The requests a report over the window from `since` shows: every open one, and those
    /// closed since `since`.
    pub fn report_requests(&mut self, since: DateTime<Utc>) -> Result<Vec<Request>> {
        self.load_open()?;
        let mut requests: BTreeMap<String, Request> = BTreeMap::new();
        if let Some(index) = self.snapshot.index() {
            for request in index.closed_since(since.timestamp_millis())? {
                requests.insert(request.id.clone(), request);
            }
        }
        // Memory is newer than the index.
        for request in self.snapshot.ledger.requests() {
            let closed_in_window = request.closed_at.is_some_and(|t| t >= since);
            if request.is_open() || closed_in_window {
                requests.insert(request.id.clone(), request.clone());
            } else {
                requests.remove(&request.id);
            }
        }
        Ok(requests.into_values().collect())
    }

    /// Every request addressed to `addressee` (by `requester` only, when given), in id
    /// order: what an A2A caller lists as its tasks at a station.
    pub fn requests_to(&self, addressee: &str, requester: Option<&str>) -> Result<Vec<Request>> {
        let mut requests: BTreeMap<String, Request> = BTreeMap::new();
        if let Some(index) = self.snapshot.index() {
            for request in index.requests_to(addressee, requester)? {
                requests.insert(request.id.clone(), request);
            }
        }
        // Memory is newer than the index.
        for request in
            self.snapshot.ledger.requests().filter(|r| {
                r.addressee == addressee && requester.is_none_or(|who| r.requester == who)
            })
        {
            requests.insert(request.id.clone(), request.clone());
        }
        Ok(requests.into_values().collect())
    }

    /// The messages of request `id`: the request and every accepted line that correlates to
    /// it (responses, notes, rings), in the order they were accepted.
    pub fn conversation(&self, request: &Request) -> Result<Vec<Message>> {
        self.conversation_past(request, &|_| false)
    }

    /// [`View::conversation`] without the lines `seen` names (a stream's, already sent): only
    /// the new ones are read from their inboxes.
    pub fn conversation_past(
        &self,
        request: &Request,
        seen: &dyn Fn(&MessageRow) -> bool,
    ) -> Result<Vec<Message>> {
        Ok(self
            .thread_rows(&request.context_id)?
            .into_iter()
            .filter(|m| {
                m.id == request.id || m.correlates_to.as_deref() == Some(request.id.as_str())
            })
            .filter(|m| !seen(m))
            .map(|row| self.with_line(row))
            .collect())
    }

    /// The first line of text of each of `requests`, read from its inbox.
    #[must_use]
    pub fn texts(&self, requests: &[&Request]) -> BTreeMap<String, String> {
        let mut texts = BTreeMap::new();
        for request in requests {
            let Some((gen, offset)) = request.location else {
                continue;
            };
            let Some(journal) = self.snapshot.inboxes.get(&request.addressee) else {
                continue;
            };
            if journal.gen != gen {
                continue;
            }
            let Some(file) = self.current_file(&request.addressee, journal) else {
                continue;
            };
            if let Some(line) =
                crate::reports::line_from(&file, offset, self.bridge.max_line_bytes())
            {
                if let Some(envelope) = envelope_of(&line) {
                    texts.insert(request.id.clone(), envelope.message.first_line());
                }
            }
        }
        texts
    }
}

/// An agent's inbox as the judge sees it: which lines from a start offset on are accepted.
#[derive(Debug)]
pub struct InboxView {
    pub agent: String,
    pub journal: InboxJournal,
    /// The lines refused or duplicate, by offset, with their span: a run of lines that name
    /// nobody is refused as one, from its first line's offset.
    not_accepted: BTreeMap<u64, u64>,
    /// Reads the inbox's lines; kept between calls (`watch` reads again and again).
    reader: Option<LineReader>,
    max_line_bytes: usize,
}

impl InboxView {
    /// Whether this picture of the inbox is of `file` as it is now: the same file (device
    /// and inode) still holding the bytes the judge last marked. A file truncated or
    /// overwritten in place since (`: >`, a restore with `cp`, a copytruncate rotation) is
    /// not, until the judge reads it again: its offsets are no longer this picture's lines.
    #[must_use]
    pub fn describes(&self, file: &File, meta: &std::fs::Metadata) -> bool {
        (meta.dev(), meta.ino()) == (self.journal.dev, self.journal.ino)
            && self.journal.mark.is_none_or(|(offset, marker)| {
                meta.len() >= offset && marker.matches(file, offset).unwrap_or(false)
            })
    }

    /// An inbox the judge has not seen yet: nothing in it is accepted.
    #[must_use]
    pub fn empty(agent: &str) -> InboxView {
        InboxView {
            agent: agent.to_owned(),
            journal: InboxJournal::default(),
            not_accepted: BTreeMap::new(),
            reader: None,
            max_line_bytes: 0,
        }
    }

    /// Whether the line at `offset` was judged and accepted.
    #[must_use]
    pub fn is_accepted(&self, offset: u64) -> bool {
        offset < self.journal.judged_to
            && self
                .not_accepted
                .range(..=offset)
                .next_back()
                .is_none_or(|(start, span)| offset >= start + span)
    }

    /// Each accepted line of `file` (this inbox's file) from `from` on, with its offset, in
    /// order; `each`'s first error stops the reading. Returns how far a cursor may move once
    /// every line was shown: where judging stopped, or the end of the last whole line of a
    /// file that is shorter now (cut in place, half written again).
    pub fn accepted_lines<E: From<std::io::Error>>(
        &mut self,
        file: &File,
        from: u64,
        mut each: impl FnMut(u64, &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<u64, E> {
        let mut reader = self
            .reader
            .take()
            .unwrap_or_else(|| LineReader::new(self.max_line_bytes));
        // Nothing past where judging stopped is accepted: no read is spent beyond it.
        let judged_to = Some(self.journal.judged_to);
        let read = reader.read_until(file, from, judged_to, |line| match line {
            // A blank line inside a refused run has no verdict of its own: never a message.
            Line::Complete { offset, bytes }
                if self.is_accepted(offset) && !crate::judge::is_blank(bytes) =>
            {
                each(offset, bytes)
            }
            // Accepted though longer than this reader's limit: the judge's own notices are
            // read back whole at any length, and a judge with another config may allow more.
            Line::TooLong { offset, len } if self.is_accepted(offset) => {
                let mut bytes = vec![0; len as usize];
                file.read_exact_at(&mut bytes, offset)?;
                // A long blank line inside a refused run of them is no message either.
                if crate::judge::is_blank(&bytes) {
                    return Ok(());
                }
                each(offset, &bytes)
            }
            _ => Ok(()),
        });
        self.reader = Some(reader);
        // The read may go on past where judging stopped (a buffer's worth): never the cursor.
        Ok(read?.min(self.journal.judged_to.max(from)))
    }

    /// [`Self::accepted_lines`], each with its envelope. A line accepted when it was judged
    /// that no longer reads as a message (its bytes changed in place since: an edit, a
    /// damaged disk) cannot be shown as it was judged: it is passed over with a warning
    /// that names it, and the messages after it are shown, so one damaged line never keeps
    /// a reader from the rest nor shows it what it read again and again.
    pub fn accepted_messages<E: From<std::io::Error>>(
        &mut self,
        file: &File,
        from: u64,
        mut each: impl FnMut(u64, &[u8], Envelope<'_>) -> std::result::Result<(), E>,
    ) -> std::result::Result<u64, E> {
        let agent = self.agent.clone();
        self.accepted_lines(file, from, |offset, bytes| {
            if let Some(envelope) = envelope_of(bytes) {
                return each(offset, bytes, envelope);
            }
            tracing::warn!(
                inbox = %agent,
                offset,
                "the message judged at this byte of the inbox no longer reads as one (its bytes changed since: edited in place, or damaged): it cannot be shown; the messages after it are"
            );
            Ok(())
        })
    }

    fn apply(&mut self, record: &Record) {
        if record.inbox != self.agent {
            return;
        }
        let gen = self.journal.gen;
        self.journal.apply(record);
        if self.journal.gen != gen {
            self.not_accepted.clear();
        }
        if matches!(record.verdict, Word::Refused | Word::Duplicate)
            && record.gen == self.journal.gen
        {
            self.not_accepted.insert(record.offset, record.span.max(1));
        }
    }
}

/// One accepted line as `read --json` and `watch --json` print it, newline-ended:
/// `{"inbox":…,"offset":…,"verdict":"accepted","envelope":…}`. The line was read as an
/// envelope just before, so it goes in as written, trimmed of surrounding whitespace,
/// without being parsed a second time.
pub fn json_line(agent: &str, offset: u64, line: &[u8]) -> Result<String, std::str::Utf8Error> {
    let mut text = Vec::new();
    push_json_line(&mut text, agent, offset, line)?;
    Ok(String::from_utf8(text).expect("pushed as UTF-8"))
}

/// Whether `line` is one JSON object, with nothing but blanks around it: a scan that builds
/// nothing, for a line judged a moment ago that is only to be printed.
#[must_use]
pub fn is_json_object(line: &[u8]) -> bool {
    line.trim_ascii().starts_with(b"{")
        && serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok()
}

/// [`json_line`], added to `out`; nothing is added when the line is not UTF-8.
pub fn push_json_line(
    out: &mut Vec<u8>,
    agent: &str,
    offset: u64,
    line: &[u8],
) -> Result<(), std::str::Utf8Error> {
    let envelope = std::str::from_utf8(line.trim_ascii())?;
    out.reserve(envelope.len() + agent.len() + 64);
    out.extend_from_slice(b"{\"inbox\":");
    serde_json::to_writer(&mut *out, agent).expect("a string always serialises");
    out.extend_from_slice(b",\"offset\":");
    out.extend_from_slice(itoa::Buffer::new().format(offset).as_bytes());
    out.extend_from_slice(b",\"verdict\":\"accepted\",\"envelope\":");
    out.extend_from_slice(envelope.as_bytes());
    out.extend_from_slice(b"}\n");
    Ok(())
}

/// What the judge journals after a view was opened, as it journals it.
#[derive(Debug)]
pub struct Updates {
    follower: JournalFollower,
    /// The next accepted line's `seq`.
    accepted: u64,
}

impl Updates {
    /// Each line accepted since the last call.
    pub fn accepted(&mut self, each: &mut dyn FnMut(&MessageRow)) -> Result<()> {
        let accepted = &mut self.accepted;
        self.follower.read(&mut |record| {
            if let Some(row) = MessageRow::from_record(&record, *accepted) {
                *accepted += 1;
                each(&row);
            }
        })
    }

    /// Bring `inbox` up to date with what was judged since the last call.
    pub fn follow(&mut self, inbox: &mut InboxView) -> Result<()> {
        self.follower.read(&mut |record| inbox.apply(&record))
    }

    /// Take what the judge says it appended (the daemon tells its watchers) into `inbox`, as
    /// [`Updates::follow`] would read it from the journal; the journal file itself is read
    /// when those bytes do not continue where this view stands.
    pub fn take(&mut self, appended: &Appended, inbox: &mut InboxView) -> Result<()> {
        if !self
            .follower
            .take(appended, &mut |record| inbox.apply(&record))?
        {
            self.follow(inbox)?;
        }
        Ok(())
    }
}

impl MessageRow {
    /// The index's row for an accepted record, the journal's `seq`-th accepted line.
    #[must_use]
    pub fn from_record(record: &Record, seq: u64) -> Option<MessageRow> {
        let mut row = MessageRow::default();
        row.fill_from(record, seq).then_some(row)
    }

    /// Make this row `record`'s, the `seq`th accepted line, in the strings it has (no
    /// allocation when they are long enough). False, and the row unchanged, when the record
    /// is no accepted line.
    pub fn fill_from(&mut self, record: &Record, seq: u64) -> bool {
        let Some(line) = record
            .line
            .as_ref()
            .filter(|_| record.verdict == Word::Accepted)
        else {
            return false;
        };
        self.id.clone_from(&line.id);
        self.inbox.clone_from(&record.inbox);
        self.gen = record.gen;
        self.offset = record.offset;
        self.span = record.span;
        self.seen_at = record.seen_at;
        self.seq = seq;
        self.from.clone_from(&line.from);
        self.kind = line.kind;
        self.correlates_to.clone_from(&line.correlates_to);
        self.context_id.clone_from(&line.context_id);
        self.state = line.state;
        self.fingerprint = line.fingerprint;
        true
    }

    #[must_use]
    pub fn is_request(&self) -> bool {
        self.kind == Kind::Request
    }
}
