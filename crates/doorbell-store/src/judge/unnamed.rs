//! Runs of lines that name nobody: blank lines, `1`, `{}`, a stray `echo` — lines refused for
//! what they are alone, with no id and no sender to read in them. Nobody is told of them and
//! nothing looks them up by id, so a run of them, one after another, is one refused fragment
//! with one record: a flood of them must not cost a journal record, a refused-log entry and
//! an index row each, a hundred times their own bytes (DESIGN §9).

use chrono::{DateTime, Utc};
use doorbell_core::{judge_stateless, Limits, Refusal, RefusalReason, Verdict};

use super::record::Bytes;
use super::tail::is_blank;
use super::verdicts::identity_of;
use super::{CatchUp, Judge};
use crate::halves::Parsed;
use crate::journal::LastLine;
use crate::Result;

/// A line that names nobody.
#[derive(Debug)]
pub(super) enum Nameless {
    /// Nothing but white space.
    Blank,
    /// Refused for what it is alone, for this reason.
    Refused(Refusal),
}

/// Lines that name nobody, one after another, not yet recorded: `[start, end)` of the inbox.
#[derive(Debug)]
pub(super) struct Unnamed {
    pub(super) start: u64,
    pub(super) end: u64,
    lines: u64,
    /// The fold of the lines' hashes, as [`LastLine::chained`] folds them: the run can be
    /// known again where it is, line by line, as the lines would be one by one.
    hash: u64,
    /// The first line that is not blank: why it was refused.
    first: Option<Refusal>,
}

impl Unnamed {
    /// Whether the line `bytes` names nobody and is refused for what it is alone, and why.
    /// Such a line is not over-long (an over-long line's sender is read from its head and
    /// told) and claims neither an id nor a sender. Else `None`, and `parsed` holds the
    /// line's stateless judgement (the helpers' or this one).
    pub(super) fn refused<'a>(
        bytes: &'a [u8],
        parsed: &mut Option<Parsed<'a>>,
        owner: &str,
        limits: Limits,
    ) -> Option<Nameless> {
        if is_blank(bytes) {
            return Some(Nameless::Blank);
        }
        match parsed
            .take()
            .unwrap_or_else(|| judge_stateless(bytes, Some(owner), &limits))
        {
            Err(refusal)
                if refusal.reason != RefusalReason::LineTooLong
                    && identity_of(bytes) == (None, None) =>
            {
                Some(Nameless::Refused(refusal))
            }
            judged => {
                *parsed = Some(judged);
                None
            }
        }
    }

    /// Add the line `bytes` at `offset`, which names nobody, to `run` when it goes on from
    /// there. Otherwise the line starts a run of its own, and the run it does not go on is
    /// returned, to be recorded first.
    pub(super) fn join(
        run: &mut Option<Unnamed>,
        offset: u64,
        bytes: &[u8],
        line: Nameless,
    ) -> Option<Unnamed> {
        let refusal = match line {
            Nameless::Blank => None,
            Nameless::Refused(refusal) => Some(refusal),
        };
        let end = offset + bytes.len() as u64 + 1;
        let hash = xxhash_rust::xxh3::xxh3_64(bytes);
        if let Some(run) = run.as_mut().filter(|run| run.end == offset) {
            run.end = end;
            run.lines += 1;
            run.hash = LastLine::chained(run.hash, hash);
            if run.first.is_none() {
                run.first = refusal;
            }
            return None;
        }
        run.replace(Unnamed {
            start: offset,
            end,
            lines: 1,
            hash,
            first: refusal,
        })
    }
}

impl Judge {
    /// Record a run of lines that name nobody with one verdict: `bad-json` for blank lines
    /// alone, else the first other line's reason, its detail saying how many lines and bytes
    /// the run holds (a run of one line is recorded as any refused line is).
    pub(super) fn refuse_unnamed(
        &mut self,
        name: &str,
        gen: u32,
        run: Option<Unnamed>,
        now: DateTime<Utc>,
        stats: &mut CatchUp,
    ) -> Result<()> {
        let Some(Unnamed {
            start,
            end,
            lines,
            hash,
            first,
        }) = run
        else {
            return Ok(());
        };
        let span = end - start;
        let refusal = match first {
            Some(only) if lines == 1 => only,
            Some(first) => {
                let detail = format!(
                    "{lines} lines in a row that name no sender ({span} bytes), the first refused: {}",
                    first.detail
                );
                Refusal::new(first.reason, detail)
            }
            None if span == 1 => Refusal::new(RefusalReason::BadJson, "blank line".to_owned()),
            None => Refusal::new(
                RefusalReason::BadJson,
                format!("blank lines ({span} bytes)"),
            ),
        };
        self.record(
            name,
            gen,
            start,
            span,
            Bytes::Run { hash, lines },
            &Verdict::Refused(refusal),
            None,
            None,
            now,
            stats,
        )
    }
}
