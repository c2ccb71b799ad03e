//! The morning report: what is stuck and who owes whom, in one line a person can act on,
//! then the detail. Pure: built from the ledger's requests and the window's activity, at the
//! time it is asked for; rendered as markdown (files), text (terminals) or JSON (machines).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Local, SecondsFormat, Utc};
use serde::Serialize;

use crate::debts::span;
use crate::ledger::Request;
use crate::{Kind, State};

/// What happened in the window, counted from the journal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    /// Accepted messages per sender and kind.
    pub sent: BTreeMap<String, BTreeMap<Kind, u64>>,
    /// Refused lines per reason code.
    pub refused: BTreeMap<String, u64>,
}

/// What the report is built from.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub requests: Vec<&'a Request>,
    pub activity: Activity,
    /// The first line of each request's text, by id, where it could be read.
    pub texts: BTreeMap<String, String>,
    pub since: DateTime<Utc>,
    pub now: DateTime<Utc>,
    pub stalled_after: Duration,
    pub human: String,
}

/// One stalled request, or one question waiting on the human.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stalled {
    pub id: String,
    pub debtor: String,
    /// Who waits for the debtor: the requester, or in `input-required` the addressee.
    pub waiting: String,
    pub state: String,
    pub silent_since: String,
    /// Seconds since the state last changed.
    pub silent_for: i64,
    pub rings: u32,
    pub text: String,
}

/// Sent messages of one agent in the window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub requests: u64,
    pub responses: u64,
    pub notes: u64,
}

