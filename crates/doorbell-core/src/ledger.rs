//! The ledger: a pure state machine over accepted envelopes and the judge's clock. It knows
//! every claimed id, every request with its state and since when, and so who owes whom.
//!
//! It is fed only accepted lines, in journal order, with the judge's `seenAt`; replaying the
//! same journal always rebuilds the same ledger. It never reads a file or a clock.
//!
//! Memory holds only the working set: the open requests, and what changed since the store
//! last saved the ledger. Everything older (every id ever claimed, every closed request) is
//! in an [`Archive`], which the store keeps on disk; the ledger asks it by key and never
//! holds it. Without an archive the ledger is the whole history, as in tests.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::judge::Registry;
use crate::verdict::Verdict;
use crate::{Envelope, Kind, State};

/// Which party of a request a response comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The agent the request was sent to.
    Addressee,
    /// The agent that sent the request.
    Requester,
}

/// The transition table: may `side` move a request from `from` to `to`?
#[must_use]
pub fn transition_allowed(from: State, side: Side, to: State) -> bool {
    use State::{Canceled, Completed, Failed, InputRequired, Rejected, Submitted, Working};
    match (from, side) {
        (Submitted, Side::Addressee) => {
            matches!(to, Working | InputRequired | Completed | Failed | Rejected)
        }
        (Working, Side::Addressee) => matches!(to, Working | InputRequired | Completed | Failed),
        (InputRequired, Side::Addressee) => matches!(to, Working | Completed | Failed),
        (Submitted | Working, Side::Requester) => to == Canceled,
        (InputRequired, Side::Requester) => matches!(to, Working | Canceled),
        (Completed | Failed | Canceled | Rejected, _) => false,
    }
}

/// The part of an accepted line the ledger keeps: what the verdict journal records so the
/// ledger can be rebuilt without the inbox files.
///
/// Keys are short: the journal holds one of these per accepted message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub id: String,
    #[serde(rename = "f")]
    pub from: String,
    pub to: String,
    #[serde(rename = "k")]
    pub kind: Kind,
    #[serde(rename = "re", default, skip_serializing_if = "Option::is_none")]
    pub correlates_to: Option<String>,
    /// The thread, with the defaults applied (a request's own id, a response's request's).
    #[serde(rename = "cx")]
    pub context_id: String,
    #[serde(rename = "tk", default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    #[serde(rename = "p", default = "normal", skip_serializing_if = "is_normal")]
    pub priority: u8,
    #[serde(
        rename = "rb",
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_millis"
    )]
    pub reply_by: Option<DateTime<Utc>>,
    #[serde(rename = "ca", with = "chrono::serde::ts_milliseconds")]
    pub created_at: DateTime<Utc>,
    #[serde(rename = "fp")]
    pub fingerprint: u64,
    /// A loop's request: the station that answers for the loop (its `owner`).
    #[serde(rename = "ow", default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

