//! Judging a line: its verdict from the rules, lines held for a request not seen yet or for
//! their turn in a crossing conversation (`turns.rs`), the judge's own sealed lines recognised.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;

use chrono::{DateTime, Utc};
use doorbell_core::notice::refusal_key;
use doorbell_core::{
    is_agent_name, judge_parsed, judge_stateless, Envelope, Kind, Limits, RefusalReason, Verdict,
};

use super::record::Bytes;
use super::{CatchUp, Judge};
use crate::append::open_inbox;
use crate::halves::Parsed;
use crate::journal::{Record, RingRef, Word};
use crate::turns::{Pending, Place, Turns};
use crate::Result;

/// A line whose request has not been seen yet.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) inbox: String,
    pub(super) gen: u32,
    pub(super) offset: u64,
    pub(super) bytes: Vec<u8>,
    /// The line's id: a later line with the same id waits behind it.
    pub(super) id: String,
}

/// The lines held in one sweep, by the request they wait for, and their ids (a later line
/// with a held id waits in the same place); and the responses that wait for their turn in a
/// crossing conversation (`turns.rs`).
#[derive(Debug, Default)]
pub(super) struct HeldLines {
    pub(super) by_request: HashMap<String, Vec<Held>>,
    pub(super) ids: HashMap<String, String>,
    pub(super) turns: Turns,
    pub(super) waiting: HashMap<Place, Held>,
    /// The ids of the waiting lines, and where each waits: the line itself is not behind.
    pub(super) waiting_ids: HashMap<String, Place>,
    /// Waiting lines whose turn came, to be judged by the outermost judging of a line (so
    /// that a long run of them is a loop, not a recursion).
    pub(super) ready: std::collections::VecDeque<Place>,
    pub(super) releasing: bool,
    /// Where each inbox's last round stopped reading (its generation, the offset): the next
    /// round goes on from there, past lines that are held and keep `judged_to` behind them.
    pub(super) read_to: HashMap<String, (u32, u64)>,
}

impl HeldLines {
    pub(super) fn hold(&mut self, request: String, line: Held) {
        self.ids.insert(line.id.clone(), request.clone());
        self.by_request.entry(request).or_default().push(line);
    }

    /// The lines that waited for `request`, in the order they were held.
    pub(super) fn release(&mut self, request: &str) -> Vec<Held> {
        let lines = self.by_request.remove(request).unwrap_or_default();
        for line in &lines {
            self.ids.remove(&line.id);
        }
        lines
    }

    /// Where the lines of `inbox`'s generation `gen` held in this sweep start.
    pub(super) fn offsets_in(&self, inbox: &str, gen: u32) -> std::collections::HashSet<u64> {
        self.by_request
            .values()
            .flatten()
            .filter(|h| h.inbox == inbox && h.gen == gen)
            .map(|h| h.offset)
            .chain(
                self.waiting
                    .keys()
                    .filter(|(name, g, _)| name == inbox && *g == gen)
                    .map(|(_, _, offset)| *offset),
            )
            .collect()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_request.is_empty()
    }

    /// Whether no line is held and none waits for its turn: every line read so far is
    /// journaled.
    pub(super) fn none_aside(&self) -> bool {
        self.by_request.is_empty() && self.waiting.is_empty()
    }

    /// Whether a line of `inbox`'s generation `gen` is held or waits for its turn.
    pub(super) fn any_from(&self, inbox: &str, gen: u32) -> bool {
        self.by_request
            .values()
            .flatten()
            .chain(self.waiting.values())
            .any(|line| line.inbox == inbox && line.gen == gen)
    }

    /// Whether the line at this place takes a turn in this sweep (see [`Turns::takes_turn`]).
    pub(super) fn takes_turn(&self, inbox: &str, gen: u32, offset: u64) -> bool {
        !self.turns.is_empty() && self.turns.takes_turn(&(inbox.to_owned(), gen, offset))
    }