/// The report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub since: String,
    pub until: String,
    pub summary: String,
    /// Stalled debts, grouped by debtor (the debtors ordered by their oldest debt).
    pub stalled: Vec<(String, Vec<Stalled>)>,
    pub waiting_on_human: Vec<Stalled>,
    pub answered: u64,
    /// Seconds from the request being seen to its first terminal state.
    pub median_answer_secs: Option<i64>,
    pub p90_answer_secs: Option<i64>,
    pub per_agent: BTreeMap<String, Counts>,
    pub refused: BTreeMap<String, u64>,
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The value at quantile `q` of sorted `values` (nearest rank).
fn quantile(sorted: &[i64], q: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    #[allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// `n` and the noun for `n` of it: "1 request", "2 requests".
#[must_use]
pub fn plural(n: impl std::fmt::Display, one: &str, many: &str) -> String {
    let n = n.to_string();
    let noun = if n == "1" { one } else { many };
    format!("{n} {noun}")
}

/// Build the report.
#[must_use]
pub fn build(inputs: &Inputs<'_>) -> Report {
    let now = inputs.now;
    let stalled_after =
        chrono::Duration::from_std(inputs.stalled_after).unwrap_or(chrono::Duration::MAX);
    let item = |r: &Request| Stalled {
        id: r.id.clone(),
        debtor: r.debtor_station().to_owned(),
        waiting: r.creditor().to_owned(),
        state: r.state.as_str().to_owned(),
        silent_since: rfc(r.state_since),
        silent_for: (now - r.state_since).num_seconds().max(0),
        rings: r.rings,
        text: inputs.texts.get(&r.id).cloned().unwrap_or_default(),
    };
    let mut open: Vec<&Request> = inputs
        .requests
        .iter()
        .copied()
        .filter(|r| r.is_open())
        .collect();
    open.sort_by(|a, b| (a.state_since, &a.id).cmp(&(b.state_since, &b.id)));
    let mut by_debtor: Vec<(String, Vec<Stalled>)> = Vec::new();
    let mut waiting_on_human = Vec::new();
    for request in open {
        if request.debtor_station() == inputs.human {
            waiting_on_human.push(item(request));
        } else if now - request.state_since >= stalled_after {
            let debtor = request.debtor_station();
            match by_debtor.iter_mut().find(|(d, _)| d == debtor) {
                Some((_, items)) => items.push(item(request)),
                None => by_debtor.push((debtor.to_owned(), vec![item(request)])),
            }
        }
    }
    // Answered: completed, failed or rejected. A withdrawn (canceled) request was never answered.
    let mut times: Vec<i64> = inputs
        .requests
        .iter()
        .filter_map(|r| {
            r.closed_at
                .filter(|c| r.state != State::Canceled && *c >= inputs.since && *c <= now)
                .map(|c| (c - r.seen_at).num_seconds())
        })
        .collect();
    times.sort_unstable();
    let per_agent = inputs
        .activity
        .sent
        .iter()
        .filter(|(agent, _)| !crate::name::is_builtin_loop(agent))
        .map(|(agent, kinds)| {
            let n = |k| kinds.get(&k).copied().unwrap_or(0);
            (
                agent.clone(),
                Counts {
                    requests: n(Kind::Request),
                    responses: n(Kind::Response),
                    notes: n(Kind::Note),
                },
            )
        })
        .collect();
    let summary = summary_line(&by_debtor, waiting_on_human.len(), now);
    Report {
        since: rfc(inputs.since),
        until: rfc(now),
        summary,
        stalled: by_debtor,
        waiting_on_human,
        answered: times.len() as u64,
        median_answer_secs: quantile(&times, 0.5),
        p90_answer_secs: quantile(&times, 0.9),
        per_agent,
        refused: inputs.activity.refused.clone(),
    }
}

/// The one line a person can act on: "3 requests stalled, oldest 2 d 4 h; web owes 2,
/// design owes 1; 1 question waits on you".
fn summary_line(
    by_debtor: &[(String, Vec<Stalled>)],
    waiting: usize,
    now: DateTime<Utc>,
) -> String {
    let stalled_count: usize = by_debtor.iter().map(|(_, items)| items.len()).sum();
    let oldest = by_debtor
        .iter()
        .flat_map(|(_, items)| items)
        .map(|s| s.silent_for)
        .max();
    let mut summary = if stalled_count == 0 {
        "nothing stalled".to_owned()
    } else {
        format!(
            "{} stalled, oldest {}",
            plural(stalled_count, "request", "requests"),
            span(now - chrono::Duration::seconds(oldest.unwrap_or(0)), now)
        )
    };
    if !by_debtor.is_empty() {
        let owes: Vec<String> = by_debtor
            .iter()
            .map(|(d, items)| format!("{d} owes {}", items.len()))
            .collect();
        let _ = write!(summary, "; {}", owes.join(", "));
    }
    match waiting {
        0 => {}
        1 => summary.push_str("; 1 question waits on you"),
        n => {
            let _ = write!(summary, "; {n} questions wait on you");
        }
    }
    summary
}

fn duration(secs: Option<i64>) -> String {
    secs.map_or_else(
        || "-".to_owned(),
        |s| {
            span(
                DateTime::UNIX_EPOCH,
                DateTime::UNIX_EPOCH + chrono::Duration::seconds(s),
            )
        },
    )
}

/// A time for a person, in the local zone: with its year when that is not this year's (a
/// window from 1970, a report read in January).
fn local(t: &str) -> String {
    use chrono::Datelike;
    DateTime::parse_from_rfc3339(t).map_or_else(
        |_| t.to_owned(),
        |t| {
            let t = t.with_timezone(&Local);
            let format = if t.year() == Local::now().year() {
                "%a %-d %b %H:%M"
            } else {
                "%a %-d %b %Y %H:%M"
            };
            t.format(format).to_string()
        },
    )
}

/// The most of a message's first line a report shows, in characters.
const SHOWN_CHARS: usize = 120;

/// Text safe for a terminal and for a model's context: control characters other than newline
/// and tab become escapes, and so does every character that shows nothing: the marks that
/// reorder text shown right to left (a message could make its own text, or the line around
/// it, read otherwise than it is), the Unicode line separators, and Unicode's default-
/// ignorable characters (zero-width ones, fillers, tags and variation selectors: text a
/// person does not see and a model reads, as a sentence spelled in selectors after an
/// emoji). One presentation selector (U+FE0E, U+FE0F) right after the character it
/// selects for stays: it is how emoji are written. The backslashes of a run that ends before
/// `u{` or before an escaped character are doubled, so an odd count before `u{` is always an
/// escape and an even one always the text's own.
#[must_use]
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut before = None;
    // Whether the run of backslashes being written is doubled: decided once for the run.
    let mut doubled = None;
    for (at, c) in text.char_indices() {
        if c == '\\' {
            let double = *doubled.get_or_insert_with(|| {
                let rest = text[at..].trim_start_matches('\\');
                rest.starts_with("u{")
                    || rest.chars().next().is_some_and(|n| escaped(n, Some('\\')))
            });
            out.push_str(if double { "\\\\" } else { "\\" });
            before = Some(c);
            continue;
        }
        doubled = None;
        if escaped(c, before) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
        before = Some(c);
    }
    out
}

