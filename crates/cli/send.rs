//! `doorbell send`: build an envelope, pre-check it against the rules this process can see,
//! and append it to the recipient's inbox. The judge's verdict is final; the pre-check only
//! refuses early what the judge would refuse anyway.

use std::io::Read;

use anyhow::Context;
use chrono::{DateTime, SecondsFormat, Utc};
use doorbell_core::duration::parse_duration;
use doorbell_core::{
    is_agent_name, is_id, is_reserved_id, judge_stateless, Limits, Verdict, BUILTIN_LOOPS,
};
use doorbell_store::append::append_line;
use doorbell_store::{Bridge, View};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::args::SendArgs;
use crate::exit::{refused, OK};
use crate::session::{view, Session};

/// The envelope as `send` writes it; the field order is the one every sender uses.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Outgoing<'a> {
    id: &'a str,
    from: &'a str,
    to: &'a str,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlates_to: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'a str>,
    created_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_by: Option<&'a str>,
    message: OutMessage<'a>,
}

#[derive(Serialize)]
struct OutMessage<'a> {
    role: &'a str,
    parts: &'a [OutPart<'a>],
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum OutPart<'a> {
    Text { text: &'a str },
    Data { data: &'a RawValue },
}

/// Text from stdin: taken as is, but trailing newlines are dropped; NUL and invalid UTF-8
/// are refused.
fn read_stdin() -> anyhow::Result<String> {
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
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t
            .with_timezone(&Utc)
            .to_rfc3339_opts(SecondsFormat::Secs, true));
    }
    let after = parse_duration(text)
        .map_err(|e| refused(format!("--reply-by: {e}; or give an RFC 3339 time")))?;
    let after = chrono::Duration::from_std(after)
        .map_err(|_| refused(format!("--reply-by '{text}' is too far away")))?;
    Ok((now + after).to_rfc3339_opts(SecondsFormat::Secs, true))
}

/// Check the sender, the kind and the id before anything is read or written.
fn sender_and_kind(args: &SendArgs) -> anyhow::Result<(String, String)> {
    let from = args
        .from
        .clone()
        .ok_or_else(|| refused("who is sending? give --from or set DOORBELL_AGENT"))?;
    if !is_agent_name(&from) {
        return Err(refused(format!(
            "--from '{from}' is not a valid agent name"
        )));
    }
    if BUILTIN_LOOPS.contains(&from.as_str()) {
        return Err(refused(format!(
            "--from '{from}' is a built-in loop of the bridge; send as yourself"
        )));
    }
    let kind = match (&args.kind, &args.correlates_to) {
        (Some(kind), _) => kind.clone(),
        (None, Some(_)) => "response".to_owned(),
        (None, None) => "note".to_owned(),
    };
    if kind == "response" && (args.correlates_to.is_none() || args.state.is_none()) {
        return Err(refused(
            "a response needs --correlates-to (the request) and --state (e.g. completed); or use 'doorbell reply'",
        ));
    }
    if let Some(id) = &args.id {
        if !is_id(id) {
            return Err(refused(format!(
                "--id '{id}' is not an id (1-128 of A-Z a-z 0-9 . _ -)"
            )));
        }
        if is_reserved_id(id) {
            return Err(refused(format!(
                "--id '{id}' contains ':', which is reserved for the bridge"
            )));
        }
    }
    Ok((from, kind))
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
            Some(RawValue::from_string(value.to_string()).expect("a Value is valid JSON"))
        }
    };
    Ok((text, data))
}

pub fn run(session: &Session, args: &SendArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    // The ledger is needed only for rules about other messages: ids and requests.
    if args.correlates_to.is_some() || args.id.is_some() {
        sender_and_kind(args)?;
        let view = view(&bridge)?;
        return send(&view, args);
    }
    send_to(&bridge, None, args)
}

/// Send with the pre-checks `view` can make.
pub fn send(view: &View, args: &SendArgs) -> anyhow::Result<i32> {
    send_to(view.bridge(), Some(view), args)
}

