//! Emitting: the intents of refusal notices, rings, escalations and report notes, journaled,
//! then written once each.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use doorbell_core::debts::{
    escalation_id, escalation_note, next_due, ring_id, ring_note, Due, Reached, Schedule,
};
use doorbell_core::notice::{refusal_notice, RefusedLine, MAX_PER_NOTICE};

use super::{CatchUp, Judge};
use crate::append::append_line_within;
use crate::journal::{Record, RingRef, Word};
use crate::{Error, Result};

/// How long the judge waits for an inbox's lock to write a notice there.
pub(super) const NOTICE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

impl Judge {
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

    /// Keep the config's `notice_every` between two refusal notices to one sender from now
    /// on: what is refused meanwhile waits, and goes in the next notice.
    pub fn space_notices(&mut self) {
        self.spaced = true;
    }

    /// The time between two notices to one sender, when they are spaced.
    fn notice_spacing(&self) -> Option<chrono::Duration> {
        chrono::Duration::from_std(self.bridge.config.notice_every)
            .ok()
            .filter(|every| self.spaced && !every.is_zero())
    }

    /// When the next refusal notice may be written: now when a sender waits who was not
    /// told within the spacing, else when the first such spacing ends; `None` when no
    /// refusal waits.
    #[must_use]
    pub fn untold_due(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.snapshot
            .untold
            .values()
            .map(|line| self.may_tell_at(&line.from, now).max(now))
            .min()
    }

    /// When `sender` may next be sent a refusal notice, as of `now`. A notice dated after
    /// `now` (the clock was set back) counts as sent now: the wait is never longer than the
    /// spacing.
    fn may_tell_at(&self, sender: &str, now: DateTime<Utc>) -> DateTime<Utc> {
        match (self.notice_spacing(), self.told_at.get(sender)) {
            (Some(spacing), Some(told)) => (*told).min(now) + spacing,
            _ => DateTime::<Utc>::MIN_UTC,
        }
    }

