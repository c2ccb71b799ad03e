//! A hand-written encoder for the journal's most common records: a verdict with nothing but
//! its place, and an accepted line with what the ledger needs. There is one such record per
//! message, so the generic serializer's cost showed in every catch-up. The bytes are exactly
//! what `serde_json` writes for the same record (a test holds the two together), so readers
//! see no difference; every other record goes through `serde_json`.

use doorbell_core::Accepted;

use crate::journal::{Record, Word};

/// Write `record` as JSON (no newline) and return true, or return false without writing
/// when it is not one of the plain shapes.
pub(crate) fn write_plain(out: &mut Vec<u8>, record: &Record) -> bool {
    // Every field, by name: a field added to `Record` does not compile here until this
    // encoder says what it does with it, so none is silently left out.
    let Record {
        version,
        inbox,
        gen,
        offset,
        span,
        verdict,
        seen_at,
        reason,
        detail,
        id,
        from,
        line,
        dev,
        ino,
        marker,
        tell,
        write,
        covers,
        ring,
        unread_from,
        reader_cursor,
        hash,
        lines,
    } = record;
    let plain = *version == crate::journal::RECORD_VERSION
        && reason.is_none()
        && detail.is_none()
        && id.is_none()
        && from.is_none()
        && dev.is_none()
        && ino.is_none()
        && marker.is_none()
        && !tell
        && write.is_none()
        && covers.is_empty()
        && ring.is_none()
        && unread_from.is_none()
        && reader_cursor.is_none()
        && hash.is_none()
        && *lines <= 1
        && matches!(verdict, Word::Accepted | Word::Duplicate | Word::Refused);
    if !plain {
        return false;
    }
    out.extend_from_slice(b"{\"in\":");
    string(out, inbox);
    if *gen != 0 {
        out.extend_from_slice(b",\"g\":");
        number(out, *gen);
    }
    out.extend_from_slice(b",\"o\":");
    number(out, *offset);
    if *span != 0 {
        out.extend_from_slice(b",\"n\":");
        number(out, *span);
    }
    out.extend_from_slice(match verdict {
        Word::Accepted => b",\"v\":\"a\",\"t\":",
        Word::Duplicate => b",\"v\":\"d\",\"t\":",
        _ => b",\"v\":\"r\",\"t\":",
    });
    number(out, *seen_at);
    if let Some(line) = line {
        out.extend_from_slice(b",\"a\":");
        accepted(out, line);
    }
    out.push(b'}');
    true
}

fn accepted(out: &mut Vec<u8>, line: &Accepted) {
    // Every field, by name, as in `write_plain`.
    let Accepted {
        id: _,
        from: _,
        to: _,
        kind: _,
        correlates_to: _,
        context_id: _,
        task_id: _,
        state: _,
        priority: _,
        reply_by: _,
        created_at: _,
        fingerprint: _,
        owner,
    } = line;
    out.extend_from_slice(b"{\"id\":");
    string(out, &line.id);
    out.extend_from_slice(b",\"f\":");
    string(out, &line.from);
    out.extend_from_slice(b",\"to\":");
    string(out, &line.to);
    out.extend_from_slice(b",\"k\":");
    string(out, line.kind.as_str());
    if let Some(request) = &line.correlates_to {
        out.extend_from_slice(b",\"re\":");
        string(out, request);
    }
    out.extend_from_slice(b",\"cx\":");
    string(out, &line.context_id);
    if let Some(task) = &line.task_id {
        out.extend_from_slice(b",\"tk\":");
        string(out, task);
    }
    if let Some(state) = line.state {
        out.extend_from_slice(b",\"s\":");
        string(out, state.as_str());
    }
    if line.priority != 1 {
        out.extend_from_slice(b",\"p\":");
        number(out, line.priority);
    }
    if let Some(reply_by) = line.reply_by {
        out.extend_from_slice(b",\"rb\":");
        number(out, reply_by.timestamp_millis());
    }
    out.extend_from_slice(b",\"ca\":");
    number(out, line.created_at.timestamp_millis());
    out.extend_from_slice(b",\"fp\":");
    number(out, line.fingerprint);
    if let Some(owner) = owner {
        out.extend_from_slice(b",\"ow\":");
        string(out, owner);
    }
    out.push(b'}');
}