/// Whether [`printable`] escapes `c`, the character `before` it in the text.
fn escaped(c: char, before: Option<char>) -> bool {
    match c {
        '\n' | '\t' => false,
        // Emoji presentation: one selector, right after a character that is shown.
        '\u{fe0e}' | '\u{fe0f}' => !before.is_some_and(|b| !escaped(b, None) && !selector(b)),
        c => c.is_control() || invisible(c),
    }
}

/// A variation selector.
fn selector(c: char) -> bool {
    matches!(c, '\u{180b}'..='\u{180d}' | '\u{180f}' | '\u{fe00}'..='\u{fe0f}' | '\u{e0100}'..='\u{e01ef}')
}

/// Characters that show nothing: Unicode's `Default_Ignorable_Code_Point` set, the format
/// characters outside it (the Arabic letter mark is inside), the line and paragraph
/// separators, the interlinear annotation marks and the Egyptian hieroglyph format controls.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{34f}'
            | '\u{61c}'
            | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fffb}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// A message's first line as a report shows it: [`printable`] (a text is never an
/// instruction to the terminal either), cut at [`SHOWN_CHARS`].
fn shown(text: &str) -> String {
    let mut cut: String = text.chars().take(SHOWN_CHARS).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    printable(&cut)
}

/// A table cell: no pipes or line breaks.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

