//! `doorbell show`, `doorbell debts` and `doorbell thread`: what the ledger and the journal
//! know about one message, about who owes whom, and about one conversation.

use chrono::{DateTime, SecondsFormat, Utc};
use doorbell_core::report::plural;
use doorbell_core::trace::Step;
use doorbell_store::journal::Word;
use doorbell_store::view::envelope_of;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::args::{DebtsArgs, ShowArgs, ThreadArgs};
use crate::exit::{refused, OK};
use crate::output;
use crate::session::{view, Session};

fn time(millis: i64) -> Option<String> {
    DateTime::from_timestamp_millis(millis).map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Shown<'a> {
    id: &'a str,
    inbox: &'a str,
    offset: u64,
    verdict: &'a str,
    reason: Option<&'a str>,
    detail: Option<&'a str>,
    delivered_at: Option<String>,
    read: bool,
    /// How it was read (`read`, `watch`, `hook claude UserPromptSubmit`, `mcp`), from the
    /// agent's read log.
    read_via: Option<String>,
    read_at: Option<String>,
    /// The addressee's first response (a `working` too).
    first_response_at: Option<String>,
    /// When the addressee closed it with its answer (completed, failed, rejected); none
    /// while it is owed.
    answered_at: Option<String>,
    state: Option<&'a str>,
    thread: Option<&'a str>,
    envelope: Option<&'a RawValue>,
    /// Why the line is not there to show, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    missing: Option<&'a str>,
    /// Who owes whom an answer, while the request is open (as the text says).
    #[serde(skip_serializing_if = "Option::is_none")]
    owed: Option<Owed>,
}

/// An open request's debt.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Owed {
    debtor: String,
    creditor: String,
    since: String,
    /// Rings since `since` (the debt's state); `rings_in_all`: the request's whole life.
    rings: u32,
    rings_in_all: u32,
}

/// The rings of a debt since it was last silent (its state's), and of the request's whole
/// life when there were more (rung in an earlier state, perhaps the other side).
fn rings_said(request: &doorbell_core::Request) -> String {
    let now = plural(request.rings, "ring", "rings");
    if request.rings_total > request.rings {
        format!("{now} since; {} in all", request.rings_total)
    } else {
        now
    }
}

impl Owed {
    fn of(request: &doorbell_core::Request) -> Option<Owed> {
        request.is_open().then(|| Owed {
            debtor: request.debtor_station().to_owned(),
            creditor: request.creditor().to_owned(),
            since: rfc(request.state_since),
            rings: request.rings,
            rings_in_all: request.rings_total,
        })
    }
}

/// Where the line is: its inbox's file, or an earlier one (replaced since), and its byte.
fn where_it_is(view: &doorbell_store::View, found: &doorbell_store::view::Found) -> String {
    let earlier = view
        .inboxes()
        .get(&found.inbox)
        .is_some_and(|journal| journal.gen > found.gen);
    let (file, since) = if earlier {
        ("an earlier file of ", " (replaced since),")
    } else {
        ("", "")
    };
    let place = format!(
        "in {file}{}-inbox.jsonl{since} at byte {}",
        found.inbox, found.offset
    );
    match found.line {
        Some(_) => place,
        None => format!("was {place}; {GONE}"),
    }
}

/// Why a message's line cannot be shown.
const GONE: &str = "no longer there (the inbox was deleted, or replaced)";

/// When the addressee closed `request` with its answer (not a cancel, not a `working`).
fn answered_at(request: &doorbell_core::Request) -> Option<chrono::DateTime<Utc>> {
    use doorbell_core::State::{Completed, Failed, Rejected};
    matches!(request.state, Completed | Failed | Rejected)
        .then_some(request.closed_at)
        .flatten()
}

/// A line as JSON to put inside a JSON document, when every JSON parser takes it: a refused
/// line may not be, and a raw parse passes a lone surrogate escape (`\ud800`) that a full one
/// refuses.
fn embeddable(bytes: &[u8]) -> Option<&RawValue> {
    serde_json::from_slice::<serde_json::Value>(bytes).ok()?;
    serde_json::from_slice(bytes).ok()
}

/// Why `show id` has no message to show: a broadcast's id stands for its requests (as
/// `wait`, `reply` and `cancel` take it), or there is none.
fn not_a_message(view: &doorbell_store::View, id: &str) -> anyhow::Result<anyhow::Error> {
    let named = view.requests_named(id)?;
    Ok(match named.first() {
        Some(first) => refused(format!(
            "'{id}' is a broadcast: its requests are {} (doorbell show {first})",
            named.join(", ")
        )),
        None => refused(format!("no message '{id}' in the journal")),
    })
}

