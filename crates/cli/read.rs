//! `doorbell read`: the accepted messages past an agent's cursor, then the cursor moves to
//! where judging stopped. It never shows a line the journal has not accepted, never a partial
//! line, and never moves the cursor past a line the judge has not judged. `watch` prints
//! through the same function.

use std::fs::File;
use std::io::Write;

use anyhow::Context;
use chrono::Utc;
use doorbell_store::append::open_inbox;
use doorbell_store::cursor::{self, Position};
use doorbell_store::view::InboxView;
use serde_json::value::RawValue;

use crate::args::ReadArgs;
use crate::exit::OK;
use crate::output;
use crate::session::{view, Session};

/// One message of `--json` output: where it is, its verdict, and the envelope exactly as
/// written.
#[derive(serde::Serialize)]
pub struct JsonMessage<'a> {
    pub inbox: &'a str,
    pub offset: u64,
    pub verdict: &'a str,
    pub envelope: &'a RawValue,
}

pub use doorbell_store::view::json_line;

/// How printing ended.
pub enum Printed {
    /// Everything accepted up to this offset was written and flushed: this many messages,
    /// and how many accepted ones past it were left for lack of room.
    Upto(u64, usize, usize),
    /// The reader of our output went away.
    ClosedPipe,
}

enum Stop {
    ClosedPipe,
    Failed(anyhow::Error),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        Stop::Failed(e.into())
    }
}

/// An agent's open inbox file.
pub struct Inbox<'a> {
    pub agent: &'a str,
    pub file: &'a File,
}

/// Print the accepted lines of `inbox` (which `journal` describes) from `from` up to where
/// judging stopped; with `room`, only the messages that fit in that many characters (UTF-16
/// code units; the first always), the rest counted and left unread.
pub fn print_accepted(
    inbox: &Inbox<'_>,
    journal: &mut InboxView,
    from: u64,
    json: bool,
    room: Option<usize>,
    out: &mut impl Write,
) -> anyhow::Result<Printed> {
    let Inbox { agent, file, .. } = *inbox;
    let now = Utc::now();
    let mut count = 0;
    let mut used = 0;
    // Where the first message with no room starts, and how many are left from there.
    let mut full: Option<u64> = None;
    let mut left = 0;
    let result =
        journal.accepted_messages(file, from, |offset, bytes, envelope| -> Result<(), Stop> {
            if full.is_some() {
                left += 1;
                return Ok(());
            }
            let text = if json {
                json_line(agent, offset, bytes).map_err(|e| Stop::Failed(e.into()))?
            } else {
                format!("{}\n", output::message(&envelope, now))
            };
            // Counted only where room is kept (a hook's output): `watch` prints every line.
            // In the harnesses' unit, UTF-16 code units: Claude Code keeps 30,000 of a shell
            // tool's output, and an emoji counts two.
            let chars = room.map_or(0, |_| text.encode_utf16().count());
            if count > 0 && room.is_some_and(|room| used + chars > room) {
                full = Some(offset);
                left = 1;
                return Ok(());
            }
            used += chars;
            count += 1;
            match out.write_all(text.as_bytes()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Stop::ClosedPipe),
                other => Ok(other?),
            }
        });
    let upto = match result {
        Ok(upto) => full.unwrap_or(upto),
        Err(Stop::ClosedPipe) => return Ok(Printed::ClosedPipe),
        Err(Stop::Failed(e)) => return Err(e),
    };
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Printed::ClosedPipe),
        Err(e) => Err(e).context("writing to stdout"),
        Ok(()) => Ok(Printed::Upto(upto, count, left)),
    }
}

