//! The bridge's refusal notices: the `note` from `bridge` that tells a sender which of its
//! lines were refused, why, and how to fix each. Pure: the same refusals always give the same
//! reserved id and the same line, so a notice rewritten after a crash is byte for byte the
//! one that was intended.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::RefusalReason;

/// A refused line that its sender should hear about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedLine {
    /// The inbox the line is in.
    pub inbox: String,
    pub gen: u32,
    pub offset: u64,
    /// The line's id, when it had a readable one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Who the line says sent it: the notice goes to that station.
    pub from: String,
    pub reason: RefusalReason,
    pub detail: String,
}

impl RefusedLine {
    /// The key that names this line everywhere: inbox, generation and offset.
    #[must_use]
    pub fn key(&self) -> String {
        refusal_key(&self.inbox, self.gen, self.offset)
    }
}

/// The key of a line: `inbox/gen/offset`.
#[must_use]
pub fn refusal_key(inbox: &str, gen: u32, offset: u64) -> String {
    format!("{inbox}/{gen}/{offset}")
}

/// At most this many refusals are named in one notice, so a notice stays a short line.
pub const MAX_PER_NOTICE: usize = 20;

/// One notice to write: its reserved id, the inbox it goes to, and the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub id: String,
    pub to: String,
    pub line: String,
}

/// A note from one of the judge's built-in loops (`bridge`, `debt-loop`, `report-loop`).
#[derive(Debug, Clone)]
pub struct LoopNote<'a> {
    pub id: &'a str,
    pub from: &'a str,
    pub to: &'a str,
    pub correlates_to: Option<&'a str>,
    pub context_id: Option<&'a str>,
    pub priority: Option<u8>,
    pub text: &'a str,
    pub data: Option<serde_json::Value>,
}

/// The wire form, in the field order every sender uses.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NoteOut<'a> {
    id: &'a str,
    from: &'a str,
    to: &'a str,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlates_to: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context_id: Option<&'a str>,
    created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<u8>,
    message: MessageOut<'a>,
}

#[derive(Serialize)]
struct MessageOut<'a> {
    role: &'a str,
    parts: Vec<PartOut<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum PartOut<'a> {
    Text { text: &'a str },
    Data { data: &'a serde_json::Value },
}

impl LoopNote<'_> {
    /// The note's line, written at the judge's time `now`.
    #[must_use]
    pub fn line(&self, now: DateTime<Utc>) -> String {
        let mut parts = vec![PartOut::Text { text: self.text }];
        if let Some(data) = &self.data {
            parts.push(PartOut::Data { data });
        }
        serde_json::to_string(&NoteOut {
            id: self.id,
            from: self.from,
            to: self.to,
            kind: "note",
            correlates_to: self.correlates_to,
            context_id: self.context_id,
            created_at: now.to_rfc3339_opts(SecondsFormat::Millis, true),
            priority: self.priority,
            message: MessageOut {
                role: "agent",
                parts,
            },
        })
        .expect("a loop note always serialises")
    }
}

/// The notice for `refused` (all from one sender, at most [`MAX_PER_NOTICE`]), written at
/// the judge's time `now`.
#[must_use]
pub fn refusal_notice(refused: &[RefusedLine], now: DateTime<Utc>) -> Notice {
    let to = refused[0].from.clone();
    let keys: Vec<String> = refused.iter().map(RefusedLine::key).collect();
    let hash = xxhash_rust::xxh3::xxh3_128(keys.join("\n").as_bytes());
    let id = format!("bridge:refused:{hash:032x}");
    let mut text = format!(
        "doorbell refused {} line{} you sent; {} not delivered:",
        refused.len(),
        if refused.len() == 1 { "" } else { "s" },
        if refused.len() == 1 {
            "it was"
        } else {
            "they were"
        }
    );
    for line in refused {
        let what = match &line.id {
            Some(id) => format!("'{id}'"),
            None => format!("the line at byte {}", line.offset),
        };
        let _ = write!(
            text,
            "\n- {what} in {}-inbox.jsonl: {} ({}). Fix: {}.",
            line.inbox,
            line.reason,
            line.detail,
            line.reason.fix()
        );
    }
    let data = serde_json::json!({
        "refused": refused.iter().map(|l| serde_json::json!({
            "inbox": l.inbox, "generation": l.gen, "offset": l.offset, "id": l.id,
            "reason": l.reason.code(), "detail": l.detail,
        })).collect::<Vec<_>>(),
    });
    let line = LoopNote {
        id: &id,
        from: "bridge",
        to: &to,
        correlates_to: None,
        context_id: None,
        priority: None,
        text: &text,
        data: Some(data),
    }
    .line(now);
    Notice { id, to, line }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{judge_stateless, Limits};

    fn refused(offset: u64) -> RefusedLine {
        RefusedLine {
            inbox: "web".into(),
            gen: 0,
            offset,
            id: Some(format!("01X{offset}")),
            from: "design".into(),
            reason: RefusalReason::MissingField,
            detail: "'createdAt' is required".into(),
        }
    }

    #[test]
    fn a_notice_is_a_valid_note_with_a_reserved_id() {
        let notice = refusal_notice(&[refused(0), refused(120)], DateTime::UNIX_EPOCH);
        assert!(notice.id.starts_with("bridge:refused:"));
        assert!(crate::is_id(&notice.id));
        let envelope =
            judge_stateless(notice.line.as_bytes(), Some("design"), &Limits::default()).unwrap();
        assert_eq!(envelope.from, "bridge");
        let text = envelope.message.text();
        assert!(
            text.contains("'01X0' in web-inbox.jsonl: missing-field"),
            "{text}"
        );
        assert!(text.contains("'01X120'"), "{text}");
    }

    #[test]
    fn the_same_refusals_give_the_same_id_and_others_another() {
        let a = refusal_notice(&[refused(0)], DateTime::UNIX_EPOCH);
        let b = refusal_notice(&[refused(0)], DateTime::UNIX_EPOCH);
        let c = refusal_notice(&[refused(1)], DateTime::UNIX_EPOCH);
        assert_eq!(a, b);
        assert_ne!(a.id, c.id);
    }
}