pub fn show(session: &Session, args: &ShowArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let view = view(&bridge)?;
    let id = args.id.as_str();
    let Some(record) = view.message(id)? else {
        return Err(not_a_message(&view, id)?);
    };
    let bytes = record.line.as_deref();
    let envelope = bytes.and_then(embeddable);
    let read = record.read;
    let how = read
        .then(|| {
            let meta = std::fs::symlink_metadata(bridge.inbox_path(&record.inbox).ok()?).ok()?;
            doorbell_store::cursor::read_via(
                &bridge,
                &record.inbox,
                std::os::unix::fs::MetadataExt::dev(&meta),
                std::os::unix::fs::MetadataExt::ino(&meta),
                record.offset,
            )
        })
        .flatten();
    let request = view.request(id);
    let verdict = match record.verdict {
        Word::Accepted => "accepted",
        Word::Duplicate => "duplicate",
        _ => "refused",
    };
    let shown = Shown {
        id,
        inbox: &record.inbox,
        offset: record.offset,
        verdict,
        reason: record.reason.as_deref(),
        detail: record.detail.as_deref(),
        delivered_at: time(record.seen_at).filter(|_| record.verdict == Word::Accepted),
        read,
        read_via: how.as_ref().map(|h| h.via.clone()),
        read_at: how.as_ref().map(|h| h.at.clone()),
        first_response_at: request.as_ref().and_then(|r| r.first_response_at).map(rfc),
        answered_at: request.as_deref().and_then(answered_at).map(rfc),
        state: request.as_ref().map(|r| r.state.as_str()),
        thread: record.context_id.as_deref(),
        envelope,
        missing: bytes.is_none().then_some(GONE),
        owed: request.as_deref().and_then(Owed::of),
    };
    if args.json {
        out!("{}", serde_json::to_string(&shown)?)?;
        return Ok(OK);
    }
    // The detail quotes the refused line: escaped, like every text from a line.
    out!(
        "{}: {verdict}{}",
        output::printable(id),
        shown
            .reason
            .map(|r| format!(" ({r}: {})", output::printable(shown.detail.unwrap_or(""))))
            .unwrap_or_default()
    )?;
    out!("  {}", where_it_is(&view, &record))?;
    if let Some(at) = &shown.delivered_at {
        out!(
            "  delivered {at}; {}",
            match (&shown.read_via, &shown.read_at, read) {
                (Some(via), Some(at), _) => format!("read through {via} at {at}"),
                (_, _, true) => "read".to_owned(),
                _ => "not read yet".to_owned(),
            }
        )?;
    }
    if let Some(request) = &request {
        out!(
            "  request {} → {}: {}{}",
            request.requester,
            request.addressee,
            request.state,
            request
                .first_response_at
                .map(|t| format!(", first response {}", rfc(t)))
                .unwrap_or_default()
        )?;
        if request.is_open() {
            out!(
                "  {} owes {} since {} ({})",
                request.debtor_station(),
                request.creditor(),
                rfc(request.state_since),
                rings_said(request)
            )?;
        }
    }
    if let Some(thread) = shown.thread {
        out!("  thread {thread} (doorbell thread {thread})")?;
    }
    if let Some(envelope) = bytes.and_then(envelope_of) {
        out_text!("\n{}", output::message(&envelope, Utc::now()))?;
    }
    Ok(OK)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DebtOut<'a> {
    request: &'a str,
    debtor: &'a str,
    creditor: &'a str,
    state: &'a str,
    priority: u8,
    silent_since: String,
    /// Rings since `silent_since`; `rings_in_all`: the request's whole life.
    rings: u32,
    rings_in_all: u32,
    reply_by: Option<String>,
}

