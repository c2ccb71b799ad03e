//! The daily reports in `reports/`: one markdown file per local date, written atomically, and
//! the note from `report-loop` that announces each one to the human station exactly once
//! (reserved id `report:<date>`, intent journaled before the write like every judge's line).

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;

use doorbell_core::report::Activity;
use doorbell_core::{judge_stateless, Limits, MessageSummary};

use crate::append::open_inbox;
use crate::journal::{journal_path, Snapshot};
use crate::{Bridge, Error, Result};

pub const REPORTS_DIR: &str = "reports";

/// The reports folder, created (0700) when missing.
pub fn reports_dir(bridge: &Bridge) -> Result<PathBuf> {
    let dir = bridge.dir().join(REPORTS_DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(Error::io("create folder", &dir))?;
    Ok(dir)
}

/// Whether `name` is `YYYY-MM-DD.md`; its date if so.
fn date_of(name: &str) -> Option<&str> {
    let date = name.strip_suffix(".md")?;
    chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").ok()?;
    Some(date)
}

/// Every daily report file, oldest first, with its date.
pub fn daily_reports(bridge: &Bridge) -> Result<Vec<(String, PathBuf)>> {
    let dir = bridge.dir().join(REPORTS_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list reports", &dir)(e)),
    };
    let mut reports: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            Some((date_of(&name)?.to_owned(), e.path()))
        })
        .collect();
    reports.sort();
    Ok(reports)
}

/// Write the report for `date` atomically; returns its path.
pub fn write_daily(bridge: &Bridge, date: &str, markdown: &str) -> Result<PathBuf> {
    let path = reports_dir(bridge)?.join(format!("{date}.md"));
    crate::atomic::write_atomic(&path, markdown.as_bytes())?;
    Ok(path)
}

/// The reserved id of the note that announces the report of `date`.
#[must_use]
pub fn note_id(date: &str) -> String {
    format!("report:{date}")
}

/// A report's summary line: its first bold line.
#[must_use]
pub fn summary_of(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("**")?.strip_suffix("**"))
        .map(str::to_owned)
}

/// The note from `report-loop` to `human` announcing the report of `date`.
#[must_use]
pub fn note_line(
    id: &str,
    human: &str,
    date: &str,
    path: &Path,
    summary: &str,
    now: DateTime<Utc>,
) -> String {
    let text = format!(
        "doorbell morning report {date}: {summary}. The whole report: {}",
        path.display()
    );
    doorbell_core::notice::LoopNote {
        id,
        from: "report-loop",
        to: human,
        correlates_to: None,
        context_id: None,
        priority: None,
        text: &text,
        data: None,
    }
    .line(now)
}

/// What happened in the window, from the journal.
pub fn activity(bridge: &Bridge, since: DateTime<Utc>) -> Result<Activity> {
    /// The few fields a report counts, borrowed from the record: the scan of a long journal
    /// builds nothing it does not need.
    #[derive(serde::Deserialize)]
    struct Counted<'a> {
        t: i64,
        #[serde(borrow)]
        v: &'a str,
        #[serde(borrow)]
        a: Option<CountedLine<'a>>,
        #[serde(borrow)]
        reason: Option<std::borrow::Cow<'a, str>>,
    }
    #[derive(serde::Deserialize)]
    struct CountedLine<'a> {
        #[serde(borrow)]
        f: std::borrow::Cow<'a, str>,
        k: doorbell_core::Kind,
    }
    let since = since.timestamp_millis();
    let path = journal_path(bridge);
    let mut activity = Activity::default();
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(activity),
        Err(e) => return Err(Error::io("open journal", &path)(e)),
    };
    crate::reader::LineReader::new(1 << 26).read(&file, 0, |line| -> Result<()> {
        let crate::reader::Line::Complete { bytes, .. } = line else {
            return Ok(());
        };
        let record: Counted<'_> =
            serde_json::from_slice(bytes).map_err(|e| Error::CorruptJournal {
                path: path.clone(),
                line: 0,
                message: e.to_string(),
            })?;
        if record.t < since {
            return Ok(());
        }
        match (record.v, record.a) {
            ("a", Some(line)) => {
                let kinds = match activity.sent.get_mut(line.f.as_ref()) {
                    Some(kinds) => kinds,
                    None => activity.sent.entry(line.f.into_owned()).or_default(),
                };
                *kinds.entry(line.k).or_default() += 1;
            }
            ("r", _) => {
                *activity
                    .refused
                    .entry(record.reason.unwrap_or_default().into_owned())
                    .or_default() += 1;
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(activity)
}

/// The first line of text of each open request, read from its inbox.
pub fn texts(
    bridge: &Bridge,
    snapshot: &Snapshot,
    wanted: &dyn Fn(&doorbell_core::Request) -> bool,
) -> BTreeMap<String, String> {
    let limits = Limits {
        max_line_bytes: usize::MAX,
    };
    let mut texts = BTreeMap::new();
    let mut files = BTreeMap::new();
    let mut buf = Vec::new();
    for request in snapshot.ledger.requests().filter(|r| wanted(r)) {
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
        // Most lines are short: read a little, and the whole allowed length only when the
        // line goes on.
        for size in [8 * 1024, bridge.max_line_bytes() + 2] {
            buf.resize(size, 0);
            let Ok(n) = file.read_at(&mut buf, offset) else {
                break;
            };
            let Some(end) = memchr::memchr(b'\n', &buf[..n]) else {
                continue;
            };
            if let Ok(envelope) = judge_stateless(&buf[..end], None, &limits) {
                texts.insert(request.id.clone(), envelope.message.first_line());
            }
            break;
        }
    }
    texts
}