fn number(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A JSON string. Names and ids need no escaping; anything else goes through `serde_json` so
/// the escapes are its own.
fn string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(out, s).expect("a string always serializes");
    }
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;
    use doorbell_core::{Accepted, Kind, State};
    use proptest::prelude::*;

    use super::write_plain;
    use crate::journal::{Record, Word};

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9-]{1,12}",
            any::<String>(),
            Just("quote\" back\\slash \u{1} tab\t é".to_owned()),
        ]
    }

    fn accepted() -> impl Strategy<Value = Accepted> {
        (
            (text(), text(), text(), 0..3u8, proptest::option::of(text())),
            (text(), proptest::option::of(text()), 0..7u8, 0..4u8),
            (
                proptest::option::of(any::<i32>()),
                any::<i32>(),
                any::<u64>(),
            ),
        )
            .prop_map(
                |((id, from, to, kind, re), (cx, tk, state, priority), (rb, ca, fp))| Accepted {
                    // Some lines carry an owner (a loop's request): the same text as the task.
                    owner: tk.clone().filter(|t| t.len() % 2 == 0),
                    id,
                    from,
                    to,
                    kind: [Kind::Request, Kind::Response, Kind::Note][usize::from(kind)],
                    correlates_to: re,
                    context_id: cx,
                    task_id: tk,
                    state: State::ALL.get(usize::from(state)).copied(),
                    priority,
                    reply_by: rb
                        .and_then(|ms| DateTime::from_timestamp_millis(i64::from(ms) * 1000)),
                    created_at: DateTime::from_timestamp_millis(i64::from(ca) * 1000)
                        .unwrap_or_default(),
                    fingerprint: fp,
                },
            )
    }

    proptest! {
        /// The hand-written bytes are serde_json's bytes, for every plain record.
        #[test]
        fn plain_records_are_written_as_serde_writes_them(
            inbox in text(),
            gen in prop_oneof![Just(0u32), any::<u32>()],
            offset in any::<u64>(),
            span in prop_oneof![Just(0u64), any::<u64>()],
            verdict in 0..3usize,
            seen_at in any::<i64>(),
            line in proptest::option::of(accepted()),
        ) {
            let verdict = [Word::Accepted, Word::Duplicate, Word::Refused][verdict];
            let mut record = Record::new(&inbox, gen, offset, verdict, seen_at);
            record.span = span;
            record.line = line;
            let mut fast = Vec::new();
            prop_assert!(write_plain(&mut fast, &record));
            let slow = serde_json::to_vec(&record).unwrap();
            prop_assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&slow));
        }
    }

    #[test]
    fn other_records_are_left_to_serde() {
        let mut record = Record::new("web", 0, 0, Word::Refused, 1);
        record.reason = Some("bad-json".into());
        assert!(!write_plain(&mut Vec::new(), &record));
        let mark = Record::new("web", 0, 0, Word::Mark, 1);
        assert!(!write_plain(&mut Vec::new(), &mark));
    }
}

#[cfg(test)]
mod version {
    use crate::journal::{Record, Word, RECORD_VERSION};

    #[test]
    fn a_record_says_its_version_only_when_it_is_not_the_first() {
        let record = Record::new("web", 0, 0, Word::Accepted, 0);
        assert_eq!(record.version, RECORD_VERSION);
        let text = serde_json::to_string(&record).unwrap();
        assert!(!text.contains("\"ver\""), "{text}");
        let read: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(read, record);
    }

    #[test]
    fn a_record_of_a_newer_version_is_an_error_not_half_read() {
        let newer = r#"{"ver":2,"in":"web","o":0,"v":"a","t":0}"#;
        let error = serde_json::from_str::<Record>(newer)
            .unwrap_err()
            .to_string();
        assert!(error.contains("written by a newer doorbell"), "{error}");
        let first = r#"{"ver":1,"in":"web","o":0,"v":"a","t":0}"#;
        assert_eq!(serde_json::from_str::<Record>(first).unwrap().version, 1);
    }
}
