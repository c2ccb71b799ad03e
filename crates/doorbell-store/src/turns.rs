//! The order of crossing conversations in one sweep (DESIGN §8.3).
//!
//! A request's responses come from two inboxes: the addressee's answers sit in the
//! requester's inbox, the requester's input and cancel in the addressee's. A judge that
//! reads finished files inbox by inbox would judge one side's lines all before the other's,
//! and refuse what a live judge, seeing the lines as they were appended, accepts (the
//! requester's `working` after an `input-required` read later, a `completed` read before
//! the input it followed).
//!
//! So before a sweep of several inboxes, the judge reads what waits in each and finds the
//! requests answered from more than one of them. Their responses take turns: in the order
//! of their senders' `createdAt`, each inbox's own order kept (a line never passes one
//! written before it in its inbox, whatever its clock says). A response whose turn has not
//! come waits; it is judged when the one before it has been, or at the end of the sweep,
//! whatever happened: nothing waits forever. Only the order of judging changes; every line
//! still gets its verdict from the rules.
//!
//! The same goes for an id that lines in more than one inbox claim: the first written gets
//! it, as it would live, and the others are refused as reusing it, whichever inbox is read
//! first.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::File;

use chrono::DateTime;
use memchr::memmem;

use crate::reader::{Line, LineReader};

/// A line's place: its inbox, the inbox's generation, its offset.
pub(crate) type Place = (String, u32, u64);

/// An inbox to scan: its name, its file, its generation, and where judging stopped.
pub(crate) struct Pending<'a> {
    pub name: &'a str,
    pub file: File,
    pub gen: u32,
    pub from: u64,
    /// Lines past `from` already judged: not in any turn.
    pub judged: &'a (dyn Fn(u64) -> bool + Sync),
}

/// Below this many bytes waiting in all, the inboxes are scanned on the judge's thread: a
/// live sweep's few lines cost less than starting another.
pub(crate) const SCAN_APART_BYTES: u64 = 4 << 20;

/// What the scan finds in one inbox: each response's request, offset and sender's time, and
/// every line's id hash, offset and length, in reading order.
#[derive(Debug, Default)]
struct Found {
    responses: Vec<(String, u64, Option<i64>)>,
    lines: Vec<(u64, u64, usize)>,
}

/// Read what waits in one inbox. A file that cannot be read gives what was read of it.
fn scan_one(pending: &Pending<'_>, reader: &mut LineReader) -> Found {
    let mut found = Found::default();
    let _ = reader.read(&pending.file, pending.from, |line| -> std::io::Result<()> {
        let Line::Complete { offset, bytes } = line else {
            return Ok(());
        };
        if (pending.judged)(offset) {
            return Ok(());
        }
        // Only a line that names a response, even escaped, is parsed whole.
        let named =
            memmem::find(bytes, b"response").is_some() || memmem::find(bytes, b"\\u").is_some();
        let id = match leading_id(bytes) {
            Some(id) if !named => Cow::Borrowed(id),
            _ => {
                let Some(head) = head_of(bytes) else {
                    return Ok(());
                };
                if let Some(request) = head.request {
                    found.responses.push((request, offset, head.at));
                }
                let Some(id) = head.id else {
                    return Ok(());
                };
                id
            }
        };
        let hash = xxhash_rust::xxh3::xxh3_64(id.as_bytes());
        found.lines.push((hash, offset, bytes.len()));
        Ok(())
    });
    found
}

