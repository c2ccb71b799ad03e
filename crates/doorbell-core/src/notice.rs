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

/// A note from a built-in loop, in the field order every sender uses.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NoteOut<'a> {
    id: &'a str,
    from: &'a str,
    to: &'a str,
    kind: &'a str,
    created_at: String,
    message: MessageOut<'a>,
}

#[derive(Serialize)]
struct MessageOut<'a> {
    role: &'a str,
    parts: (PartOut<'a>, PartOut<'a>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum PartOut<'a> {
    Text { text: &'a str },
    Data { data: serde_json::Value },
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
    let envelope = NoteOut {
        id: &id,
        from: "bridge",
        to: &to,
        kind: "note",
        created_at: now.to_rfc3339_opts(SecondsFormat::Millis, true),
        message: MessageOut {
            role: "agent",
            parts: (PartOut::Text { text: &text }, PartOut::Data { data }),
        },
    };
    let line = serde_json::to_string(&envelope).expect("a notice always serialises");
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