    /// Write what is due: intents never written (after a crash) and a notice for every
    /// refusal not yet told, coalesced per sender (a sender told within the notice spacing
    /// waits for its end). Returns the inboxes written to.
    pub fn emit(&mut self, now: DateTime<Utc>, stats: &mut CatchUp) -> Result<Vec<String>> {
        // A ring or notice due on a timer, with no line to sweep first: the same check.
        self.state_is_ours()?;
        let mut targets = BTreeSet::new();
        let mut by_sender: BTreeMap<String, Vec<RefusedLine>> = BTreeMap::new();
        for line in self.snapshot.untold.values() {
            by_sender
                .entry(line.from.clone())
                .or_default()
                .push(line.clone());
        }
        for (sender, lines) in by_sender {
            if self.may_tell_at(&sender, now) > now {
                continue;
            }
            if self.notice_spacing().is_some() {
                self.told_at.insert(sender, now);
            }
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
        let mut voided = false;
        for (id, intent) in pending {
            if self.superseded(&id, &intent) {
                // A ring or escalation held back (its inbox was locked) for a debt paid or
                // moved on since: it would ring for nothing. It is journaled as void.
                let mut record =
                    Record::new(&intent.inbox, 0, 0, Word::Intent, now.timestamp_millis());
                record.id = Some(id.clone());
                self.journal.append(&record)?;
                self.snapshot.apply(record);
                voided = true;
                tracing::info!(inbox = %intent.inbox, id = %id, "a ring that waited for its inbox is void: its debt was paid or moved on");
                continue;
            }
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
                    if self.unwritable_inboxes.remove(&intent.inbox) {
                        tracing::warn!(inbox = %intent.inbox, "the inbox takes lines again: its notices are written");
                    }
                    targets.insert(intent.inbox);
                }
                Err(Error::InboxLocked { .. }) => {
                    if self.locked_inboxes.insert(intent.inbox.clone()) {
                        tracing::warn!(inbox = %intent.inbox, "another process holds this inbox's lock (a writer that hangs?): its notices wait, every other inbox is judged");
                    }
                }
                // Said once for the inbox, not at every try (every 2 s for as long as it
                // lasts); `status` says it too.
                Err(e) => {
                    if self.unwritable_inboxes.insert(intent.inbox.clone()) {
                        tracing::warn!(inbox = %intent.inbox, id = %id, error = %e, "could not write a notice; trying again every few seconds, said once");
                    }
                }
            }
        }
        if voided {
            self.journal.flush()?;
        }
        Ok(targets.into_iter().collect())
    }

    /// Whether the unwritten intent `id` is a ring or escalation of a debt that is no longer
    /// open, or is in another epoch now (answered, acknowledged, handed back).
    fn superseded(&self, id: &str, intent: &crate::journal::Intent) -> bool {
        if !(id.starts_with("ring:") || id.starts_with("escalation:")) {
            return false;
        }
        let Some(request) = crate::view::envelope_of(intent.line.as_bytes())
            .and_then(|note| note.correlates_to.map(|r| r.to_string()))
            .and_then(|r| {
                self.snapshot
                    .ledger
                    .request(&r)
                    .map(std::borrow::Cow::into_owned)
            })
        else {
            return false;
        };
        if !request.is_open() {
            return true;
        }
        let current = match id.rsplit(':').next().and_then(|n| n.parse().ok()) {
            Some(n) if id.starts_with("ring:") => ring_id(&request, n),
            _ => escalation_id(&request),
        };
        current != id
    }

    pub(super) fn schedule(&self) -> Schedule {
        let debts = &self.bridge.config.debts;
        Schedule {
            ring_after: debts.ring_after,
            backoff: debts.backoff,
            max_rings: debts.max_rings,
        }
    }

    /// Everything the doorbell will ring or escalate, with when: only for debts whose
    /// recipient has an inbox (an agent without one cannot be rung; `status` warns of it).
    pub(super) fn due_items(&self) -> Vec<(String, DateTime<Utc>, Due)> {
        let schedule = self.schedule();
        let human = &self.bridge.config.human;
        self.snapshot
            .ledger
            .requests()
            .filter(|r| r.is_open())
            .filter_map(|r| {
                let (at, due) = next_due(r, &schedule, human)?;
                // No ring behind one the debtor's inbox has not taken yet (another process
                // holds its lock, a write fails), nor to a debtor with no inbox (deleted or
                // renamed): the human hears of it instead, once.
                let due = match due {
                    Due::Ring(_) if self.rings_reach(r) != Reached::Every => {
                        if r.escalated || r.debtor_station() == human.as_str() {
                            return None;
                        }
                        Due::Escalate
                    }
                    due => due,
                };
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

    /// Whether `request`'s rings reach its debtor: not when the last one is meant but not
    /// yet in its inbox, nor when it has no inbox (a station that is no `[[loop]]`).
    fn rings_reach(&self, request: &doorbell_core::Request) -> Reached {
        let debtor = request.debtor_station();
        let is_loop = self.registry.knows(debtor) && !self.registry.is_station(debtor);
        if !self.inbox_names.contains(debtor) && !is_loop {
            Reached::NoInbox
        } else if request.rings > 0
            && self
                .snapshot
                .intents
                .contains_key(&ring_id(request, request.rings))
        {
            Reached::HeldBack
        } else {
            Reached::Every
        }
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
    pub(super) fn load_due(&mut self, now: DateTime<Utc>) -> Result<()> {
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
    pub(super) fn intend_rings(&mut self, now: DateTime<Utc>) -> Result<()> {
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
                Due::Escalate => (
                    escalation_note(&request, &human, self.rings_reach(&request), now),
                    0,
                ),
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
    pub(super) fn intend_reports(&mut self, now: DateTime<Utc>) -> Result<()> {
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
}
