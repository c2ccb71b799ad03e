//! The daily reports in `reports/`: one markdown file per local date, written atomically, and
//! the note from `report-loop` that announces each one to the human station exactly once
//! (reserved id `report:<date>`, intent journaled before the write like every judge's line).

use std::fs;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::{Bridge, Error, Result};

pub const REPORTS_DIR: &str = "reports";

/// The reports folder, created (0700) when missing.
pub fn reports_dir(bridge: &Bridge) -> Result<PathBuf> {
    let dir = bridge.dir().join(REPORTS_DIR);
    crate::bridge::make_dir_in(&dir)?;
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

/// The last line of a daily report: where its window ended, to the millisecond, for the next
/// report's window to start (an HTML comment, which markdown does not show).
const WINDOW_END: &str = "<!-- doorbell: window until ";

/// Write the report for `date`, whose window ends at `until`, atomically; returns its path.
pub fn write_daily(
    bridge: &Bridge,
    date: &str,
    markdown: &str,
    until: chrono::DateTime<chrono::Utc>,
) -> Result<PathBuf> {
    let path = reports_dir(bridge)?.join(format!("{date}.md"));
    let until = until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let text = format!("{}\n\n{WINDOW_END}{until} -->\n", markdown.trim_end());
    crate::atomic::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// Where the window of the daily report at `path` ended, as it says; `None` for a report
/// that does not say (written by an older doorbell, or the line edited away).
#[must_use]
pub fn window_end(path: &Path) -> Option<chrono::DateTime<chrono::Utc>> {
    let text = fs::read_to_string(path).ok()?;
    let until = text
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(WINDOW_END)?.strip_suffix(" -->"))?;
    chrono::DateTime::parse_from_rfc3339(until)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
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

/// The line at `offset` of `file` (without its `\n`), reading a little first and the whole
/// allowed length only when the line goes on.
#[must_use]
pub fn line_from(file: &File, offset: u64, max_line_bytes: usize) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    for size in [8 * 1024, max_line_bytes + 2] {
        buf.resize(size, 0);
        let n = file.read_at(&mut buf, offset).ok()?;
        if let Some(end) = memchr::memchr(b'\n', &buf[..n]) {
            buf.truncate(end);
            return Some(buf);
        }
    }
    None
}