fn send_to(bridge: &Bridge, view: Option<&View>, args: &SendArgs) -> anyhow::Result<i32> {
    let (from, kind) = sender_and_kind(args)?;
    let recipients = recipients(bridge, &args.to, &from)?;
    let registry = bridge.registry()?;
    if !registry.knows(&from) {
        let known: Vec<_> = registry.stations.iter().cloned().collect();
        return Err(refused(format!(
            "unknown sender '{from}' (known: {}; add one with 'doorbell agent add')",
            known.join(", ")
        )));
    }
    let (text, data) = content(args)?;
    let now = Utc::now();
    let created_at = now.to_rfc3339_opts(SecondsFormat::Millis, true);
    let reply_by = args
        .reply_by
        .as_deref()
        .map(|t| parse_time(t, now))
        .transpose()?;
    let base_id = args
        .id
        .clone()
        .unwrap_or_else(|| ulid::Ulid::new().to_string());
    let broadcast = recipients.len() > 1;
    let limits = Limits {
        max_line_bytes: bridge.max_line_bytes(),
    };
    let mut parts = Vec::new();
    if let Some(text) = &text {
        parts.push(OutPart::Text { text });
    }
    if let Some(data) = &data {
        parts.push(OutPart::Data { data });
    }
    let state = match (&args.state, kind.as_str()) {
        (None, "request") => Some("submitted"),
        (state, _) => state.as_deref(),
    };
    let mut lines = Vec::new();
    for to in &recipients {
        let id = if broadcast {
            format!("{base_id}.{to}")
        } else {
            base_id.clone()
        };
        // A broadcast request shares one thread; a request is otherwise its own thread.
        let context_id = match (&args.context_id, kind.as_str(), broadcast) {
            (Some(context), _, _) => Some(context.as_str()),
            (None, "request", true) => Some(base_id.as_str()),
            (None, "request", false) => Some(id.as_str()),
            (None, _, _) => None,
        };
        let outgoing = Outgoing {
            id: &id,
            from: &from,
            to,
            kind: &kind,
            correlates_to: args.correlates_to.as_deref(),
            context_id,
            task_id: args.task_id.as_deref(),
            state,
            created_at: &created_at,
            priority: args.priority,
            reply_by: reply_by.as_deref(),
            message: OutMessage {
                role: "agent",
                parts: &parts,
            },
        };
        let line = serde_json::to_string(&outgoing).expect("an envelope always serialises");
        let envelope = judge_stateless(line.as_bytes(), Some(to), &limits)
            .map_err(|refusal| refused(format!("refused: {refusal}")))?;
        let verdict = view.map_or(Verdict::Accepted, |view| {
            view.precheck(&envelope, to, &registry)
        });
        match verdict {
            Verdict::Refused(refusal) => return Err(refused(format!("refused: {refusal}"))),
            Verdict::Duplicate => lines.push((to.clone(), id, None)),
            Verdict::Accepted => lines.push((to.clone(), id.clone(), Some(line))),
        }
    }
    // Every recipient passed the pre-check: now write. A duplicate was already delivered.
    for (to, id, line) in lines {
        if let Some(line) = line {
            append_line(&bridge.inbox_path(&to)?, line.as_bytes())?;
        }
        println!("{id}");
    }
    Ok(OK)
}

/// The inboxes a message goes to: each `--to`, or every station for `all`.
fn recipients(bridge: &Bridge, to: &[String], from: &str) -> anyhow::Result<Vec<String>> {
    if to.iter().any(|t| t == "all") {
        // Everyone but the sender: a broadcast request is not a debt one owes oneself.
        let all: Vec<String> = bridge
            .inboxes()?
            .into_iter()
            .filter(|n| n != from)
            .collect();
        if all.is_empty() {
            return Err(refused("no agents yet; add one with 'doorbell agent add'"));
        }
        return Ok(all);
    }
    let mut out: Vec<String> = Vec::new();
    for name in to {
        if !is_agent_name(name) {
            return Err(refused(format!("--to '{name}' is not a valid agent name")));
        }
        bridge.require_inbox(name)?;
        if !out.contains(name) {
            out.push(name.clone());
        }
    }
    Ok(out)
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
}
