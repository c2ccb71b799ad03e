//! The judgement of one line: the stateless rules (bytes, JSON, fields, the inbox's owner)
//! and then the registry and ledger rules, each refusal naming the first reason that applies
//! in the contract's precedence order.
//!
//! The judge never looks at what a message asks for: a message is a doorbell, never an
//! instruction.

use std::borrow::Cow;
use std::collections::BTreeSet;

use chrono::{DateTime, Datelike, Utc};
use serde::Deserialize;
use xxhash_rust::xxh3::Xxh3;

use crate::envelope::{EnvelopeDe, FileDe, Found, Int, Message, Obj, Part, PartDe};
use crate::name::{is_agent_name, is_builtin_loop, is_id};
use crate::verdict::{Refusal, RefusalReason as R};
use crate::{Envelope, Kind, State};

/// JSON nested deeper than this is refused as `bad-json`.
pub const MAX_DEPTH: usize = 128;

/// Size limits the judge enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest line accepted, not counting its newline.
    pub max_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_line_bytes: 1024 * 1024,
        }
    }
}

/// Who may send: stations (inboxes and `[[agent]]` entries) and loops (`[[loop]]` entries,
/// notes only). The built-in loops are always known and never listed here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registry {
    pub stations: BTreeSet<String>,
    pub loops: BTreeSet<String>,
    /// A loop's owner: the station that answers for the loop's requests (DESIGN §3).
    pub owners: std::collections::BTreeMap<String, String>,
    /// A loop whose `[[loop]]` entry names an owner that is no station: its requests are
    /// refused, saying so, until the owner is one.
    pub unowned: std::collections::BTreeMap<String, String>,
}

impl Registry {
    #[must_use]
    pub fn is_station(&self, name: &str) -> bool {
        self.stations.contains(name)
    }

    #[must_use]
    pub fn knows(&self, name: &str) -> bool {
        self.stations.contains(name) || self.loops.contains(name) || is_builtin_loop(name)
    }
}

pub(crate) fn parse_json(text: &str) -> Result<EnvelopeDe<'_>, Refusal> {
    let bad = |detail: String| Refusal::new(R::BadJson, detail);
    let start = text.trim_start_matches([' ', '\t', '\n', '\r']);
    match start.as_bytes().first() {
        None => return Err(bad("blank line".into())),
        Some(b'{') => {}
        Some(0xEF) if start.starts_with('\u{feff}') => {
            return Err(bad("starts with a byte-order mark".into()))
        }
        Some(_) => return Err(bad("not a JSON object".into())),
    }
    if too_deep(text.as_bytes()) {
        return Err(bad(format!("nested deeper than {MAX_DEPTH}")));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let raw = EnvelopeDe::deserialize(&mut de).map_err(|e| bad(e.to_string()))?;
    de.end().map_err(|e| bad(e.to_string()))?;
    Ok(raw)
}

/// Whether JSON text nests arrays and objects deeper than [`MAX_DEPTH`]. `serde_json` limits
/// the depth of what it builds, but not of values it skips (unknown fields, `data`), so the
/// judge checks the whole line.
fn too_deep(bytes: &[u8]) -> bool {
    nests_deeper_than(bytes, MAX_DEPTH)
}

