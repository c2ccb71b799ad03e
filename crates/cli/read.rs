//! `doorbell read`: the accepted messages past an agent's cursor, then the cursor moves to
//! where judging stopped. It never shows a line the journal has not accepted, never a partial
//! line, and never moves the cursor past a line the judge has not judged.

use std::os::unix::fs::{FileExt, MetadataExt};

use anyhow::Context;
use chrono::Utc;
use doorbell_core::{judge_stateless, Limits};
use doorbell_store::append::open_inbox;
use doorbell_store::cursor::{self, Position};

use crate::args::ReadArgs;
use crate::exit::OK;
use crate::output;
use crate::session::Session;

/// One message of `read --json`: where it is, its verdict, and the envelope exactly as written.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonMessage<'a> {
    pub inbox: &'a str,
    pub offset: u64,
    pub verdict: &'a str,
    pub seen_at: String,
    pub envelope: &'a serde_json::value::RawValue,
}

pub fn run(session: &Session, args: &ReadArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let path = bridge.require_inbox(&args.agent)?;
    let snapshot = crate::session::caught_up(&bridge)?;
    let inbox = open_inbox(&path, false)?;
    let meta = inbox.metadata().context("stat inbox")?;
    let position = cursor::load(&bridge, &args.agent, &inbox)?;
    if let Position::Replaced { stale_offset } = position {
        eprintln!(
            "doorbell: {}'s inbox was replaced or truncated since the cursor was saved (at byte {stale_offset}); reading it from the start",
            args.agent
        );
    }
    let Some(journal) = snapshot
        .inboxes
        .get(&args.agent)
        .filter(|j| j.dev == meta.dev() && j.ino == meta.ino())
    else {
        // The judge has not seen this file yet: nothing is accepted in it.
        return Ok(OK);
    };
    let from = if args.all { 0 } else { position.offset() };
    let limits = Limits {
        max_line_bytes: usize::MAX,
    };
    let now = Utc::now();
    let mut out = std::io::stdout().lock();
    let mut buf = Vec::new();
    for line in journal.accepted_from(from) {
        buf.resize(line.span as usize - 1, 0);
        inbox
            .read_exact_at(&mut buf, line.offset)
            .with_context(|| format!("reading {} at byte {}", path.display(), line.offset))?;
        let seen_at = chrono::DateTime::from_timestamp_millis(line.seen_at).unwrap_or(now);
        let Ok(envelope) = judge_stateless(&buf, None, &limits) else {
            // The bytes no longer match their verdict: the file changed under us.
            anyhow::bail!(
                "{} changed at byte {} while reading; run the command again",
                path.display(),
                line.offset
            );
        };
        let text = if args.json {
            let raw: &serde_json::value::RawValue =
                serde_json::from_slice(buf.strip_suffix(b"\r").unwrap_or(&buf))
                    .context("re-reading an accepted line")?;
            let record = JsonMessage {
                inbox: &args.agent,
                offset: line.offset,
                verdict: "accepted",
                seen_at: seen_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                envelope: raw,
            };
            let record =
                serde_json::to_string(&record).expect("a message record always serialises");
            format!("{record}\n")
        } else {
            format!("{}\n", output::message(&envelope, seen_at, now))
        };
        match std::io::Write::write_all(&mut out, text.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(OK),
            other => other.context("writing to stdout")?,
        }
    }
    std::io::Write::flush(&mut out).ok();
    if !args.peek && journal.judged_to > position.offset() {
        cursor::advance(&bridge, &args.agent, &inbox, journal.judged_to)?;
    }
    Ok(OK)
}