/// Read what waits in each inbox, on up to `workers` threads (each inbox on one of them, the
/// next free taking the next inbox); in the inboxes' order.
fn scan_each(inboxes: &[Pending<'_>], max_line_bytes: usize, workers: usize) -> Vec<Found> {
    let workers = workers.min(inboxes.len());
    if workers < 2 {
        let mut reader = LineReader::new(max_line_bytes);
        return inboxes
            .iter()
            .map(|pending| scan_one(pending, &mut reader))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut found: Vec<(usize, Found)> = std::thread::scope(|scope| {
        let work = || {
            let mut reader = LineReader::new(max_line_bytes);
            let mut done = Vec::new();
            loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(pending) = inboxes.get(index) else {
                    return done;
                };
                done.push((index, scan_one(pending, &mut reader)));
            }
        };
        let helpers: Vec<_> = (1..workers)
            .map(|_| {
                std::thread::Builder::new()
                    .name("scan".into())
                    .spawn_scoped(scope, work)
            })
            .collect();
        // This thread works too; a helper that could not start leaves its share to it.
        let mut found = work();
        for helper in helpers.into_iter().flatten() {
            found.extend(helper.join().unwrap_or_default());
        }
        found
    });
    found.sort_unstable_by_key(|(index, _)| *index);
    found.into_iter().map(|(_, found)| found).collect()
}

/// A line seen by the scan: the index of its inbox, its offset, its sender's time.
type Seen = (usize, u64, Option<i64>);

#[derive(Debug, Default, PartialEq, Eq)]
struct Queue {
    lines: Vec<Place>,
    next: usize,
}

/// The turns of one sweep.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Turns {
    /// By the request whose responses take turns, or by [`id_turn`] of an id claimed in
    /// several inboxes.
    queues: HashMap<String, Queue>,
    /// Each line in a turn: the queues it is in (its request's, its id's), and its place in
    /// each.
    at: HashMap<Place, Vec<(String, usize)>>,
    /// Each line in a turn: where it stands in the one order all queues follow.
    rank: HashMap<Place, Rank>,
}

/// The queue of the lines that claim `id`: no request's id (ids have no NUL).
fn id_turn(id: &str) -> String {
    format!("\0id\0{id}")
}

/// The top-level fields of a line the turns need, as the judge reads them: a nested
/// `"kind"` (a data part's) is not the line's, and an escaped one (`"respons\u0065"`) is.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "correlatesTo")]
    correlates_to: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "createdAt")]
    created_at: Option<Cow<'a, str>>,
}

/// What the turns need of a line.
struct LineHead<'a> {
    id: Option<Cow<'a, str>>,
    /// Its request, when it is a response.
    request: Option<String>,
    /// Its sender's time.
    at: Option<i64>,
}

/// What the turns need of a line; a line that is not JSON is none.
fn head_of(line: &[u8]) -> Option<LineHead<'_>> {
    let head: Head<'_> = serde_json::from_slice(line).ok()?;
    let request = match head.kind.as_deref() {
        Some("response") => head.correlates_to.map(Cow::into_owned),
        _ => None,
    };
    let at = head
        .created_at
        .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
        .map(|t| t.timestamp_millis());
    Some(LineHead {
        id: head.id,
        request,
        at,
    })
}

/// Where a line stands in the one order every queue of a sweep follows: its time, its
/// inbox, its offset.
pub(crate) type Rank = (i64, usize, u64);

/// The rank of every line in a queue: by its sender's time, each inbox's times made never to
/// go back (a line without a time takes the one before it), so that every queue keeps every
/// inbox's own order and no two queues order two lines differently (or each could wait for
/// the other).
fn ranks(queues: &[(String, Vec<Seen>)]) -> HashMap<(usize, u64), Rank> {
    let mut lines: Vec<Seen> = queues
        .iter()
        .flat_map(|(_, lines)| lines.iter().copied())
        .collect();
    lines.sort_by_key(|&(index, offset, at)| (index, offset, at.is_none()));
    lines.dedup_by_key(|&mut (index, offset, _)| (index, offset));
    let mut latest: HashMap<usize, i64> = HashMap::new();
    lines
        .into_iter()
        .map(|(index, offset, at)| {
            let last = latest.entry(index).or_insert(i64::MIN);
            *last = (*last).max(at.unwrap_or(i64::MIN));
            ((index, offset), (*last, index, offset))
        })
        .collect()
}

/// The id of a line that begins with it, as doorbell's senders write lines, without parsing
/// the rest: most lines of a backlog claim an id and are nothing else to the turns. `None`
/// when the line begins otherwise or the id is escaped.
fn leading_id(line: &[u8]) -> Option<&str> {
    let rest = line.strip_prefix(br#"{"id":""#)?;
    let end = memchr::memchr(b'"', rest)?;
    let id = &rest[..end];
    if id.contains(&b'\\') {
        return None;
    }
    std::str::from_utf8(id).ok()
}

/// The line of `len` bytes at `offset`, read again.
fn line_at(file: &File, offset: u64, len: usize) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0; len];
    file.read_exact_at(&mut bytes, offset).ok()?;
    Some(bytes)
}