pub fn run(session: &Session, args: &ReadArgs) -> anyhow::Result<i32> {
    if args.wait {
        if args.peek || args.all {
            return Err(crate::exit::refused(
                "--wait reads what is unread and moves the cursor: it cannot go with --peek or --all",
            ));
        }
        let timeout = doorbell_core::duration::parse_duration(&args.timeout)
            .map_err(|e| crate::exit::refused(format!("--timeout: {e}")))?;
        let until = crate::watch::Until::FirstMessages(std::time::Instant::now() + timeout);
        return crate::watch::follow(session, &args.agent, args.json, until, "read");
    }
    let bridge = session.bridge()?;
    let path = bridge.require_inbox(&args.agent)?;
    // From the cursor's load to its move, no other reader of this agent runs; one that stays
    // in its turn (a paused watch) is named rather than waited for without end. The judge's
    // picture is taken once the turn is ours: one taken before the wait can be of bytes the
    // inbox no longer holds.
    let _reading = (!args.peek)
        .then(|| cursor::reading_within(&bridge, &args.agent, cursor::READER_WAIT))
        .transpose()?;
    let view = view(&bridge)?;
    let inbox = open_inbox(&path, false)?;
    let meta = inbox.metadata().context("stat inbox")?;
    let position = cursor::load(&bridge, &args.agent, &inbox)?;
    warn_replaced(&args.agent, position);
    let from = if args.all { 0 } else { position.offset() };
    let Some(mut journal) = view.inbox_of(&args.agent, from, &inbox, &meta)? else {
        // The judge has not seen this file yet: nothing in it is accepted.
        return Ok(OK);
    };
    let mut out = std::io::stdout().lock();
    let reading = Inbox {
        agent: &args.agent,
        file: &inbox,
    };
    let printed = print_accepted(
        &reading,
        &mut journal,
        from,
        args.json,
        args.max_chars,
        &mut out,
    )?;
    if let Printed::Upto(to, _, left) = printed {
        if to > position.offset() && !args.peek {
            cursor::advance(&bridge, &args.agent, &inbox, to, "read")?;
        }
        if left > 0 {
            let left = doorbell_core::report::plural(left, "more message is", "more messages are");
            let room = args.max_chars.unwrap_or_default();
            // Running it again shows the rest only when this read moved the cursor.
            let more = if args.peek || args.all {
                format!("{left} not shown here, past --max-chars {room}.")
            } else {
                // Named as the hook names it: the binary, `--config` and `--dir` as run.
                format!(
                    "{left} not shown here, for room: run `{} read {} --max-chars {room}` again.",
                    session.program(),
                    args.agent
                )
            };
            // JSON output stays one message per line.
            if args.json {
                eprintln!("doorbell: {more}");
            } else {
                let _ = writeln!(out, "{more}");
            }
        }
    }
    Ok(OK)
}

/// Say so when a cursor was not trusted.
pub fn warn_replaced(agent: &str, position: Position) {
    if let Position::Replaced { stale_offset } = position {
        eprintln!(
            "doorbell: {agent}'s inbox was replaced or truncated since the cursor was saved (at byte {stale_offset}); reading it from the start"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `--json` printed before lines went in unparsed: the record serialised with the
    /// line as a `RawValue`.
    fn through_raw_value(agent: &str, offset: u64, line: &[u8]) -> String {
        let raw: &RawValue =
            serde_json::from_slice(line.strip_suffix(b"\r").unwrap_or(line)).unwrap();
        let record = JsonMessage {
            inbox: agent,
            offset,
            verdict: "accepted",
            envelope: raw,
        };
        serde_json::to_string(&record).unwrap() + "\n"
    }

    #[test]
    fn a_json_line_is_the_record_a_raw_value_made() {
        let lines: [&[u8]; 5] = [
            br#"{"id":"01A","from":"design","to":"web","kind":"note","message":{"role":"agent","parts":[{"type":"text","text":"hi"}]}}"#,
            b"{\"id\":\"01B\",\"text\":\"caf\xc3\xa9 \\u00e9 \\\" \\n \xf0\x9f\x94\x94\"}\r",
            b"  \t{\"id\":\"01C\"}  ",
            b"{ \"id\" : \"01D\" , \"n\" : [ 1 , 2 ] }",
            b"{\"id\":\"01E\"}\t\r",
        ];
        for line in lines {
            let text = json_line("web-2", 1234, line).unwrap();
            assert_eq!(text, through_raw_value("web-2", 1234, line), "{line:?}");
            let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(parsed["inbox"], "web-2");
        }
        assert!(
            json_line("web", 0, b"{\"id\":\"\xff\"}").is_err(),
            "not UTF-8"
        );
    }
}
