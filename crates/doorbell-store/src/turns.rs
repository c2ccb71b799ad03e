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

use std::borrow::Cow;
use std::collections::HashMap;
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
    pub judged: &'a dyn Fn(u64) -> bool,
}

/// A response seen by the scan: the index of its inbox, its place, its sender's time.
type Seen = (usize, Place, Option<i64>);

#[derive(Debug, Default)]
struct Queue {
    lines: Vec<Place>,
    next: usize,
}

/// The turns of one sweep.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    queues: HashMap<String, Queue>,
    /// Each line in a turn: the request whose turn it is in, and its place in that queue.
    at: HashMap<Place, (String, usize)>,
}

/// The top-level fields of a line the turns need, as the judge reads them: a nested
/// `"kind"` (a data part's) is not the line's, and an escaped one (`"respons\u0065"`) is.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "correlatesTo")]
    correlates_to: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "createdAt")]
    created_at: Option<Cow<'a, str>>,
}

/// What the turns need of a response line: its request and its sender's time. A line that
/// names no `response` in its bytes, even escaped, is none, unparsed: notes and requests,
/// most lines of a backlog, cost one search.
fn response_of(line: &[u8]) -> Option<(String, Option<i64>)> {
    if memmem::find(line, b"response").is_none() && memmem::find(line, b"\\u").is_none() {
        return None;
    }
    let head: Head<'_> = serde_json::from_slice(line).ok()?;
    if head.kind.as_deref() != Some("response") {
        return None;
    }
    let request = head.correlates_to?.into_owned();
    let at = head
        .created_at
        .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
        .map(|t| t.timestamp_millis());
    Some((request, at))
}

impl Turns {
    /// Read what waits in each inbox and give the responses of each request answered from
    /// more than one of them their turns. A file that cannot be read gives no turns.
    pub fn scan(inboxes: &[Pending<'_>], max_line_bytes: usize) -> Turns {
        // Per request: each response's inbox (its index), place and time, in reading order.
        let mut found: HashMap<String, Vec<Seen>> = HashMap::new();
        let mut reader = LineReader::new(max_line_bytes);
        for (index, pending) in inboxes.iter().enumerate() {
            let _ = reader.read(&pending.file, pending.from, |line| -> std::io::Result<()> {
                if let Line::Complete { offset, bytes } = line {
                    if let Some((request, at)) = response_of(bytes) {
                        if !(pending.judged)(offset) {
                            let place = (pending.name.to_owned(), pending.gen, offset);
                            found.entry(request).or_default().push((index, place, at));
                        }
                    }
                }
                Ok(())
            });
        }
        let mut turns = Turns::default();
        for (request, lines) in found {
            if lines.iter().all(|(index, _, _)| *index == lines[0].0) {
                continue;
            }
            // Each inbox's times made never to go back, so that sorting by them keeps every
            // inbox's own order; a line without a time takes the one before it.
            let mut latest: HashMap<usize, i64> = HashMap::new();
            let mut keyed: Vec<(i64, Place)> = lines
                .into_iter()
                .map(|(index, place, at)| {
                    let last = latest.entry(index).or_insert(i64::MIN);
                    *last = (*last).max(at.unwrap_or(i64::MIN));
                    (*last, place)
                })
                .collect();
            keyed.sort_by_key(|(at, _)| *at);
            let lines: Vec<Place> = keyed.into_iter().map(|(_, place)| place).collect();
            for (position, place) in lines.iter().enumerate() {
                turns.at.insert(place.clone(), (request.clone(), position));
            }
            turns.queues.insert(request, Queue { lines, next: 0 });
        }
        turns
    }

    /// Whether the line at `place` may be judged now: it takes no turn, or its turn came.
    pub fn may_judge(&self, place: &Place) -> bool {
        let Some((request, _)) = self.at.get(place) else {
            return true;
        };
        let queue = &self.queues[request];
        queue.lines.get(queue.next) == Some(place)
    }

    /// A response the scan did not see (appended since, or one it could not read without
    /// parsing) to `request`, at `place`: it joins the end of the request's turns when a line
    /// of its own inbox still waits there, so that it never passes one written before it.
    /// Returns whether it must wait.
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
            .insert(place.clone(), (request.to_owned(), queue.lines.len()));
        queue.lines.push(place.clone());
        true
    }

    /// The line at `place` was judged: its request's turn moves on. Returns the place whose
    /// turn it is now.
    pub fn judged(&mut self, place: &Place) -> Option<Place> {
        let (request, _) = self.at.remove(place)?;
        let queue = self.queues.get_mut(&request)?;
        if queue.lines.get(queue.next) == Some(place) {
            queue.next += 1;
        }
        queue.lines.get(queue.next).cloned()
    }

    /// Where `place` stands among the waiting: its request and its turn, for judging what
    /// still waits at the end of a sweep in the order of the turns.
    pub fn order_of(&self, place: &Place) -> Option<(String, usize)> {
        self.at.get(place).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_known_by_its_own_top_level_fields() {
        let line = br#"{"id":"s2","kind" : "response","correlatesTo":"r1","state":"working","createdAt":"2026-12-01T10:00:00.007Z"}"#;
        let (request, at) = response_of(line).unwrap();
        assert_eq!(request, "r1");
        assert_eq!(at, Some(1_796_119_200_007));
        assert!(response_of(br#"{"kind":"note","correlatesTo":"r1"}"#).is_none());
        assert!(response_of(br#"{"kind":"response"}"#).is_none());
        // Escaped, it is the same field; nested, it is another's.
        let escaped = br#"{"kind":"respons\u0065","correlatesTo":"r\u0031"}"#;
        assert_eq!(response_of(escaped).unwrap().0, "r1");
        let nested = br#"{"message":{"parts":[{"type":"data","data":{"kind":"response","createdAt":"2026-12-01T09:00:00Z"}}]},"kind":"note","correlatesTo":"r1"}"#;
        assert!(response_of(nested).is_none());
        let nested_time = br#"{"message":{"parts":[{"type":"data","data":{"createdAt":"2026-12-01T09:00:00Z"}}]},"kind":"response","correlatesTo":"r1","createdAt":"2026-12-01T10:00:00Z"}"#;
        assert_eq!(response_of(nested_time).unwrap().1, Some(1_796_119_200_000));
    }
}