    /// Keep the line at `place` aside when it is a response whose turn has not come.
    pub(super) fn wait_for_turn(&mut self, place: &Place, bytes: &[u8]) -> bool {
        if self.turns.may_judge(place) {
            return false;
        }
        self.keep_waiting(place, bytes);
        true
    }

    /// Keep the line at `place` aside until its turn; a later line with its id waits behind
    /// it (as behind a held line), so that a reuse never claims the id first.
    pub(super) fn keep_waiting(&mut self, place: &Place, bytes: &[u8]) {
        let (inbox, gen, offset) = place.clone();
        let id = identity_of(bytes).0.unwrap_or_default();
        if !id.is_empty() && !self.ids.contains_key(&id) {
            self.ids.insert(id.clone(), turn_bucket(&id));
            self.waiting_ids.insert(id.clone(), place.clone());
        }
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
    }
}

/// The lines still held once every inbox was read to its end, in the order they are judged:
/// each request's lines in the order they were held (a reuse of an id behind the line it
/// reuses), and after every held line whose id is that request, so that a request held
/// behind another line is judged before the answers held for it, as a live judge would.
/// Otherwise (and to break a cycle) the request whose first line comes first by inbox and
/// offset goes first.
pub(super) fn last_held_in_order(by_request: HashMap<String, Vec<Held>>) -> Vec<Held> {
    use std::collections::BTreeSet;
    type Key = (String, u32, u64);
    let key = |lines: &[Held]| -> Key {
        let first = &lines[0];
        (first.inbox.clone(), first.gen, first.offset)
    };
    // How many held lines carry each request's id: until none is judged, it waits.
    let mut blockers: HashMap<&str, usize> = HashMap::new();
    for line in by_request.values().flatten() {
        if by_request.contains_key(&line.id) {
            *blockers.entry(line.id.as_str()).or_default() += 1;
        }
    }
    let mut ready: BTreeSet<(Key, &str)> = BTreeSet::new();
    let mut blocked: BTreeSet<(Key, &str)> = BTreeSet::new();
    for (request, lines) in by_request.iter().filter(|(_, lines)| !lines.is_empty()) {
        let entry = (key(lines), request.as_str());
        if blockers.contains_key(request.as_str()) {
            blocked.insert(entry);
        } else {
            ready.insert(entry);
        }
    }
    let mut order: Vec<&str> = Vec::with_capacity(by_request.len());
    while let Some(next) = ready.pop_first().or_else(|| blocked.pop_first()) {
        let request = next.1;
        order.push(request);
        for line in &by_request[request] {
            let Some(count) = blockers.get_mut(line.id.as_str()) else {
                continue;
            };
            *count -= 1;
            if *count == 0 {
                let waiting = line.id.as_str();
                let entry = (key(&by_request[waiting]), waiting);
                if blocked.remove(&entry) {
                    ready.insert(entry);
                }
            }
        }
    }
    let order: Vec<String> = order.into_iter().map(str::to_owned).collect();
    let mut by_request = by_request;
    order
        .into_iter()
        .flat_map(|request| by_request.remove(&request).unwrap_or_default())
        .collect()
}

