//! `doorbell report`: the stalled-request report. The ledger says what is open and since
//! when; the journal says what happened in the window. `--daily` writes
//! `reports/<local date>.md` atomically; the judge then announces it to the human station,
//! once (the daemon sees the file appear; with no daemon, this command catches up itself).

use std::io::IsTerminal;

use anyhow::Context;
use chrono::{DateTime, Local, Utc};
use doorbell_core::report::{build, Inputs};
use doorbell_store::{reports, Bridge};

use crate::args::{ReportArgs, ReportFormat};
use crate::exit::{refused, OK};
use crate::session::{view, Session};

/// A time argument: an RFC 3339 time, or a duration back from `now` (`24h`).
pub fn time_back(flag: &str, text: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let back =
        doorbell_core::duration::parse_duration(text).map_err(|e| bad_time(flag, text, &e))?;
    chrono::Duration::from_std(back)
        .ok()
        .and_then(|back| now.checked_sub_signed(back))
        .ok_or_else(|| {
            refused(format!(
                "{flag}: {text} goes back before any time this can say"
            ))
        })
}

/// Why `text` is neither an RFC 3339 time nor a duration, for `flag`: what an RFC 3339 parser
/// says of it when it looks like a date (`2026-13-01T00:00:00Z`: month out of range), else
/// what the duration parser says.
pub fn bad_time(flag: &str, text: &str, duration_error: &str) -> anyhow::Error {
    let bytes = text.as_bytes();
    let dated = bytes.len() > 4 && bytes[..4].iter().all(u8::is_ascii_digit) && bytes[4] == b'-';
    match DateTime::parse_from_rfc3339(text) {
        Err(e) if dated => refused(format!(
            "{flag}: '{text}' is not an RFC 3339 time ({e}), such as 2026-12-01T09:00:00Z"
        )),
        _ => refused(format!(
            "{flag}: {duration_error}; or give an RFC 3339 time"
        )),
    }
}

/// The window's start: `--since`, else the last daily report, else 24 hours ago. The daily
/// report leaves out today's own (a second run the same day covers the same window).
fn since(
    bridge: &Bridge,
    args: &ReportArgs,
    now: DateTime<Utc>,
    today: &str,
) -> anyhow::Result<DateTime<Utc>> {
    if let Some(since) = &args.since {
        let since = time_back("--since", since, now)?;
        if since > now {
            return Err(refused(format!(
                "--since: {} is in the future: the window ends now",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )));
        }
        return Ok(since);
    }
    let last = reports::daily_reports(bridge)?
        .into_iter()
        .rfind(|(date, _)| !(args.daily && date == today))
        // Where its window ended, as it says: its file's time is later (the report was built
        // and written after), and moves when someone edits it.
        .and_then(|(_, path)| {
            reports::window_end(&path).or_else(|| {
                let modified = path.metadata().ok()?.modified().ok()?;
                Some(DateTime::<Utc>::from(modified))
            })
        });
    Ok(last
        .filter(|t| *t < now)
        .unwrap_or(now - chrono::Duration::hours(24)))
}

/// Whether the report shows `request`'s text: a stalled debt, or a question to the human.
fn shown(
    request: &doorbell_core::Request,
    now: DateTime<Utc>,
    stalled_after: std::time::Duration,
    human: &str,
) -> bool {
    let silent = (now - request.state_since).to_std().unwrap_or_default();
    request.is_open() && (request.debtor_station() == human || silent >= stalled_after)
}

pub fn run(session: &Session, args: &ReportArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let mut view = view(&bridge)?;
    let now = Utc::now();
    let date = now.with_timezone(&Local).format("%Y-%m-%d").to_string();
    let since = since(&bridge, args, now, &date)?;
    let stalled_after = session.config.debts.stalled_after;
    let human = session.config.human.clone();
    let requests = view.report_requests(since)?;
    let requests: Vec<&doorbell_core::Request> = requests.iter().collect();
    let texts = view.texts(
        &requests
            .iter()
            .copied()
            .filter(|r| shown(r, now, stalled_after, &human))
            .collect::<Vec<_>>(),
    );
    let inputs = Inputs {
        requests,
        activity: view.activity(since)?,
        texts,
        since,
        now,
        stalled_after: session.config.debts.stalled_after,
        human: session.config.human.clone(),
    };
    let report = build(&inputs);
    let title = format!("doorbell report {date}");
    if args.daily {
        let path = reports::write_daily(&bridge, &date, &report.markdown(&title), now)?;
        // With no daemon running, announce it now; a running daemon sees the file appear.
        drop(view);
        drop(crate::session::view(&bridge)?);
        out!("{}", path.display())?;
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
        None => out_text!("{text}")?,
    }
    Ok(OK)
}