fn normal() -> u8 {
    1
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_normal(priority: &u8) -> bool {
    *priority == 1
}

mod opt_millis {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    #[allow(clippy::ref_option)]
    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_i64(t.timestamp_millis()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        Ok(Option::<i64>::deserialize(d)?.and_then(DateTime::from_timestamp_millis))
    }
}

/// A request and everything the ledger knows of it. Saved in every checkpoint, hence the
/// short keys and times in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub id: String,
    #[serde(rename = "rq")]
    pub requester: String,
    #[serde(rename = "ad")]
    pub addressee: String,
    #[serde(rename = "cx")]
    pub context_id: String,
    #[serde(rename = "tk", default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(rename = "s")]
    pub state: State,
    #[serde(rename = "p")]
    pub priority: u8,
    #[serde(
        rename = "rb",
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_millis"
    )]
    pub reply_by: Option<DateTime<Utc>>,
    #[serde(rename = "ca", with = "chrono::serde::ts_milliseconds")]
    pub created_at: DateTime<Utc>,
    /// When the judge accepted the request: the moment it was delivered.
    #[serde(rename = "sa", with = "chrono::serde::ts_milliseconds")]
    pub seen_at: DateTime<Utc>,
    /// `t0`: when the judge saw the line that set the current state.
    #[serde(rename = "t0", with = "chrono::serde::ts_milliseconds")]
    pub state_since: DateTime<Utc>,
    /// Counts state changes; rings are numbered within an epoch.
    #[serde(rename = "ep")]
    pub epoch: u32,
    #[serde(rename = "n")]
    pub responses: u32,
    /// When the addressee first answered.
    #[serde(
        rename = "fr",
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_millis"
    )]
    pub first_response_at: Option<DateTime<Utc>>,
    /// When the request reached a terminal state.
    #[serde(
        rename = "cl",
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_millis"
    )]
    pub closed_at: Option<DateTime<Utc>>,
    /// Rings written in the current epoch.
    #[serde(rename = "rg", default)]
    pub rings: u32,
    /// When the last ring of the current epoch was written.
    #[serde(
        rename = "lr",
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_millis"
    )]
    pub last_ring_at: Option<DateTime<Utc>>,
    /// Whether the current epoch was escalated to the human station.
    #[serde(rename = "es", default)]
    pub escalated: bool,
    /// Rings written over the request's whole life.
    #[serde(rename = "rt", default)]
    pub rings_total: u32,
    /// Where the request's line is: the addressee's inbox generation and offset.
    #[serde(rename = "at", default, skip_serializing_if = "Option::is_none")]
    pub location: Option<(u32, u64)>,
    /// A loop's request: the station that answers for the loop, where its answers go.
    #[serde(rename = "ow", default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl Request {
    /// Whether the request is still a debt.
    #[must_use]
    pub fn is_open(&self) -> bool {
        !self.state.is_terminal()
    }

    /// Who owes the next move: the addressee, except in `input-required`.
    #[must_use]
    pub fn debtor(&self) -> &str {
        if self.state == State::InputRequired {
            &self.requester
        } else {
            &self.addressee
        }
    }

    /// Who waits for the debtor.
    #[must_use]
    pub fn creditor(&self) -> &str {
        if self.state == State::InputRequired {
            &self.addressee
        } else {
            &self.requester
        }
    }

    /// The station on the requester's side: the requester, or the owner that answers for a
    /// loop that asked.
    #[must_use]
    pub fn requester_station(&self) -> &str {
        self.owner.as_deref().unwrap_or(&self.requester)
    }

    /// The station that owes the next move: the debtor, or a loop's owner.
    #[must_use]
    pub fn debtor_station(&self) -> &str {
        if self.state == State::InputRequired {
            self.requester_station()
        } else {
            &self.addressee
        }
    }

    /// The station that waits: the creditor, or a loop's owner.
    #[must_use]
    pub fn creditor_station(&self) -> &str {
        if self.state == State::InputRequired {
            &self.addressee
        } else {
            self.requester_station()
        }
    }

    /// Which side of this request `agent` speaks for when it sends `state` now; `None` when
    /// it is neither party.
    #[must_use]
    pub fn side_of(&self, agent: &str, state: State) -> Option<Side> {
        let addressee = agent == self.addressee;
        // A loop's owner answers for the loop.
        let requester = agent == self.requester || self.owner.as_deref() == Some(agent);
        match (addressee, requester) {
            // Asking oneself: the requester's states are the ones only a requester sends.
            (true, true) if state == State::Canceled => Some(Side::Requester),
            (true, true) if self.state == State::InputRequired && state == State::Working => {
                Some(Side::Requester)
            }
            (true, _) => Some(Side::Addressee),
            (false, true) => Some(Side::Requester),
            (false, false) => None,
        }
    }
}

/// An open request seen from the debtor's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debt<'l> {
    pub request: &'l Request,
}