/// The `inbox/gen/offset` keys of the refusals a notice line names in its data part.
pub(super) fn notice_covers(bytes: &[u8]) -> Vec<String> {
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

/// The bucket that lines with the id of a line waiting for its turn wait in: no request's id
/// (ids have no NUL).
pub(super) fn turn_bucket(id: &str) -> String {
    format!("\0turn\0{id}")
}

/// Whether a line begins with an id only the bridge may use (`{"id":"bridge:…"`, as the
/// judge writes its lines): the cheap test before a long line's seal is checked.
pub(super) fn names_reserved_id(line: &[u8]) -> bool {
    line.strip_prefix(br#"{"id":""#)
        .and_then(|rest| rest.split(|&b| b == b'"').next())
        .and_then(|id| std::str::from_utf8(id).ok())
        .is_some_and(doorbell_core::is_reserved_id)
}

/// The id and sender a line claims, read as leniently as possible, for telling the sender
/// about a line that could not be judged as an envelope: as JSON when it parses, else from
/// the first object's top-level `"id"` and `"from"` strings (a key written twice with two
/// values names nobody). So a line refused as `bad-json` (a duplicate key, a byte-order mark,
/// a raw tab in a string, two objects on one line) or over the length limit (its first
/// bytes) is still told to its sender.
pub(super) fn identity_of(bytes: &[u8]) -> (Option<String>, Option<String>) {
    #[derive(serde::Deserialize)]
    struct Claimed {
        id: Option<serde_json::Value>,
        from: Option<serde_json::Value>,
    }
    let line = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let (id, from) = match serde_json::from_slice::<Claimed>(line) {
        Ok(claimed) => (
            claimed.id.and_then(|v| v.as_str().map(str::to_owned)),
            claimed.from.and_then(|v| v.as_str().map(str::to_owned)),
        ),
        Err(_) => top_level_claims(line),
    };
    (
        id.filter(|id| doorbell_core::is_id(id)),
        from.filter(|f| is_agent_name(f)),
    )
}

/// The `"id"` and `"from"` strings at the top level of the first JSON object in `bytes`
/// (which may be cut short), scanned without parsing the rest.
fn top_level_claims(bytes: &[u8]) -> (Option<String>, Option<String>) {
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
    let (mut id, mut from): (Option<Option<String>>, Option<Option<String>>) = (None, None);
    let mut depth = 0usize;
    let mut at = 0usize;
    // The last string read at depth 1, while a `:` may still make it a key.
    let mut key: Option<std::ops::Range<usize>> = None;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                let Some(end) = string_end(bytes, at) else {
                    break;
                };
                if depth == 1 {
                    key = Some(at..end);
                }
                at = end;
                continue;
            }
            b':' if depth == 1 => {
                if let Some(range) = key.take() {
                    let value_at = skip_space(bytes, at + 1);
                    let value = (bytes.get(value_at) == Some(&b'"'))
                        .then(|| string_end(bytes, value_at))
                        .flatten()
                        .and_then(|end| json_string(&bytes[value_at..end]));
                    let slot = match &bytes[range] {
                        b"\"id\"" => &mut id,
                        b"\"from\"" => &mut from,
                        _ => &mut None,
                    };
                    *slot = match slot.take() {
                        None => Some(value),
                        Some(first) if first == value => Some(first),
                        Some(_) => Some(None),
                    };
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    break;
                }
            }
            _ => {}
        }
        if !bytes[at].is_ascii_whitespace() && bytes[at] != b':' && bytes[at] != b'"' {
            key = None;
        }
        at += 1;
    }
    (id.flatten(), from.flatten())
}

/// Where the JSON string starting at `start` (its opening quote) ends, past its closing quote.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start + 1;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' => at += 2,
            b'"' => return Some(at + 1),
            _ => at += 1,
        }
    }
    None
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// A quoted JSON string's text, leniently: escapes decoded where they are valid JSON.
fn json_string(quoted: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(quoted).ok()?;
    serde_json::from_str(text)
        .ok()
        .or_else(|| Some(text[1..text.len() - 1].to_owned()))
}

impl Judge {
    /// Whether a line judged during a catch-up waits for the request it names: refused
    /// `unknown-request`; or naming a request a held line may yet make (its id is held),
    /// for without it a reason that needs the request (misaddressed, a transition) could
    /// not be told and a later rule (id-reused) would speak; or a response refused while
    /// its request is unknown: the request may be in an inbox not read yet, and then
    /// misaddressed, which comes before every other reason the ledger gives
    /// (unknown-sender, borrowed-name, id-reused), may be its reason, as it was live.
    fn waits_for_request(
        &self,
        verdict: &Verdict,
        envelope: &Envelope<'_>,
        held: &HeldLines,
    ) -> bool {
        if matches!(
            verdict,
            Verdict::Refused(refusal) if refusal.reason == RefusalReason::UnknownRequest
        ) {
            return true;
        }
        envelope.correlates_to.as_deref().is_some_and(|request| {
            (held.ids.contains_key(request)
                || (envelope.kind == Kind::Response && matches!(verdict, Verdict::Refused(_))))
                && self.snapshot.ledger.request(request).is_none()
        })
    }

