//! `doorbell show`, `doorbell debts` and `doorbell thread`: what the ledger and the journal
//! know about one message, about who owes whom, and about one conversation.

use std::os::unix::fs::{FileExt, MetadataExt};

use chrono::{DateTime, SecondsFormat, Utc};
use doorbell_store::append::open_inbox;
use doorbell_store::journal::{journal_path, JournalFollower, Record, Word};
use doorbell_store::{cursor, Bridge};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::args::{DebtsArgs, ShowArgs, ThreadArgs};
use crate::exit::{refused, OK};
use crate::output;
use crate::session::{caught_up, Session};

fn time(millis: i64) -> Option<String> {
    DateTime::from_timestamp_millis(millis).map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The raw line a record points to, when its file still holds it.
fn line_of(bridge: &Bridge, record: &Record) -> Option<Vec<u8>> {
    let file = open_inbox(&bridge.inbox_path(&record.inbox).ok()?, false).ok()?;
    let mut buf = vec![0; record.span.checked_sub(1)? as usize];
    file.read_exact_at(&mut buf, record.offset).ok()?;
    Some(buf)
}

/// Every journal record, oldest first, for which `keep` says yes.
fn scan(bridge: &Bridge, keep: &mut dyn FnMut(&Record) -> bool) -> anyhow::Result<Vec<Record>> {
    let mut found = Vec::new();
    JournalFollower::new(journal_path(bridge), 0).read(&mut |record| {
        if keep(&record) {
            found.push(record);
        }
    })?;
    Ok(found)
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
    answered_at: Option<String>,
    state: Option<&'a str>,
    thread: Option<&'a str>,
    envelope: Option<&'a RawValue>,
}

pub fn show(session: &Session, args: &ShowArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let snapshot = caught_up(&bridge)?;
    let id = args.id.as_str();
    let found = scan(&bridge, &mut |r| {
        r.line.as_ref().is_some_and(|a| a.id == id)
            || (r.verdict != Word::Accepted && r.id.as_deref() == Some(id))
    })?;
    let Some(record) = found.first() else {
        return Err(refused(format!("no message '{id}' in the journal")));
    };
    let bytes = line_of(&bridge, record);
    let envelope: Option<&RawValue> = bytes
        .as_deref()
        .and_then(|b| serde_json::from_slice(b).ok());
    let read = open_inbox(&bridge.inbox_path(&record.inbox)?, false)
        .ok()
        .and_then(|file| {
            let meta = file.metadata().ok()?;
            let journal = snapshot.inboxes.get(&record.inbox)?;
            let same =
                (meta.dev(), meta.ino()) == (journal.dev, journal.ino) && journal.gen == record.gen;
            Some(same && cursor::load(&bridge, &record.inbox, &file).ok()?.offset() > record.offset)
        })
        .unwrap_or(false);
    let request = snapshot.ledger.request(id);
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
        answered_at: request.and_then(|r| r.first_response_at).map(rfc),
        state: request.map(|r| r.state.as_str()),
        thread: record.line.as_ref().map(|a| a.context_id.as_str()),
        envelope,
    };
    if args.json {
        println!("{}", serde_json::to_string(&shown)?);
        return Ok(OK);
    }
    println!(
        "{id}: {verdict}{}",
        shown
            .reason
            .map(|r| format!(" ({r}: {})", shown.detail.unwrap_or("")))
            .unwrap_or_default()
    );
    println!("  in {}-inbox.jsonl at byte {}", shown.inbox, shown.offset);
    if let Some(at) = &shown.delivered_at {
        println!(
            "  delivered {at}; {}",
            if read { "read" } else { "not read yet" }
        );
    }
    if let Some(request) = request {
        println!(
            "  request {} → {}: {}{}",
            request.requester,
            request.addressee,
            request.state,
            request
                .first_response_at
                .map(|t| format!(", first answered {}", rfc(t)))
                .unwrap_or_default()
        );
        if request.is_open() {
            println!(
                "  {} owes {} since {} ({} rings)",
                request.debtor(),
                request.creditor(),
                rfc(request.state_since),
                request.rings_total
            );
        }
    }
    if let Some(thread) = shown.thread {
        println!("  thread {thread} (doorbell thread {thread})");
    }
    if let Some(bytes) = &bytes {
        let limits = doorbell_core::Limits {
            max_line_bytes: usize::MAX,
        };
        if let Ok(envelope) = doorbell_core::judge_stateless(bytes, None, &limits) {
            print!("\n{}", output::message(&envelope, Utc::now()));
        }
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
    rings: u32,
    reply_by: Option<String>,
}

pub fn debts(session: &Session, args: &DebtsArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let snapshot = caught_up(&bridge)?;
    let debts: Vec<DebtOut<'_>> = snapshot
        .ledger
        .debts()
        .into_iter()
        .filter(|d| args.owed_by.as_deref().is_none_or(|a| d.debtor() == a))
        .map(|d| DebtOut {
            request: &d.request.id,
            debtor: d.debtor(),
            creditor: d.creditor(),
            state: d.request.state.as_str(),
            priority: d.request.priority,
            silent_since: rfc(d.request.state_since),
            rings: d.request.rings_total,
            reply_by: d.request.reply_by.map(rfc),
        })
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "debts": debts }))?
        );
        return Ok(OK);
    }
    if debts.is_empty() {
        println!("no open debts");
        return Ok(OK);
    }
    let now = Utc::now();
    println!(
        "{:<28} {:<14} {:<14} {:<15} {:>5}  silent since",
        "request", "debtor", "creditor", "state", "rings"
    );
    for debt in &debts {
        let since =
            DateTime::parse_from_rfc3339(&debt.silent_since).map_or(now, |t| t.with_timezone(&Utc));
        println!(
            "{:<28} {:<14} {:<14} {:<15} {:>5}  {}",
            debt.request,
            debt.debtor,
            debt.creditor,
            debt.state,
            debt.rings,
            output::age(since, now)
        );
    }
    Ok(OK)
}

pub fn thread(session: &Session, args: &ThreadArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    drop(caught_up(&bridge)?);
    let context = args.context.as_str();
    let records = scan(&bridge, &mut |r| {
        r.verdict == Word::Accepted && r.line.as_ref().is_some_and(|a| a.context_id == context)
    })?;
    if records.is_empty() {
        return Err(refused(format!("no thread '{context}' in the journal")));
    }
    let now = Utc::now();
    let limits = doorbell_core::Limits {
        max_line_bytes: usize::MAX,
    };
    for record in &records {
        let Some(bytes) = line_of(&bridge, record) else {
            let id = record.line.as_ref().map_or("?", |a| a.id.as_str());
            println!(
                "{id}: no longer in {}-inbox.jsonl (the inbox was replaced)",
                record.inbox
            );
            continue;
        };
        if args.json {
            let raw: &RawValue = serde_json::from_slice(&bytes)?;
            let out = crate::read::JsonMessage {
                inbox: &record.inbox,
                offset: record.offset,
                verdict: "accepted",
                envelope: raw,
            };
            println!("{}", serde_json::to_string(&out)?);
        } else if let Ok(envelope) = doorbell_core::judge_stateless(&bytes, None, &limits) {
            println!("{}", output::message(&envelope, now));
        }
    }
    Ok(OK)
}