impl<'l> Debt<'l> {
    #[must_use]
    pub fn debtor(&self) -> &'l str {
        self.request.debtor()
    }

    #[must_use]
    pub fn creditor(&self) -> &'l str {
        self.request.creditor()
    }
}

/// What the ledger has handed to disk: every id claimed and every request, by key. The
/// store implements it over its index; the ledger only asks.
pub trait Archive: Send + std::fmt::Debug {
    /// The fingerprint of the accepted line that claimed `id`.
    fn claim(&self, id: &str) -> Option<u64>;
    /// `id` was just claimed (it reaches the archive with the next save).
    fn claimed(&self, _id: &str) {}
    /// Request `id` as last saved.
    fn request(&self, id: &str) -> Option<Request>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Claim {
    fingerprint: u64,
    /// The change set it was made in (see [`Ledger::take_changes`]).
    touched: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Shared with the change sets that hold it until they are saved: a change made
    /// meanwhile copies it first (`Arc::make_mut`), so a set never changes under its save.
    request: Arc<Request>,
    /// The change set it was last changed in; 0 when it is as the archive has it.
    touched: u64,
}

/// The requests a change set holds: what the store must save for the archive to catch up.
#[derive(Debug, Default)]
pub struct Changes {
    pub seq: u64,
    pub requests: Vec<Arc<Request>>,
}

/// Every accepted id and every request, fed in journal order: the working set in memory,
/// the rest in the archive.
#[derive(Debug, Default)]
pub struct Ledger {
    // foldhash: fast on short keys, and seeded per process so ids chosen by a hostile writer
    // cannot be made to collide.
    claims: HashMap<Box<str>, Claim, RandomState>,
    // Boxed: a request is a few hundred bytes, and growing the map moves only pointers.
    requests: HashMap<Box<str>, Entry, RandomState>,
    archive: Option<Box<dyn Archive>>,
    /// The change set being filled; the ones before it were taken by the store.
    seq: u64,
}

impl Ledger {
    #[must_use]
    pub fn new() -> Self {
        Ledger {
            seq: 1,
            ..Ledger::default()
        }
    }

    /// A ledger whose history is in `archive`: memory starts empty.
    #[must_use]
    pub fn with_archive(archive: Box<dyn Archive>) -> Self {
        Ledger {
            archive: Some(archive),
            ..Ledger::new()
        }
    }

    pub(crate) fn find_request(&self, id: &str) -> Option<Cow<'_, Request>> {
        match self.requests.get(id) {
            Some(entry) => Some(Cow::Borrowed(&entry.request)),
            None => self.archive.as_ref()?.request(id).map(Cow::Owned),
        }
    }

    pub(crate) fn find_claim(&self, id: &str) -> Option<u64> {
        match self.claims.get(id) {
            Some(claim) => Some(claim.fingerprint),
            None => self.archive.as_ref()?.claim(id),
        }
    }

    /// Request `id` in memory, to be changed: fetched from the archive when it is not there.
    fn request_mut(&mut self, id: &str) -> Option<&mut Request> {
        if !self.requests.contains_key(id) {
            let request = self.archive.as_ref()?.request(id)?;
            self.requests.insert(
                id.into(),
                Entry {
                    request: Arc::new(request),
                    touched: 0,
                },
            );
        }
        let seq = self.seq;
        let entry = self.requests.get_mut(id)?;
        entry.touched = seq;
        Some(Arc::make_mut(&mut entry.request))
    }

    /// The registry and ledger rules for an envelope that passed the stateless ones, from
    /// `misaddressed` on. `own_line` says whether the judge itself wrote a line with this id.
    pub fn judge(
        &self,
        envelope: &Envelope<'_>,
        owner: &str,
        registry: &Registry,
        own_line: &dyn Fn(&str) -> bool,
    ) -> Verdict {
        match crate::rules::stateful(self, envelope, owner, registry, own_line) {
            Ok(verdict) => verdict,
            Err(refusal) => Verdict::Refused(refusal),
        }
    }