    /// Judge one complete line; `held` is where a line waiting for its request goes while
    /// inboxes are still being read (`None` once every inbox was read).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn judge_complete<'a>(
        &mut self,
        name: &str,
        gen: u32,
        offset: u64,
        bytes: &'a [u8],
        parsed: Option<Parsed<'a>>,
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
        let (verdict, envelope, sealed) = self.judge_bytes(name, bytes, parsed);
        if let (Some(envelope), Some(held)) = (&envelope, held.as_deref_mut()) {
            // A response the scan did not see takes its turn behind its own inbox's lines.
            if let (Kind::Response, Some(request)) = (envelope.kind, &envelope.correlates_to) {
                if held.turns.join(&place, request) {
                    held.keep_waiting(&place, bytes);
                    return Ok(());
                }
            }
            let unknown_request = self.waits_for_request(&verdict, envelope, held);
            // A line whose id a held line already carries is judged after it, as it was
            // written after it: otherwise a reuse would claim the id first.
            // Unless its id takes turns: those lines claim it in the order they were written.
            let behind = held
                .ids
                .get(&*envelope.id)
                .filter(|_| held.waiting_ids.get(&*envelope.id) != Some(&place))
                .filter(|_| !held.turns.claims_in_turn(&place, &envelope.id))
                .cloned();
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
            stats.arrived(name, line);
        }
        let verdict = self.shown_again(name, gen, verdict, envelope.as_ref());
        self.record(
            name,
            gen,
            offset,
            span,
            Bytes::Line(bytes),
            &verdict,
            identity,
            accepted,
            now,
            stats,
        )?;
        let Some(held) = held else {
            return Ok(());
        };
        let id = envelope.as_ref().map(|e| e.id.to_string());
        self.after_judged(held, &place, id.as_deref(), new_request, now, stats)
    }

    /// A duplicate that is a copy of a message its reader had not read when the inbox was
    /// rewritten is shown to the reader: accepted (a record with no ledger line), never a
    /// second message. Any other verdict stands.
    fn shown_again(
        &self,
        name: &str,
        gen: u32,
        verdict: Verdict,
        envelope: Option<&Envelope<'_>>,
    ) -> Verdict {
        match (verdict, envelope) {
            (Verdict::Duplicate, Some(e)) if self.snapshot.unread_copy(name, gen, &e.id) => {
                tracing::info!(inbox = name, id = %e.id, "a copy of a message not read before its inbox was rewritten: shown to its reader");
                Verdict::Accepted
            }
            (verdict, _) => verdict,
        }
    }

    /// What a line's verdict lets go: the lines held for its request (when it is one), those
    /// with its id that waited behind it, and the next response of its conversation.
    fn after_judged(
        &mut self,
        held: &mut HeldLines,
        place: &Place,
        id: Option<&str>,
        new_request: Option<String>,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        // Lines with the id of a line that waited for its turn waited behind it: now theirs.
        if let Some(id) = id {
            let bucket = turn_bucket(id);
            if held.ids.get(id) == Some(&bucket) && held.waiting_ids.get(id) == Some(place) {
                held.ids.remove(id);
                held.waiting_ids.remove(id);
                for line in held.release(&bucket) {
                    self.judge_held(&line, Some(held), now, stats)?;
                }
            }
        }
        // Lines that were waiting for this request can be judged now.
        if let Some(id) = new_request {
            for line in held.release(&id) {
                self.judge_held(&line, Some(held), now, stats)?;
            }
        }
        self.next_turn(held, place, now, stats)
    }

    /// Judge a line that was held.
    pub(super) fn judge_held(
        &mut self,
        line: &Held,
        held: Option<&mut HeldLines>,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        self.judge_complete(
            &line.inbox,
            line.gen,
            line.offset,
            &line.bytes,
            None,
            now,
            held,
            stats,
        )
    }

    /// The line at `place` was judged: the next line of each of its turns (its conversation's,
    /// its id's), if it waits, has its turn. The outermost judging of a line judges what became ready, in a loop.
    pub(super) fn next_turn(
        &mut self,
        held: &mut HeldLines,
        place: &Place,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        for next in held.turns.judged(place) {
            if held.waiting.contains_key(&next) && held.turns.may_judge(&next) {
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
            self.judge_held(&line, Some(held), now, stats)?;
        }
        held.releasing = false;
        Ok(())
    }

    /// The turns of the responses waiting in `names` (`turns.rs`): each inbox read from where
    /// judging stopped, when its file is the one the journal knows.
    pub(super) fn turns(&self, names: &[String]) -> Turns {
        // Turns are between inboxes: with unjudged bytes in one inbox at most (a command's
        // catch-up, nearly always) there are none, and no inbox needs opening for them.
        let waiting: Vec<&String> = names
            .iter()
            .filter(|name| self.has_unjudged_bytes(name))
            .collect();
        if waiting.len() < 2 {
            return Turns::default();
        }
        let mut pending = Vec::new();
        let mut waiting_bytes = 0;
        for name in waiting {
            let Ok(path) = self.bridge.inbox_path(name) else {
                continue;
            };
            let Ok(file) = open_inbox(&path, false) else {
                continue;
            };
            let Ok(meta) = file.metadata() else {
                continue;
            };
            // A name whose file is another inbox's (a hard link, a rename) is never judged:
            // its lines take no turns.
            if self
                .snapshot
                .same_file_as_another(name, &file, &meta)
                .is_some()
            {
                continue;
            }
            let (gen, from, judged) = match self.snapshot.inboxes.get(name) {
                Some(known) if (known.dev, known.ino) == (meta.dev(), meta.ino()) => {
                    (known.gen, known.judged_to, Some(&known.judged_beyond))
                }
                // Replaced, moved or restored: its lines take no turns in this sweep.
                Some(_) => continue,
                None => (0, 0, None),
            };
            waiting_bytes += meta.len().saturating_sub(from);
            pending.push((name.as_str(), file, gen, from, judged));
        }
        let judged: Vec<Box<dyn Fn(u64) -> bool + Sync + '_>> = pending
            .iter()
            .map(|(_, _, _, _, judged)| {
                let judged = *judged;
                Box::new(move |offset| judged.is_some_and(|j| super::tail::covered(j, offset)))
                    as Box<dyn Fn(u64) -> bool + Sync + '_>
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
        // A backlog's inboxes are read each on one thread, as many at once as the judge has
        // helpers and itself; a few lines on the judge's alone.
        let workers = if waiting_bytes >= crate::turns::SCAN_APART_BYTES {
            self.sharing.helpers + 1
        } else {
            1
        };
        Turns::scan(&inboxes, self.limits.max_line_bytes, workers)
    }

    /// Whether `name`'s inbox may hold bytes not judged yet: it is longer than where judging
    /// stopped, or not the file the journal knows (or cannot be looked at: perhaps).
    fn has_unjudged_bytes(&self, name: &str) -> bool {
        let Ok(meta) = self
            .bridge
            .inbox_path(name)
            .and_then(|path| std::fs::symlink_metadata(path).map_err(crate::Error::from))
        else {
            return true;
        };
        match self.snapshot.inboxes.get(name) {
            Some(known) if (known.dev, known.ino) == (meta.dev(), meta.ino()) => {
                meta.len() > known.judged_to
            }
            _ => meta.len() > 0,
        }
    }

    /// Whether `bytes` is a line the judge wrote, by its seal: under its key, or, while a
    /// missing key's lines are adopted, under any.
    pub(super) fn under_seal(&self, bytes: &[u8]) -> bool {
        self.seal.verifies(bytes) || (self.adopting.is_some() && crate::seal::carries_seal(bytes))
    }

    /// Whether `bytes`, a line of `name`'s inbox, is the judge's own whatever its length:
    /// exactly a line it intends to write there and has not read back yet, or a line under
    /// its seal whose first field is a reserved id (a copy of one it wrote, in a new file of
    /// the inbox; one whose intent the journal lost). Its notices, rings and report notes can
    /// be longer than a small `max_line_bytes`; refusing one would leave its intent open, and
    /// every restart would write it again, never delivered.
    pub(super) fn is_own_line(&self, name: &str, bytes: &[u8]) -> bool {
        self.snapshot
            .intents
            .values()
            .any(|i| i.inbox == name && i.line.as_bytes() == bytes)
            || (names_reserved_id(bytes) && self.under_seal(bytes))
    }

    /// The verdict on one complete line, and whether it is a line of the judge's own that
    /// only its seal shows (the journal lost its intent).
    /// `parsed`: its stateless half, when a helper worked it out (`halves`). An over-long
    /// line is worked out here again: the judge's own lines have no limit.
    pub(super) fn judge_bytes<'a>(
        &self,
        name: &str,
        bytes: &'a [u8],
        parsed: Option<Parsed<'a>>,
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
                let verified = self.under_seal(bytes);
                sealed.set(verified);
                verified
            }
        };
        let unlimited = Limits {
            max_line_bytes: usize::MAX,
        };
        let limits = if bytes.len() > self.limits.max_line_bytes && self.is_own_line(name, bytes) {
            &unlimited
        } else {
            &self.limits
        };
        let stateless = match parsed {
            Some(Err(refusal)) if refusal.reason == RefusalReason::LineTooLong => None,
            parsed => parsed,
        }
        .unwrap_or_else(|| judge_stateless(bytes, Some(name), limits));
        let (verdict, envelope) =
            judge_parsed(stateless, name, &self.registry, &self.snapshot.ledger, &own);
        (verdict, envelope, sealed.get())
    }

    /// A line of the judge's own that the journal does not know (it was lost or damaged):
    /// journal the intent it was written for, so the ledger counts its ring and nothing
    /// writes it again. The intent is dated when the line was written.
    pub(super) fn recognise_own(
        &mut self,
        name: &str,
        bytes: &[u8],
        envelope: &Envelope<'_>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let id: &str = &envelope.id;
        if let Some(adopted) = self
            .adopting
            .as_mut()
            .filter(|_| !self.seal.verifies(bytes))
        {
            *adopted += 1;
        }
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
}

