//! `doorbell send`: the message the arguments describe (its text from the argument or stdin),
//! sent through the store's `send` (with a `View` when the ledger's rules apply).

use std::io::Read;

use anyhow::Context;
use chrono::{DateTime, Datelike, SecondsFormat, Utc};
use doorbell_core::duration::parse_duration;
use doorbell_store::send::{self, Message};
use serde_json::value::RawValue;

use crate::args::SendArgs;
use crate::exit::{refused, OK};
use crate::session::{view, Session};

/// Text from stdin: taken as is, but trailing newlines are dropped; NUL and invalid UTF-8
/// are refused.
pub(crate) fn read_stdin() -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .context("reading the text from stdin")?;
    text_from_bytes(bytes)
}

fn text_from_bytes(mut bytes: Vec<u8>) -> anyhow::Result<String> {
    while bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return Err(refused(format!(
            "the text holds a NUL byte at {at}; send text, not binary"
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        refused(format!(
            "the text is not UTF-8 (invalid byte at {}); send text, or a file part",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// RFC 3339, or a duration from now such as `2h`.
pub fn parse_time(text: &str, now: DateTime<Utc>) -> anyhow::Result<String> {
    let at = if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        t.with_timezone(&Utc)
    } else {
        let after =
            parse_duration(text).map_err(|e| crate::report::bad_time("--reply-by", text, &e))?;
        let after = chrono::Duration::from_std(after)
            .map_err(|_| refused(format!("--reply-by '{text}' is too far away")))?;
        now.checked_add_signed(after)
            .ok_or_else(|| refused(format!("--reply-by '{text}' is too far away")))?
    };
    // RFC 3339 in UTC has four-digit years; the judge refuses a time past them.
    if !(0..=9999).contains(&at.year()) {
        return Err(refused(format!(
            "--reply-by '{text}' is outside the years 0000 to 9999 in UTC"
        )));
    }
    Ok(at.to_rfc3339_opts(SecondsFormat::Secs, true))
}

/// Valid JSON without the whitespace between its tokens (a line break there would end the
/// line), its tokens untouched.
fn compact(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

/// The message's text (from the argument or stdin) and its data part.
fn content(args: &SendArgs) -> anyhow::Result<(Option<String>, Option<Box<RawValue>>)> {
    let text = match (&args.text, &args.data) {
        (Some(text), _) if text == "-" => Some(read_stdin()?),
        (Some(text), _) => Some(text.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(read_stdin()?),
    };
    let data = match &args.data {
        None => None,
        Some(json) => {
            let value: serde_json::Value = serde_json::from_str(json)
                .map_err(|e| refused(format!("--data is not JSON: {e}")))?;
            if !value.is_object() {
                return Err(refused("--data must be a JSON object"));
            }
            // Sent as given, on one line: a number's digits, a key's order, are the sender's.
            Some(RawValue::from_string(compact(json))?)
        }
    };
    Ok((text, data))
}

pub fn run(session: &Session, args: &SendArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    // Whatever can be refused without the text is, before the text is read (from stdin).
    send::check(
        &bridge,
        &Message {
            text: Some(String::new()),
            ..message_without_content(args)
        },
    )?;
    let message = message(args)?;
    // The ledger is needed only for rules about other messages: ids and requests.
    let ids = if send::needs_ledger(&message) {
        view(&bridge)?.send(&message)?
    } else {
        send::send(&bridge, None, &message)?
    };
    print_ids(&ids)?;
    Ok(OK)
}

/// The message `args` describe, its text and data read and checked.
pub fn message(args: &SendArgs) -> anyhow::Result<Message> {
    let (text, data) = content(args)?;
    let reply_by = args
        .reply_by
        .as_deref()
        .map(|t| parse_time(t, Utc::now()))
        .transpose()?;
    let lock_wait = args
        .lock
        .timeout
        .as_deref()
        .map(|t| {
            doorbell_core::duration::parse_duration(t)
                .map_err(|e| crate::exit::refused(format!("--timeout: {e}")))
        })
        .transpose()?;
    Ok(Message {
        reply_by,
        reply_by_relative: args
            .reply_by
            .as_deref()
            .is_some_and(|t| DateTime::parse_from_rfc3339(t).is_err()),
        text,
        data,
        lock_wait,
        ..message_without_content(args)
    })
}

/// The message `args` describe, but for its text, data and `--reply-by`.
fn message_without_content(args: &SendArgs) -> Message {
    Message {
        to: args.to.clone(),
        from: args.from.clone(),
        kind: args.kind.clone(),
        state: args.state.clone(),
        correlates_to: args.correlates_to.clone(),
        context_id: args.context_id.clone(),
        task_id: args.task_id.clone(),
        priority: args.priority,
        id: args.id.clone(),
        ..Message::default()
    }
}

pub fn print_ids(ids: &[String]) -> std::io::Result<()> {
    for id in ids {
        out!("{id}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_text_drops_trailing_newlines_only() {
        assert_eq!(text_from_bytes(b"a\n\n".to_vec()).unwrap(), "a");
        assert_eq!(text_from_bytes(b"\na \r\n".to_vec()).unwrap(), "\na \r");
        assert_eq!(text_from_bytes(Vec::new()).unwrap(), "");
        assert!(text_from_bytes(b"a\0b".to_vec()).is_err());
        assert!(text_from_bytes(vec![b'a', 0xff]).is_err());
    }

    /// A deadline past the four-digit years in UTC, given as a time with an offset or as a
    /// duration, is refused with a reason rather than written as `+10000-…`.
    #[test]
    fn a_deadline_past_the_four_digit_years_is_refused_plainly() {
        let now = DateTime::parse_from_rfc3339("9999-12-31T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        for text in [
            "9999-12-31T23:59:59-01:00",
            "0000-01-01T00:00:00+01:00",
            "2d",
        ] {
            let error = parse_time(text, now).unwrap_err().to_string();
            assert!(
                error.contains("outside the years 0000 to 9999"),
                "{text}: {error}"
            );
        }
        assert_eq!(
            parse_time("9999-12-31T23:59:59+01:00", now).unwrap(),
            "9999-12-31T22:59:59Z"
        );
        assert_eq!(parse_time("1h", now).unwrap(), "9999-12-31T01:00:00Z");
    }

    /// A time that is no RFC 3339 time is refused for what is wrong with it as a time, not
    /// as a duration missing its unit.
    #[test]
    fn a_bad_time_is_refused_as_a_time() {
        let now = Utc::now();
        for (text, said) in [
            (
                "2026-13-01T00:00:00Z",
                "is not an RFC 3339 time (input is out of range)",
            ),
            (
                "2026-12-01",
                "is not an RFC 3339 time (premature end of input)",
            ),
            ("99999", "needs a unit"),
            ("3x", "unknown unit 'x'"),
        ] {
            let error = parse_time(text, now).unwrap_err().to_string();
            assert!(error.contains(said), "{text}: {error}");
        }
    }
}