    /// The ledger's record of an accepted envelope, with the thread resolved.
    #[must_use]
    pub fn accepted(&self, envelope: &Envelope<'_>) -> Accepted {
        let context_id = match (&envelope.context_id, envelope.kind) {
            (Some(context), _) => context.to_string(),
            (None, Kind::Request) => envelope.id.to_string(),
            (None, _) => envelope
                .correlates_to
                .as_deref()
                .and_then(|id| self.find_request(id))
                .map_or_else(|| envelope.thread().to_owned(), |r| r.context_id.clone()),
        };
        Accepted {
            id: envelope.id.to_string(),
            from: envelope.from.to_string(),
            to: envelope.to.to_string(),
            kind: envelope.kind,
            correlates_to: envelope.correlates_to.as_deref().map(str::to_owned),
            context_id,
            task_id: envelope.task_id.as_deref().map(str::to_owned),
            state: envelope.state,
            priority: envelope.priority,
            reply_by: envelope.reply_by,
            created_at: envelope.created_at,
            fingerprint: envelope.fingerprint,
            owner: None,
        }
    }

    /// Record an accepted line, seen by the judge at `seen_at`.
    pub fn apply(&mut self, line: Accepted, seen_at: DateTime<Utc>) {
        if let Some(archive) = &self.archive {
            archive.claimed(&line.id);
        }
        self.claims.insert(
            line.id.as_str().into(),
            Claim {
                fingerprint: line.fingerprint,
                touched: self.seq,
            },
        );
        match line.kind {
            Kind::Request => {
                let request = Arc::new(Request {
                    id: line.id,
                    requester: line.from,
                    addressee: line.to,
                    context_id: line.context_id,
                    task_id: line.task_id,
                    state: State::Submitted,
                    priority: line.priority,
                    reply_by: line.reply_by,
                    created_at: line.created_at,
                    seen_at,
                    state_since: seen_at,
                    epoch: 0,
                    responses: 0,
                    first_response_at: None,
                    closed_at: None,
                    rings: 0,
                    last_ring_at: None,
                    escalated: false,
                    rings_total: 0,
                    location: None,
                    owner: line.owner,
                });
                self.requests.insert(
                    request.id.as_str().into(),
                    Entry {
                        request,
                        touched: self.seq,
                    },
                );
            }
            Kind::Response => {
                let (Some(id), Some(state)) = (&line.correlates_to, line.state) else {
                    return;
                };
                if let Some(request) = self.request_mut(id) {
                    request.state = state;
                    request.state_since = seen_at;
                    request.epoch += 1;
                    request.rings = 0;
                    request.last_ring_at = None;
                    request.escalated = false;
                    request.responses += 1;
                    if line.from == request.addressee {
                        request.first_response_at.get_or_insert(seen_at);
                    }
                    if state.is_terminal() {
                        request.closed_at.get_or_insert(seen_at);
                    }
                }
            }
            Kind::Note => self.ring_arrived(&line, seen_at),
        }
    }

    /// A note of the doorbell loop read back from the debtor's inbox: when it is the last
    /// ring of its request's epoch, the next ring counts its interval from now, not from when
    /// the ring was meant (a locked inbox can hold a ring back for long).
    fn ring_arrived(&mut self, line: &Accepted, seen_at: DateTime<Utc>) {
        if line.from != "debt-loop" || !line.id.starts_with("ring:") {
            return;
        }
        let Some(request_id) = line.correlates_to.as_deref() else {
            return;
        };
        let Some(request) = self.request_mut(request_id) else {
            return;
        };
        if request.rings > 0 && crate::debts::ring_id(request, request.rings) == line.id {
            request.last_ring_at = request.last_ring_at.max(Some(seen_at));
        }
    }