impl Report {
    /// Markdown for files: the summary first, then the tables.
    #[must_use]
    pub fn markdown(&self, title: &str) -> String {
        let mut out = format!("# {title}\n\n**{}**\n\n", self.summary);
        let _ = writeln!(
            out,
            "Window: {} to {}.\n",
            local(&self.since),
            local(&self.until)
        );
        out.push_str("## Stalled requests\n\n");
        if self.stalled.is_empty() {
            out.push_str("None.\n\n");
        }
        for (debtor, items) in &self.stalled {
            let _ = writeln!(out, "### {debtor} owes {}\n", items.len());
            out.push_str("| request | waiting | state | silent since | rings | text |\n|---|---|---|---|---|---|\n");
            for s in items {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} ({}) | {} | {} |",
                    s.id,
                    s.waiting,
                    s.state,
                    local(&s.silent_since),
                    duration(Some(s.silent_for)),
                    s.rings,
                    cell(&shown(&s.text))
                );
            }
            out.push('\n');
        }
        out.push_str("## Waiting on you\n\n");
        if self.waiting_on_human.is_empty() {
            out.push_str("Nothing.\n\n");
        } else {
            out.push_str("| request | from | state | since | text |\n|---|---|---|---|---|\n");
            for s in &self.waiting_on_human {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} |",
                    s.id,
                    s.waiting,
                    s.state,
                    local(&s.silent_since),
                    cell(&shown(&s.text))
                );
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "## Answered\n\n{} answered in the window; time to answer: median {}, p90 {}.\n",
            self.answered,
            duration(self.median_answer_secs),
            duration(self.p90_answer_secs)
        );
        out.push_str("## Messages per agent\n\n| agent | requests | responses | notes |\n|---|---|---|---|\n");
        for (agent, c) in &self.per_agent {
            let _ = writeln!(
                out,
                "| {agent} | {} | {} | {} |",
                c.requests, c.responses, c.notes
            );
        }
        out.push_str("\n## Refused lines\n\n");
        if self.refused.is_empty() {
            out.push_str("None.\n");
        } else {
            out.push_str("| reason | lines |\n|---|---|\n");
            for (reason, n) in &self.refused {
                let _ = writeln!(out, "| {reason} | {n} |");
            }
        }
        out
    }

    /// Text for a terminal; `colour` makes the summary and headings stand out.
    #[must_use]
    pub fn text(&self, colour: bool) -> String {
        let (bold, reset) = if colour {
            ("\x1b[1m", "\x1b[0m")
        } else {
            ("", "")
        };
        let mut out = format!("{bold}{}{reset}\n", self.summary);
        let _ = writeln!(
            out,
            "window: {} to {}",
            local(&self.since),
            local(&self.until)
        );
        for (debtor, items) in &self.stalled {
            let _ = writeln!(out, "\n{bold}{debtor} owes {}{reset}", items.len());
            for s in items {
                let _ = writeln!(
                    out,
                    "  {}  owed to {}  {}  silent {}  rings {}  {}",
                    s.id,
                    s.waiting,
                    s.state,
                    duration(Some(s.silent_for)),
                    s.rings,
                    shown(&s.text)
                );
            }
        }
        if !self.waiting_on_human.is_empty() {
            let _ = writeln!(out, "\n{bold}waiting on you{reset}");
            for s in &self.waiting_on_human {
                let _ = writeln!(
                    out,
                    "  {}  from {}  {}  since {}  {}",
                    s.id,
                    s.waiting,
                    s.state,
                    local(&s.silent_since),
                    shown(&s.text)
                );
            }
        }
        let _ = writeln!(
            out,
            "\nanswered: {} (median {}, p90 {})",
            self.answered,
            duration(self.median_answer_secs),
            duration(self.p90_answer_secs)
        );
        for (agent, c) in &self.per_agent {
            let _ = writeln!(
                out,
                "  {agent}: {}, {}, {}",
                plural(c.requests, "request", "requests"),
                plural(c.responses, "response", "responses"),
                plural(c.notes, "note", "notes")
            );
        }
        if !self.refused.is_empty() {
            let by: Vec<String> = self
                .refused
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            let _ = writeln!(out, "refused: {}", by.join(", "));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{invisible, local, printable};

    /// A time of another year says its year; one of this year does not.
    #[test]
    fn a_time_of_another_year_says_it() {
        let old = local("1970-01-02T12:00:00Z");
        assert!(old.contains("1970"), "{old}");
        let now = chrono::Utc::now();
        let this_year = now.format("%Y").to_string();
        let shown = local(&now.to_rfc3339());
        assert!(!shown.contains(&this_year), "{shown}");
    }

    #[test]
    fn an_escaped_mark_never_reads_like_text_and_text_never_like_an_escaped_mark() {
        assert_eq!(printable("pay \u{202e}01$"), r"pay \u{202e}01$");
        assert_eq!(printable(r"pay \u{202e}01$"), r"pay \\u{202e}01$");
        // Other backslashes stay as written: paths, regexes, `\n` in code.
        assert_eq!(printable(r"C:\tmp \d+ \n \u"), r"C:\tmp \d+ \n \u");
        assert_eq!(printable("bell\u{7}\n"), "bell\\u{7}\n");
    }

    /// Nothing that shows nothing reaches a reader raw (a sentence spelled in variation
    /// selectors, fillers, a soft hyphen, shorthand and musical format controls), while an
    /// emoji keeps its one presentation selector.
    #[test]
    fn every_character_that_shows_nothing_is_escaped() {
        let smuggled: String = "hi"
            .bytes()
            .map(|b| char::from_u32(0xE0100 + u32::from(b) - 16).unwrap())
            .collect();
        let text = format!("ok\u{1f600}{smuggled} soft\u{ad}hy \u{1bca0}\u{1d173}\u{3164}\u{fe0f}");
        let shown = printable(&text);
        assert!(shown.chars().all(|c| !invisible(c)), "{shown:?}");
        assert_eq!(
            shown,
            "ok\u{1f600}\\u{e0158}\\u{e0159} soft\\u{ad}hy \\u{1bca0}\\u{1d173}\\u{3164}\\u{fe0f}"
        );
        assert_eq!(printable("love \u{2764}\u{fe0f}"), "love \u{2764}\u{fe0f}");
        assert_eq!(
            printable("\u{2764}\u{fe0f}\u{fe0f}"),
            "\u{2764}\u{fe0f}\\u{fe0f}"
        );
        assert_eq!(printable("\u{fe0f}x"), "\\u{fe0f}x");
    }

    /// A text's own backslash before a character that is escaped is doubled, so a real mark
    /// never reads as the text `\u{…}` (before, `\` then U+202E and the text `\u{202e}`
    /// were shown alike).
    #[test]
    fn a_real_mark_and_its_spelling_never_read_alike() {
        let shown: Vec<String> = [
            "A \u{202e} B",
            "A \\\u{202e} B",
            "A \\u{202e} B",
            "A \\\\u{202e} B",
            "A \\\\\u{202e} B",
        ]
        .iter()
        .map(|t| printable(t))
        .collect();
        assert_eq!(
            shown,
            [
                r"A \u{202e} B",
                r"A \\\u{202e} B",
                r"A \\u{202e} B",
                r"A \\\\u{202e} B",
                r"A \\\\\u{202e} B",
            ]
        );
        let long = "\\".repeat(1 << 20);
        assert_eq!(printable(&long), long, "a long run is looked at once");
    }
}