pub fn debts(session: &Session, args: &DebtsArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let open = view(&bridge)?.debts()?;
    if let Some(name) = &args.owed_by {
        let registry = bridge.registry()?;
        // A debtor that is no station now (its inbox gone) still owes what it owed.
        let owes = open.iter().any(|r| r.debtor_station() == name);
        if !registry.stations.contains(name) && !owes {
            let known: Vec<&str> = registry.stations.iter().map(String::as_str).collect();
            return Err(crate::exit::refused(format!(
                "--owed-by: no station '{name}' (known: {}); only a station owes",
                known.join(", ")
            )));
        }
    }
    let debts: Vec<DebtOut<'_>> = open
        .iter()
        .filter(|d| {
            args.owed_by
                .as_deref()
                .is_none_or(|a| d.debtor_station() == a)
        })
        .map(|d| DebtOut {
            request: &d.id,
            debtor: d.debtor_station(),
            creditor: d.creditor(),
            state: d.state.as_str(),
            priority: d.priority,
            silent_since: rfc(d.state_since),
            rings: d.rings,
            rings_in_all: d.rings_total,
            reply_by: d.reply_by.map(rfc),
        })
        .collect();
    if args.json {
        out!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "debts": debts }))?
        )?;
        return Ok(OK);
    }
    if debts.is_empty() {
        out!("no open debts")?;
        return Ok(OK);
    }
    let now = Utc::now();
    // Each column as wide as its widest entry (a broadcast's ids are long).
    let width = |head: &str, cell: &dyn Fn(&DebtOut<'_>) -> usize| {
        debts.iter().map(cell).max().unwrap_or(0).max(head.len())
    };
    let w_request = width("request", &|d| d.request.len());
    let w_debtor = width("debtor", &|d| d.debtor.len());
    let w_creditor = width("creditor", &|d| d.creditor.len());
    let w_state = width("state", &|d| d.state.len());
    out!(
        "{:<w_request$} {:<w_debtor$} {:<w_creditor$} {:<w_state$} {:>5}  silent since",
        "request",
        "debtor",
        "creditor",
        "state",
        "rings"
    )?;
    for debt in &debts {
        let since =
            DateTime::parse_from_rfc3339(&debt.silent_since).map_or(now, |t| t.with_timezone(&Utc));
        out!(
            "{:<w_request$} {:<w_debtor$} {:<w_creditor$} {:<w_state$} {:>5}  {}",
            debt.request,
            debt.debtor,
            debt.creditor,
            debt.state,
            debt.rings,
            output::age(since, now)
        )?;
    }
    Ok(OK)
}

pub fn thread(session: &Session, args: &ThreadArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let context = args.context.as_str();
    let view = view(&bridge)?;
    let mut messages = view.thread(context)?;
    // A message's id names its thread too (a request that named another contextId). When
    // the name is a thread's and also the id of a message in another thread, both are said.
    if let Some(named) = view.message(context)?.and_then(|found| found.context_id) {
        if messages.is_empty() {
            messages = view.thread(&named)?;
        } else if named != context {
            eprintln!(
                "doorbell: {} is also the id of a message in thread {} (doorbell thread {})",
                output::printable(context),
                output::printable(&named),
                output::printable(&named)
            );
        }
    }
    if messages.is_empty() {
        return Err(refused(format!("no thread '{context}' in the journal")));
    }
    let now = Utc::now();
    for message in &messages {
        let Some(bytes) = &message.line else {
            if args.json {
                // Still one JSON document a line: what the ledger knows, and why no more.
                let gone = serde_json::json!({
                    "inbox": message.row.inbox,
                    "offset": message.row.offset,
                    "verdict": "accepted",
                    "id": message.row.id,
                    "from": message.row.from,
                    "envelope": null,
                    "missing": "no longer in its inbox (the inbox was replaced)",
                });
                out!("{gone}")?;
            } else {
                out!(
                    "{}: no longer in {}-inbox.jsonl (the inbox was replaced)",
                    message.row.id,
                    message.row.inbox
                )?;
            }
            continue;
        };
        if args.json {
            let raw: &RawValue = serde_json::from_slice(bytes)?;
            let out = crate::read::JsonMessage {
                inbox: &message.row.inbox,
                offset: message.row.offset,
                verdict: "accepted",
                envelope: raw,
            };
            out!("{}", serde_json::to_string(&out)?)?;
        } else if let Some(envelope) = message.envelope() {
            out!("{}", output::message(&envelope, now))?;
        }
    }
    let steps: Vec<Step> = messages
        .iter()
        .map(|m| Step {
            id: m.row.id.clone(),
            from: m.row.from.clone(),
            to: m.row.inbox.clone(),
            at: DateTime::from_timestamp_millis(m.row.seen_at).unwrap_or_default(),
        })
        .collect();
    let Some(trace) = doorbell_core::trace::trace(&steps) else {
        return Ok(OK);
    };
    if args.json {
        out!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "trace": trace }))?
        )?;
        return Ok(OK);
    }
    print_trace(&trace)?;
    Ok(OK)
}

/// The trace under a thread: first to last, each message's wait, who held it longest.
fn print_trace(trace: &doorbell_core::trace::Trace) -> std::io::Result<()> {
    use doorbell_core::trace::span;
    out!(
        "trace: {}, {} from the first ({}) to the last ({})",
        plural(trace.messages, "message", "messages"),
        span(trace.total_secs),
        rfc(trace.first),
        rfc(trace.last)
    )?;
    for step in &trace.steps {
        let waited = match &step.held_by {
            Some(holder) => format!("+{} ({holder} had it)", span(step.since_last_secs)),
            None => "first".to_owned(),
        };
        out!("  {} {} → {}: {waited}", step.id, step.from, step.to)?;
    }
    if let Some(longest) = trace.longest() {
        out!(
            "  held longest: {}, {} in {}",
            longest.agent,
            span(longest.secs),
            plural(longest.waits, "wait", "waits")
        )?;
    }
    Ok(())
}