#[cfg(test)]
mod tests {
    use super::{identity_of, top_level_claims};

    fn claims(line: &str) -> (Option<String>, Option<String>) {
        top_level_claims(line.as_bytes())
    }

    #[test]
    fn the_top_level_id_and_sender_are_read_from_what_does_not_parse() {
        let some = |s: &str| Some(s.to_owned());
        // A raw tab in a string, a trailing comma: not JSON, and still readable.
        assert_eq!(
            claims("{\"id\":\"a\",\"from\":\"design\",\"text\":\"\t\",}"),
            (some("a"), some("design"))
        );
        // Nested keys are not the line's.
        assert_eq!(
            claims(r#"{"data":{"id":"x","from":"mallory"},"from":"design"}"#),
            (None, some("design"))
        );
        // A key written twice with two values names nobody; with one value, that one.
        assert_eq!(
            claims(r#"{"from":"a","from":"b","id":"i","id":"i"}"#),
            (some("i"), None)
        );
        // A quote escaped in a string is no end of it; a value that is no string is none.
        assert_eq!(
            claims(r#"{"text":"say \"from\": \"x\"","from":7,"id":"i"}"#),
            (some("i"), None)
        );
        // The first object of two, and a line cut short.
        assert_eq!(claims(r#"{"from":"a"}{"from":"b"}"#), (None, some("a")));
        assert_eq!(claims(r#"{"from":"a","text":"yyyy"#), (None, some("a")));
        assert_eq!(claims("\u{feff}{\"from\":\"a\"}"), (None, some("a")));
        assert_eq!(claims(""), (None, None));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_give_an_answer_and_no_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = identity_of(&bytes);
        }
    }
}