/// Whether JSON text nests arrays and objects deeper than `max`. Brackets inside strings do
/// not count; the text need not be valid JSON. Text with few brackets is cleared by a quick
/// count (`memchr`'s vector search: counted a byte at a time, an envelope's half-dozen
/// brackets cost half as much as parsing it).
#[must_use]
pub fn nests_deeper_than(bytes: &[u8], max: usize) -> bool {
    if memchr::memchr2_iter(b'[', b'{', bytes).nth(max).is_none() {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// The first `missing-field` or `bad-field` fault, in that order, or the envelope.
pub(crate) fn check_fields(raw: EnvelopeDe<'_>) -> Result<Envelope<'_>, Refusal> {
    if matches!(&raw.kind, Some(Found::Value(k)) if k == "response") && raw.correlates_to.is_none()
    {
        return Err(Refusal::new(
            R::ResponseWithoutCorrelation,
            "a response must name its request in 'correlatesTo'",
        ));
    }
    if let Some(field) = first_missing(&raw) {
        return Err(Refusal::new(
            R::MissingField,
            format!("'{field}' is required"),
        ));
    }
    build(raw).map_err(|(field, why)| Refusal::new(R::BadField, format!("'{field}' {why}")))
}

fn first_missing(raw: &EnvelopeDe<'_>) -> Option<&'static str> {
    let required: [(&'static str, bool); 6] = [
        ("id", raw.id.is_some()),
        ("from", raw.from.is_some()),
        ("to", raw.to.is_some()),
        ("kind", raw.kind.is_some()),
        ("createdAt", raw.created_at.is_some()),
        ("message", raw.message.is_some()),
    ];
    if let Some((field, _)) = required.iter().find(|(_, present)| !present) {
        return Some(field);
    }
    if matches!(&raw.kind, Some(Found::Value(k)) if k == "response") && raw.state.is_none() {
        return Some("state");
    }
    let Some(Found::Value(Obj(message))) = &raw.message else {
        return None;
    };
    let Some(parts) = &message.parts else {
        return Some("message.parts");
    };
    let Found::Value(parts) = parts else {
        return None;
    };
    parts.0.iter().find_map(|part| match part {
        Found::Value(Obj(part)) => part_missing(part),
        Found::Wrong(_) => None,
    })
}

fn part_missing(part: &PartDe<'_>) -> Option<&'static str> {
    let Some(kind) = &part.kind else {
        return Some("message.parts[].type");
    };
    match kind {
        Found::Value(k) if k == "text" && part.text.is_none() => Some("message.parts[].text"),
        Found::Value(k) if k == "data" && part.data.is_none() => Some("message.parts[].data"),
        Found::Value(k) if k == "file" => match &part.file {
            None => Some("message.parts[].file"),
            Some(Found::Value(Obj(file))) if file.uri.is_none() && file.bytes.is_none() => {
                Some("message.parts[].file.uri")
            }
            Some(_) => None,
        },
        _ => None,
    }
}

type FieldError = (&'static str, String);

fn string<'a>(
    field: &'static str,
    found: Option<Found<Cow<'a, str>>>,
) -> Result<Option<Cow<'a, str>>, FieldError> {
    match found {
        None => Ok(None),
        Some(Found::Value(v)) => Ok(Some(v)),
        Some(Found::Wrong(what)) => Err((field, format!("must be a string, not {what}"))),
    }
}

fn required<'a>(
    field: &'static str,
    found: Option<Found<Cow<'a, str>>>,
) -> Result<Cow<'a, str>, FieldError> {
    string(field, found).map(|v| v.expect("required fields were checked for presence first"))
}

fn id_field<'a>(field: &'static str, value: Cow<'a, str>) -> Result<Cow<'a, str>, FieldError> {
    if is_id(&value) {
        Ok(value)
    } else {
        Err((
            field,
            format!(
                "'{}' is not an id (1-128 of A-Z a-z 0-9 . _ : -)",
                clip(&value)
            ),
        ))
    }
}

fn name_field<'a>(field: &'static str, value: Cow<'a, str>) -> Result<Cow<'a, str>, FieldError> {
    if is_agent_name(&value) {
        Ok(value)
    } else {
        Err((
            field,
            format!(
                "'{}' is not an agent name ([a-z0-9][a-z0-9._-]{{0,63}})",
                clip(&value)
            ),
        ))
    }
}

fn time_field(field: &'static str, value: &str) -> Result<DateTime<Utc>, FieldError> {
    let at = DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| (field, format!("'{}' is not an RFC 3339 time", clip(value))))?;
    // Every time the bridge writes back (`--json`, A2A, reports) is RFC 3339 in UTC, which
    // has four-digit years: a time whose offset carries it past them has no such form.
    if !(0..=9999).contains(&at.year()) {
        return Err((
            field,
            format!("'{}' is outside the years 0000 to 9999 in UTC", clip(value)),
        ));
    }
    Ok(at)
}

/// At most 40 characters of a value, for error messages.
fn clip(value: &str) -> Cow<'_, str> {
    match value.char_indices().nth(40) {
        Some((at, _)) => Cow::Owned(format!("{}…", &value[..at])),
        None => Cow::Borrowed(value),
    }
}

fn build(raw: EnvelopeDe<'_>) -> Result<Envelope<'_>, FieldError> {
    let id = id_field("id", required("id", raw.id)?)?;
    let from = name_field("from", required("from", raw.from)?)?;
    let to = name_field("to", required("to", raw.to)?)?;
    let kind_text = required("kind", raw.kind)?;
    let kind = Kind::parse(&kind_text).ok_or_else(|| {
        (
            "kind",
            format!("'{}' is not request, response or note", clip(&kind_text)),
        )
    })?;
    let correlates_to = string("correlatesTo", raw.correlates_to)?
        .map(|v| id_field("correlatesTo", v))
        .transpose()?;
    if kind == Kind::Request && correlates_to.is_some() {
        return Err(("correlatesTo", "is not allowed on a request".into()));
    }
    let context_id = string("contextId", raw.context_id)?
        .map(|v| id_field("contextId", v))
        .transpose()?;
    let task_id = string("taskId", raw.task_id)?;
    if let Some(task) = &task_id {
        if task.is_empty() || task.len() > 256 {
            return Err(("taskId", "must be 1-256 characters".into()));
        }
    }
    let state = state_field(kind, string("state", raw.state)?)?;
    let created_at = time_field("createdAt", &required("createdAt", raw.created_at)?)?;
    let priority = match raw.priority {
        None => 1,
        Some(Found::Value(Int(Some(p)))) if p <= 3 => p as u8,
        Some(Found::Value(_)) => return Err(("priority", "must be 0, 1, 2 or 3".into())),
        Some(Found::Wrong(what)) => {
            return Err(("priority", format!("must be an integer 0-3, not {what}")))
        }
    };
    let reply_by = string("replyBy", raw.reply_by)?
        .map(|v| time_field("replyBy", &v))
        .transpose()?;
    let message = match raw
        .message
        .expect("required fields were checked for presence first")
    {
        Found::Value(Obj(message)) => message,
        Found::Wrong(what) => return Err(("message", format!("must be an object, not {what}"))),
    };
    let role = string("message.role", message.role)?.unwrap_or(Cow::Borrowed("agent"));
    if role != "agent" && role != "user" {
        return Err((
            "message.role",
            format!("'{}' is not agent or user", clip(&role)),
        ));
    }
    let parts = match message
        .parts
        .expect("required fields were checked for presence first")
    {
        Found::Value(parts) if !parts.0.is_empty() => parts.0,
        Found::Value(_) => return Err(("message.parts", "must hold at least one part".into())),
        Found::Wrong(what) => {
            return Err(("message.parts", format!("must be an array, not {what}")))
        }
    };
    let parts = parts
        .into_iter()
        .map(build_part)
        .collect::<Result<Vec<_>, _>>()?;
    let mut envelope = Envelope {
        id,
        from,
        to,
        kind,
        correlates_to,
        context_id,
        task_id,
        state,
        created_at,
        priority,
        reply_by,
        message: Message { role, parts },
        fingerprint: 0,
    };
    envelope.fingerprint = fingerprint(&envelope);
    Ok(envelope)
}

/// The state a line sets, by kind: a request is submitted, a response names its new state, a
/// note has none.
fn state_field(kind: Kind, state: Option<Cow<'_, str>>) -> Result<Option<State>, FieldError> {
    Ok(match (kind, state) {
        (Kind::Note, Some(_)) => return Err(("state", "is not allowed on a note".into())),
        (Kind::Note, None) => None,
        (Kind::Request, None) => Some(State::Submitted),
        (Kind::Request, Some(s)) if s == "submitted" => Some(State::Submitted),
        (Kind::Request, Some(s)) => {
            return Err((
                "state",
                format!("'{}' on a request (a request is submitted)", clip(&s)),
            ))
        }
        (Kind::Response, Some(s)) => match State::parse(&s) {
            Some(state) if state != State::Submitted => Some(state),
            _ => {
                return Err((
                    "state",
                    format!(
                    "'{}' is not working, input-required, completed, failed, canceled or rejected",
                    clip(&s)
                ),
                ))
            }
        },
        (Kind::Response, None) => unreachable!("a response without state is a missing field"),
    })
}

fn build_part(part: Found<Obj<PartDe<'_>>>) -> Result<Part<'_>, FieldError> {
    let part = match part {
        Found::Value(Obj(part)) => part,
        Found::Wrong(what) => {
            return Err(("message.parts[]", format!("must be an object, not {what}")))
        }
    };
    let kind = required("message.parts[].type", part.kind)?;
    match &*kind {
        "text" => Ok(Part::Text(required("message.parts[].text", part.text)?)),
        "data" => {
            let data = part
                .data
                .expect("required fields were checked for presence first");
            if data.get().starts_with('{') {
                Ok(Part::Data(data))
            } else {
                Err(("message.parts[].data", "must be an object".into()))
            }
        }
        "file" => {
            let file: FileDe<'_> = match part
                .file
                .expect("required fields were checked for presence first")
            {
                Found::Value(Obj(file)) => file,
                Found::Wrong(what) => {
                    return Err((
                        "message.parts[].file",
                        format!("must be an object, not {what}"),
                    ))
                }
            };
            let name = string("message.parts[].file.name", file.name)?;
            let mime_type = string("message.parts[].file.mimeType", file.mime_type)?;
            let uri = string("message.parts[].file.uri", file.uri)?;
            let bytes = string("message.parts[].file.bytes", file.bytes)?;
            // What is not base64 would pass here and fail every A2A client that reads it.
            if bytes.as_deref().is_some_and(|b| !is_base64(b)) {
                return Err((
                    "message.parts[].file.bytes",
                    "must be base64 (the standard or URL-safe alphabet, padded or not)".into(),
                ));
            }
            if uri.is_some() && bytes.is_some() {
                return Err((
                    "message.parts[].file",
                    "has both uri and bytes; give one".into(),
                ));
            }
            Ok(Part::File {
                name,
                mime_type,
                uri,
                bytes,
            })
        }
        other => Err((
            "message.parts[].type",
            format!("'{}' is not text, data or file", clip(other)),
        )),
    }
}

/// A hash of the envelope apart from `createdAt`, with defaults filled in, so that a retry of
/// the same message (same `--id`) is recognised as a duplicate.
fn fingerprint(envelope: &Envelope<'_>) -> u64 {
    let mut h = Xxh3::new();
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(envelope.id.as_bytes());
    field(envelope.from.as_bytes());
    field(envelope.to.as_bytes());
    field(envelope.kind.as_str().as_bytes());
    field(envelope.correlates_to.as_deref().unwrap_or("").as_bytes());
    // A response's thread is its request's (another is refused), so whether it was written
    // out does not make a retry a different message.
    let context = match envelope.kind {
        Kind::Request => Some(envelope.thread()),
        Kind::Response => None,
        Kind::Note => envelope.context_id.as_deref(),
    };
    field(context.unwrap_or("").as_bytes());
    field(envelope.task_id.as_deref().unwrap_or("").as_bytes());
    field(envelope.state.map_or("", State::as_str).as_bytes());
    field(&[envelope.priority]);
    field(
        &envelope
            .reply_by
            .map_or(i64::MIN, |t| t.timestamp_millis())
            .to_le_bytes(),
    );
    field(envelope.message.role.as_bytes());
    for part in &envelope.message.parts {
        match part {
            Part::Text(text) => {
                field(b"text");
                field(text.as_bytes());
            }
            Part::Data(raw) => {
                field(b"data");
                field(raw.get().as_bytes());
            }
            Part::File {
                name,
                mime_type,
                uri,
                bytes,
            } => {
                field(b"file");
                for value in [name, mime_type, uri, bytes] {
                    field(value.as_deref().unwrap_or("\0").as_bytes());
                }
            }
        }
    }
    h.digest()
}

/// Whether a line from a config loop may be accepted: loops send notes only.
/// Why loop `from` may not send a line of `kind`, if it may not: a loop sends notes, and
/// requests when its `[[loop]]` entry names an owner; never responses.
#[must_use]
pub fn loop_refusal(registry: &Registry, from: &str, kind: Kind) -> Option<String> {
    if !registry.loops.contains(from) {
        return None;
    }
    match kind {
        Kind::Note => None,
        Kind::Request if registry.owners.contains_key(from) => None,
        Kind::Request if registry.unowned.contains_key(from) => {
            let owner = &registry.unowned[from];
            Some(format!(
                "'{from}' is a loop whose owner '{owner}' is no station: its requests have nobody to answer them (doorbell agent add {owner})"
            ))
        }
        Kind::Request => Some(format!(
            "'{from}' is a loop without an owner: a loop may ask only when its [[loop]] entry names the station that answers for it (owner = \"STATION\")"
        )),
        Kind::Response => Some(format!(
            "'{from}' is a loop, and loops never send responses (its owner answers for it)"
        )),
    }
}

/// Whether `text` is base64 as every A2A client reads a `bytes` field (`ProtoJSON`): the
/// standard or the URL-safe alphabet (not both), padded to a multiple of four with at most
/// two `=` or not padded at all, and never one character more than a multiple of four.
#[must_use]
pub fn is_base64(text: &str) -> bool {
    let data = text.trim_end_matches('=');
    let padding = text.len() - data.len();
    let bytes = data.as_bytes();
    let standard = bytes.iter().any(|b| matches!(b, b'+' | b'/'));
    let url_safe = bytes.iter().any(|b| matches!(b, b'-' | b'_'));
    bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_'))
        && !(standard && url_safe)
        && data.len() % 4 != 1
        && (padding == 0 || (padding <= 2 && text.len().is_multiple_of(4)))
}

#[cfg(test)]
mod depth_tests {
    use super::nests_deeper_than;

    /// `depth` arrays one in another, with `extra` brackets inside a string beside them.
    fn nested(depth: usize, extra: usize) -> Vec<u8> {
        let quoted = "[{".repeat(extra);
        [&"[".repeat(depth), "\"", &quoted, "\"", &"]".repeat(depth)]
            .concat()
            .into_bytes()
    }

    #[test]
    fn the_depth_counts_brackets_open_at_once_and_never_those_in_strings() {
        assert!(!nests_deeper_than(&nested(4, 0), 4));
        assert!(nests_deeper_than(&nested(5, 0), 4));
        // More brackets than the limit, but in a string or side by side: not deep.
        assert!(!nests_deeper_than(&nested(4, 50), 4));
        assert!(!nests_deeper_than("[],".repeat(50).as_bytes(), 4));
        assert!(!nests_deeper_than(br#"{"a":"\"[[[[[[[[[[["}"#, 4));
        assert!(nests_deeper_than(&nested(129, 0), 128));
        assert!(!nests_deeper_than(&nested(128, 300), 128));
    }
}

#[cfg(test)]
mod fingerprint_tests {
    use crate::rules::judge_stateless;
    use crate::Limits;

    fn fingerprint(line: &str) -> u64 {
        judge_stateless(line.as_bytes(), None, &Limits::default())
            .unwrap_or_else(|refusal| panic!("{line}: {refusal:?}"))
            .fingerprint
    }

    /// Fingerprints are on disk (the journal's records, the index, the last line a restore
    /// is known by): they never change for the same message, whatever computes them.
    #[test]
    fn a_message_keeps_its_fingerprint() {
        let long = "y".repeat(5000);
        let cases = [
            r#"{"id":"r1","from":"ops","to":"web","kind":"request","createdAt":"2026-12-01T00:00:00Z","replyBy":"2026-12-02T00:00:00Z","priority":2,"taskId":"t-1","message":{"role":"agent","parts":[{"type":"text","text":"hi"}]}}"#.to_owned(),
            r#"{"id":"a1","from":"web","to":"ops","kind":"response","correlatesTo":"r1","contextId":"r1","state":"completed","createdAt":"2026-12-01T00:00:01Z","message":{"role":"agent","parts":[{"type":"data","data":{"n":[1,2]}},{"type":"file","file":{"name":"a.txt","mimeType":"text/plain","uri":"file:///a.txt"}}]}}"#.to_owned(),
            r#"{"id":"n1","from":"ops","to":"web","kind":"note","contextId":"c9","createdAt":"2026-12-01T00:00:02Z","message":{"role":"user","parts":[{"type":"text","text":"a \"quoted\" \u00e9 line"}]}}"#.to_owned(),
            format!(r#"{{"id":"n2","from":"ops","to":"web","kind":"note","createdAt":"2026-12-01T00:00:03Z","message":{{"role":"agent","parts":[{{"type":"text","text":"{long}"}}]}}}}"#),
        ];
        let got: Vec<u64> = cases.iter().map(|line| fingerprint(line)).collect();
        // As the judge has made them since fingerprints were kept (checked 2026-12-07).
        assert_eq!(
            got,
            [
                15_061_175_651_850_893_270,
                16_823_717_876_264_443_750,
                13_001_147_014_994_796_474,
                15_897_768_046_583_229_310
            ]
        );
    }
}
