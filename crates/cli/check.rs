//! `doorbell check`: the stateless rules applied offline to every line of inbox files. It
//! reads files only; it never takes the lock, writes the journal or moves a cursor. Rules
//! that need the registry or the ledger (a known sender, the request a response answers)
//! are the judge's alone, and the summary says so.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::Context;
use doorbell_core::{judge_stateless, Limits, Refusal, RefusalReason};
use doorbell_store::bridge::inbox_name;
use doorbell_store::reader::{Line, LineReader};

use crate::args::CheckArgs;
use crate::exit::{OK, REFUSED};
use crate::session::Session;

pub fn run(session: &Session, args: &CheckArgs) -> anyhow::Result<i32> {
    let files: Vec<PathBuf> = if args.files.is_empty() {
        let bridge = session.bridge()?;
        bridge
            .inboxes()?
            .iter()
            .map(|name| bridge.inbox_path(name))
            .collect::<Result<_, _>>()?
    } else {
        args.files.clone()
    };
    let max_line_bytes = args.max_line_bytes.unwrap_or(session.config.max_line_bytes);
    let (mut ok, mut refused) = (0u64, 0u64);
    for path in &files {
        let (file_ok, file_refused) = check_file(path, max_line_bytes, args.json)?;
        ok += file_ok;
        refused += file_refused;
    }
    eprintln!(
        "checked {} lines in {} file(s): {ok} pass, {refused} refused (stateless rules only: senders, ids and requests are checked by the judge)",
        ok + refused,
        files.len()
    );
    Ok(if refused > 0 { REFUSED } else { OK })
}

fn check_file(path: &Path, max_line_bytes: usize, json: bool) -> anyhow::Result<(u64, u64)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let owner = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(inbox_name)
        .map(str::to_owned);
    let limits = Limits { max_line_bytes };
    let (mut ok, mut refused, mut number) = (0u64, 0u64, 0u64);
    let mut out = std::io::stdout().lock();
    let end = LineReader::new(max_line_bytes).read(&file, 0, |line| -> anyhow::Result<()> {
        number += 1;
        let offset = line.offset();
        let verdict = match line {
            Line::TooLong { len, .. } => Err(Refusal::new(
                RefusalReason::LineTooLong,
                format!("{len} bytes, the limit is {max_line_bytes}"),
            )),
            Line::Complete { bytes, .. } => {
                judge_stateless(bytes, owner.as_deref(), &limits).map(|_| ())
            }
        };
        match &verdict {
            Ok(()) => ok += 1,
            Err(_) => refused += 1,
        }
        let text = match (&verdict, json) {
            (verdict, true) => {
                let (word, reason, detail) = match verdict {
                    Ok(()) => ("pass", None, None),
                    Err(r) => ("refused", Some(r.reason.code()), Some(r.detail.as_str())),
                };
                format!(
                    "{}\n",
                    serde_json::json!({
                        "file": path.display().to_string(), "line": number, "offset": offset,
                        "verdict": word, "reason": reason, "detail": detail,
                    })
                )
            }
            (Err(refusal), false) => format!(
                "{}:{number}: byte {offset}: {}: {}\n",
                path.display(),
                refusal.reason,
                crate::output::printable(&refusal.detail)
            ),
            (Ok(()), false) => String::new(),
        };
        std::io::Write::write_all(&mut out, text.as_bytes()).context("writing to stdout")?;
        Ok(())
    })?;
    let len = file.metadata().map_or(end, |m| m.len());
    if len > end {
        eprintln!(
            "{}: {} bytes at the end are a partial line (no newline yet); not judged",
            path.display(),
            len - end
        );
    }
    Ok((ok, refused))
}