/// The lines that take turns over an id.
fn in_id_turns(by_id: &[(String, Vec<Seen>)]) -> HashSet<(usize, u64)> {
    by_id
        .iter()
        .flat_map(|(_, lines)| lines.iter().map(|&(index, offset, _)| (index, offset)))
        .collect()
}

/// A response that takes its turn among an id's lines may wait for it: the other responses
/// to its request then take turns with it, even from its own inbox alone, so that none
/// passes it and finds the request in a state it had not reached.
fn waits_on_an_id(lines: &[Seen], in_id_turn: &HashSet<(usize, u64)>) -> bool {
    lines.len() > 1
        && lines
            .iter()
            .any(|&(index, offset, _)| in_id_turn.contains(&(index, offset)))
}

/// Whether `lines` come from more than one inbox.
fn cross(lines: &[Seen]) -> bool {
    lines.iter().any(|(index, _, _)| *index != lines[0].0)
}

impl Turns {
    /// Read what waits in each inbox (on up to `workers` threads) and give turns to the
    /// responses of each request answered from more than one of them, and to the lines of
    /// each id claimed in more than one. A file that cannot be read gives no turns.
    pub fn scan(inboxes: &[Pending<'_>], max_line_bytes: usize, workers: usize) -> Turns {
        // Per request: each response's inbox, offset and time, in reading order.
        let mut responses: HashMap<String, Vec<Seen>> = HashMap::new();
        // Every line's id (its hash, so that a backlog's ids are not all copied), inbox,
        // offset and length.
        let mut lines: Vec<(u64, usize, u64, usize)> = Vec::new();
        for (index, found) in scan_each(inboxes, max_line_bytes, workers)
            .into_iter()
            .enumerate()
        {
            for (request, offset, at) in found.responses {
                responses
                    .entry(request)
                    .or_default()
                    .push((index, offset, at));
            }
            lines.extend(
                found
                    .lines
                    .into_iter()
                    .map(|(hash, offset, len)| (hash, index, offset, len)),
            );
        }
        // The lines of the ids claimed in several inboxes, with their times (read again: they
        // are few). Sorted by hash, the lines of one id are together.
        lines.sort_unstable();
        let mut by_id: Vec<(String, Vec<Seen>)> = Vec::new();
        for same in lines.chunk_by(|a, b| a.0 == b.0) {
            if same.iter().all(|line| line.1 == same[0].1) {
                continue;
            }
            let (_, index, offset, len) = same[0];
            let Some(id) = line_at(&inboxes[index].file, offset, len).and_then(|bytes| {
                let id = match leading_id(&bytes) {
                    Some(id) => id.to_owned(),
                    None => head_of(&bytes)?.id?.into_owned(),
                };
                Some(id)
            }) else {
                continue;
            };
            let seen = same
                .iter()
                .map(|&(_, index, offset, len)| {
                    let at = line_at(&inboxes[index].file, offset, len)
                        .and_then(|bytes| head_of(&bytes)?.at);
                    (index, offset, at)
                })
                .collect();
            by_id.push((id_turn(&id), seen));
        }
        let in_id_turn = in_id_turns(&by_id);
        let mut turns = Turns::default();
        let queues: Vec<(String, Vec<Seen>)> = responses
            .into_iter()
            .filter(|(_, lines)| cross(lines) || waits_on_an_id(lines, &in_id_turn))
            .chain(by_id)
            .collect();
        let ranks = ranks(&queues);
        let place = |index: usize, offset: u64| {
            let inbox = &inboxes[index];
            (inbox.name.to_owned(), inbox.gen, offset)
        };
        for (key, lines) in queues {
            let mut ranked: Vec<Rank> = lines
                .into_iter()
                .map(|(index, offset, _)| ranks[&(index, offset)])
                .collect();
            ranked.sort_unstable();
            ranked.dedup();
            let lines: Vec<Place> = ranked
                .iter()
                .map(|&(_, index, offset)| place(index, offset))
                .collect();
            for (position, (place, rank)) in lines.iter().zip(ranked).enumerate() {
                turns.rank.insert(place.clone(), rank);
                turns
                    .at
                    .entry(place.clone())
                    .or_default()
                    .push((key.clone(), position));
            }
            turns.queues.insert(key, Queue { lines, next: 0 });
        }
        turns
    }

    /// Whether the line at `place` takes a turn in this sweep: its verdict lets the next
    /// line of its queues go, so it is judged on its own, never inside a run of refusals.
    pub fn takes_turn(&self, place: &Place) -> bool {
        self.at.contains_key(place)
    }

    /// Whether no line takes a turn in this sweep.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Whether the line at `place` may be judged now: it takes no turn, or its turn came in
    /// every queue it is in.
    pub fn may_judge(&self, place: &Place) -> bool {
        self.at.get(place).is_none_or(|turns| {
            turns.iter().all(|(key, _)| {
                let queue = &self.queues[key];
                queue.lines.get(queue.next) == Some(place)
            })
        })
    }

    /// Whether the line at `place` takes its turn among the lines that claim `id`: then its
    /// turn, not the lines before it that wait, decides when it claims the id.
    pub fn claims_in_turn(&self, place: &Place, id: &str) -> bool {
        let key = id_turn(id);
        self.at
            .get(place)
            .is_some_and(|turns| turns.iter().any(|(k, _)| *k == key))
    }

    /// A response the scan did not see (appended since, or one it could not read) to
    /// `request`, at `place`: it joins the end of the request's turns when a line of its own
    /// inbox still waits there, so that it never passes one written before it. Returns
    /// whether it must wait.
    pub fn join(&mut self, place: &Place, request: &str) -> bool {
        if self.at.contains_key(place) {
            return !self.may_judge(place);
        }
        let Some(queue) = self.queues.get_mut(request) else {
            return false;
        };
        let behind = queue.lines[queue.next..].iter().any(|p| p.0 == place.0);
        if !behind {
            return false;
        }
        self.at
            .entry(place.clone())
            .or_default()
            .push((request.to_owned(), queue.lines.len()));
        // After every line the scan saw.
        self.rank
            .insert(place.clone(), (i64::MAX, usize::MAX, place.2));
        queue.lines.push(place.clone());
        true
    }

    /// The line at `place` was judged: the queues it was in move on. Returns the places
    /// whose turn it is now.
    pub fn judged(&mut self, place: &Place) -> Vec<Place> {
        let Some(turns) = self.at.remove(place) else {
            return Vec::new();
        };
        let mut next = Vec::new();
        for (key, _) in turns {
            let Some(queue) = self.queues.get_mut(&key) else {
                continue;
            };
            if queue.lines.get(queue.next) == Some(place) {
                queue.next += 1;
            }
            next.extend(queue.lines.get(queue.next).cloned());
        }
        next
    }

    /// The lines before `place` in its turns that were not judged in turn.
    pub fn before(&self, place: &Place) -> std::collections::HashSet<Place> {
        let Some(turns) = self.at.get(place) else {
            return std::collections::HashSet::new();
        };
        turns
            .iter()
            .filter_map(|(key, position)| {
                let queue = self.queues.get(key)?;
                queue.lines.get(queue.next..*position)
            })
            .flatten()
            .cloned()
            .collect()
    }

    /// Where `place` stands in the one order of the turns, for judging what still waits at
    /// the end of a sweep in that order.
    pub fn order_of(&self, place: &Place) -> Option<Rank> {
        self.rank.get(place).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_known_by_its_own_top_level_fields() {
        let request_of = |line: &[u8]| head_of(line).and_then(|head| head.request);
        let line = br#"{"id":"s2","kind" : "response","correlatesTo":"r1","state":"working","createdAt":"2026-12-01T10:00:00.007Z"}"#;
        let head = head_of(line).unwrap();
        assert_eq!(head.id.as_deref(), Some("s2"));
        assert_eq!(head.request.as_deref(), Some("r1"));
        assert_eq!(head.at, Some(1_796_119_200_007));
        assert!(request_of(br#"{"kind":"note","correlatesTo":"r1"}"#).is_none());
        assert!(request_of(br#"{"kind":"response"}"#).is_none());
        assert!(head_of(b"not json").is_none());
        // Escaped, it is the same field; nested, it is another's.
        let escaped = br#"{"id":"\u0073\u0032","kind":"respons\u0065","correlatesTo":"r\u0031"}"#;
        assert_eq!(request_of(escaped).as_deref(), Some("r1"));
        assert_eq!(head_of(escaped).unwrap().id.as_deref(), Some("s2"));
        let nested = br#"{"message":{"parts":[{"type":"data","data":{"kind":"response","id":"x","createdAt":"2026-12-01T09:00:00Z"}}]},"kind":"note","correlatesTo":"r1"}"#;
        assert!(request_of(nested).is_none());
        assert!(head_of(nested).unwrap().id.is_none());
        let nested_time = br#"{"message":{"parts":[{"type":"data","data":{"createdAt":"2026-12-01T09:00:00Z"}}]},"kind":"response","correlatesTo":"r1","createdAt":"2026-12-01T10:00:00Z"}"#;
        assert_eq!(head_of(nested_time).unwrap().at, Some(1_796_119_200_000));
    }

    /// Inboxes read on several threads give the turns one thread gives: the same queues, in
    /// the same order, whichever thread read which inbox.
    #[test]
    fn inboxes_scanned_apart_take_the_turns_they_take_together() {
        let dir = tempfile::tempdir().unwrap();
        let line = |id: String, from: &str, kind: &str, request: &str, at: u32| {
            let re = if request.is_empty() {
                String::new()
            } else {
                format!(r#","correlatesTo":"{request}","state":"working""#)
            };
            format!(
                r#"{{"id":"{id}","from":"{from}","to":"x","kind":"{kind}"{re},"createdAt":"2026-12-01T10:00:{:02}.{:03}Z"}}"#,
                at / 1000 % 60,
                at % 1000
            ) + "\n"
        };
        let names = ["ann", "bob", "cy", "dee", "eve"];
        let mut texts = vec![String::new(); names.len()];
        for i in 0..400u32 {
            let to = (i as usize * 7) % names.len();
            let request = format!("r{}", i % 23);
            // Responses to 23 requests from every inbox, a reused id now and then, notes.
            let (id, kind, re) = match i % 5 {
                0 => (request.clone(), "request", ""),
                1 | 2 => (format!("s{i}"), "response", request.as_str()),
                3 => (format!("dup{}", i % 11), "note", ""),
                _ => (format!("n{i}"), "note", ""),
            };
            texts[to].push_str(&line(
                id,
                names[(to + 1) % names.len()],
                kind,
                re,
                i * 37 % 60_000,
            ));
        }
        let judged = |_: u64| false;
        let inboxes: Vec<Pending<'_>> = names
            .iter()
            .zip(&texts)
            .map(|(name, text)| {
                let path = dir.path().join(format!("{name}-inbox.jsonl"));
                std::fs::write(&path, text).unwrap();
                Pending {
                    name,
                    file: File::open(&path).unwrap(),
                    gen: 0,
                    from: 0,
                    judged: &judged,
                }
            })
            .collect();
        let together = Turns::scan(&inboxes, 1 << 20, 1);
        assert!(together.queues.len() > 20, "{}", together.queues.len());
        for workers in [2, 3, 8] {
            assert_eq!(
                Turns::scan(&inboxes, 1 << 20, workers),
                together,
                "{workers} threads"
            );
        }
    }

    #[test]
    fn a_leading_id_is_taken_only_as_doorbell_writes_it() {
        assert_eq!(leading_id(br#"{"id":"x1","from":"ann"}"#), Some("x1"));
        assert_eq!(leading_id(br#"{"id":"\u0078","from":"ann"}"#), None);
        assert_eq!(leading_id(br#"{"from":"ann","id":"x1"}"#), None);
        assert_eq!(leading_id(br#"{ "id":"x1"}"#), None);
        assert_eq!(leading_id(br#"{"id":"x1"#), None);
    }
}
