//! `doorbell report`: the stalled-request report. The ledger says what is open and since
//! when; the journal says what happened in the window. `--daily` writes
//! `reports/<local date>.md` atomically; the judge then announces it to the human station,
//! once (the daemon sees the file appear; with no daemon, this command catches up itself).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::os::unix::fs::FileExt;

use anyhow::Context;
use chrono::{DateTime, Local, Utc};
use doorbell_core::report::{build, Activity, Inputs};
use doorbell_core::{judge_stateless, Limits, MessageSummary};
use doorbell_store::append::open_inbox;
use doorbell_store::journal::{journal_path, JournalFollower, Snapshot, Word};
use doorbell_store::{reports, Bridge};

use crate::args::{ReportArgs, ReportFormat};
use crate::exit::{refused, OK};
use crate::session::{caught_up, Session};

/// The window's start: `--since`, else the last daily report, else 24 hours ago.
fn since(bridge: &Bridge, args: &ReportArgs, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    if let Some(since) = &args.since {
        if let Ok(t) = DateTime::parse_from_rfc3339(since) {
            return Ok(t.with_timezone(&Utc));
        }
        let back = doorbell_core::duration::parse_duration(since)
            .map_err(|e| refused(format!("--since: {e}; or give an RFC 3339 time")))?;
        return Ok(now - chrono::Duration::from_std(back).unwrap_or(chrono::Duration::MAX));
    }
    let last = reports::daily_reports(bridge)?
        .last()
        .and_then(|(_, path)| path.metadata().ok()?.modified().ok())
        .map(DateTime::<Utc>::from);
    Ok(last
        .filter(|t| *t < now)
        .unwrap_or(now - chrono::Duration::hours(24)))
}

/// What happened in the window, from the journal.
fn activity(bridge: &Bridge, since: DateTime<Utc>) -> anyhow::Result<Activity> {
    let since = since.timestamp_millis();
    let mut activity = Activity::default();
    JournalFollower::new(journal_path(bridge), 0).read(&mut |record| {
        if record.seen_at < since {
            return;
        }
        match (record.verdict, &record.line) {
            (Word::Accepted, Some(line)) => {
                *activity
                    .sent
                    .entry(line.from.clone())
                    .or_default()
                    .entry(line.kind)
                    .or_default() += 1;
            }
            (Word::Refused, _) => {
                *activity
                    .refused
                    .entry(record.reason.unwrap_or_default())
                    .or_default() += 1;
            }
            _ => {}
        }
    })?;
    Ok(activity)
}

/// The first line of text of each open request, read from its inbox.
fn texts(bridge: &Bridge, snapshot: &Snapshot) -> BTreeMap<String, String> {
    let limits = Limits {
        max_line_bytes: usize::MAX,
    };
    let mut texts = BTreeMap::new();
    let mut files = BTreeMap::new();
    for request in snapshot.ledger.requests().filter(|r| r.is_open()) {
        let Some((gen, offset)) = request.location else {
            continue;
        };
        // A request from an inbox generation that was since replaced has no text to show.
        if snapshot
            .inboxes
            .get(&request.addressee)
            .is_none_or(|j| j.gen != gen)
        {
            continue;
        }
        let file = files.entry(request.addressee.clone()).or_insert_with(|| {
            bridge
                .inbox_path(&request.addressee)
                .ok()
                .and_then(|p| open_inbox(&p, false).ok())
        });
        let Some(file) = file else { continue };
        // The line ends before the next verdict's offset; read up to the limit and cut.
        let mut buf = vec![0; bridge.max_line_bytes().min(64 * 1024) + 1];
        let Ok(n) = file.read_at(&mut buf, offset) else {
            continue;
        };
        let line = buf[..n].split(|&b| b == b'\n').next().unwrap_or_default();
        if let Ok(envelope) = judge_stateless(line, None, &limits) {
            texts.insert(request.id.clone(), envelope.message.first_line());
        }
    }
    texts
}

pub fn run(session: &Session, args: &ReportArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let snapshot = caught_up(&bridge)?;
    let now = Utc::now();
    let since = since(&bridge, args, now)?;
    let inputs = Inputs {
        requests: snapshot.ledger.requests().collect(),
        activity: activity(&bridge, since)?,
        texts: texts(&bridge, &snapshot),
        since,
        now,
        stalled_after: session.config.debts.stalled_after,
        human: session.config.human.clone(),
    };
    let report = build(&inputs);
    let date = now.with_timezone(&Local).format("%Y-%m-%d").to_string();
    let title = format!("doorbell report {date}");
    if args.daily {
        let path = reports::write_daily(&bridge, &date, &report.markdown(&title))?;
        // With no daemon running, announce it now; a running daemon sees the file appear.
        drop(caught_up(&bridge)?);
        println!("{}", path.display());
        return Ok(OK);
    }
    let format = args.format.unwrap_or(if args.out.is_some() {
        ReportFormat::Markdown
    } else {
        ReportFormat::Text
    });
    let text = match format {
        ReportFormat::Markdown => report.markdown(&title),
        ReportFormat::Json => format!("{}\n", serde_json::to_string(&report)?),
        ReportFormat::Text => {
            let colour = args.out.is_none()
                && std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            report.text(colour)
        }
    };
    match &args.out {
        Some(path) => doorbell_store::atomic::write_atomic(path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?,
        None => print!("{text}"),
    }
    Ok(OK)
}