    /// Record that the doorbell loop wrote `due` for `request` in `epoch` at `at`. A record
    /// for an older epoch (the state moved on meanwhile) changes nothing.
    pub fn rang(&mut self, request: &str, epoch: u32, due: crate::debts::Due, at: DateTime<Utc>) {
        let Some(request) = self.request_mut(request) else {
            return;
        };
        if request.epoch != epoch {
            return;
        }
        match due {
            // A ring already counted (a record seen twice) changes nothing.
            crate::debts::Due::Ring(n) if n <= request.rings => {}
            crate::debts::Due::Ring(n) => {
                request.rings = n;
                request.rings_total += 1;
                request.last_ring_at = Some(at);
            }
            crate::debts::Due::Escalate => request.escalated = true,
        }
    }

    /// Record where request `id`'s line is in its addressee's inbox.
    pub fn locate(&mut self, id: &str, gen: u32, offset: u64) {
        if let Some(request) = self.request_mut(id) {
            request.location = Some((gen, offset));
        }
    }

    /// Whether `id` was claimed by an accepted line.
    #[must_use]
    pub fn is_claimed(&self, id: &str) -> bool {
        self.find_claim(id).is_some()
    }

    /// The fingerprint of the accepted line that claimed `id`, from memory or the archive.
    #[must_use]
    pub fn fingerprint_of(&self, id: &str) -> Option<u64> {
        self.find_claim(id)
    }

    /// Request `id`, from memory or the archive.
    #[must_use]
    pub fn request(&self, id: &str) -> Option<Cow<'_, Request>> {
        self.find_request(id)
    }

    /// The requests in memory: every open one once [`Ledger::load`] brought them in (the
    /// judge does at start), plus those changed since the last save.
    pub fn requests(&self) -> impl Iterator<Item = &Request> {
        self.requests.values().map(|entry| &*entry.request)
    }

    /// Open requests in memory, oldest state first.
    #[must_use]
    pub fn debts(&self) -> Vec<Debt<'_>> {
        let mut debts: Vec<Debt<'_>> = self
            .requests()
            .filter(|r| r.is_open())
            .map(|request| Debt { request })
            .collect();
        debts.sort_by(|a, b| {
            (a.request.state_since, &a.request.id).cmp(&(b.request.state_since, &b.request.id))
        });
        debts
    }

    /// Bring requests from the archive into memory, as they were saved; a request memory
    /// already holds is newer and stays.
    pub fn load(&mut self, requests: impl IntoIterator<Item = Request>) {
        for request in requests {
            if !self.requests.contains_key(request.id.as_str()) {
                self.requests.insert(
                    request.id.as_str().into(),
                    Entry {
                        request: Arc::new(request),
                        touched: 0,
                    },
                );
            }
        }
    }

    /// Count every open request in memory as changed, so the next save writes them all
    /// (their due times, after the schedule changed).
    pub fn touch_open(&mut self) {
        let seq = self.seq;
        for entry in self.requests.values_mut() {
            if entry.request.is_open() {
                entry.touched = seq;
            }
        }
    }

    /// The requests changed since the last call, to be saved; later changes go into the
    /// next set. Memory keeps them until [`Ledger::saved`] says the archive has them.
    pub fn take_changes(&mut self) -> Changes {
        let seq = self.seq;
        self.seq += 1;
        Changes {
            seq,
            requests: self
                .requests
                .values()
                .filter(|entry| entry.touched == seq)
                .map(|entry| Arc::clone(&entry.request))
                .collect(),
        }
    }

    /// The archive now holds every change set up to `seq`: what it holds leaves memory,
    /// except the open requests. Without an archive nothing leaves.
    pub fn saved(&mut self, seq: u64) {
        if self.archive.is_none() {
            return;
        }
        self.claims.retain(|_, claim| claim.touched > seq);
        self.requests
            .retain(|_, entry| entry.touched > seq || entry.request.is_open());
    }

    /// The change set being filled.
    #[must_use]
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// How many claimed ids memory holds (without an archive: every id claimed).
    #[must_use]
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}
