//! How messages look to a person: who, kind, state, age in local time, thread, and the text
//! wrapped. Control characters in message text are shown escaped, never sent to the terminal:
//! a message must not be able to move the cursor, recolour or retitle a terminal.

use std::fmt::Write as _;

/// `println!` for a command's output: an error to return (with `?`), so a reader that went
/// away (`doorbell show ID | head -1`) ends the command quietly instead of a panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
    }};
}

/// `print!` for a command's output, as [`out!`].
macro_rules! out_text {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($arg)*)
    }};
}

use chrono::{DateTime, Local, Utc};
use doorbell_core::Envelope;

/// "3 min ago · Sun 29 Nov 21:06" in local time.
pub fn age(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (now - at).num_seconds();
    let ago = match secs {
        s if s < 0 => "in the future".to_owned(),
        s if s < 60 => "just now".to_owned(),
        s if s < 3600 => format!("{} min ago", s / 60),
        s if s < 86_400 => format!("{} h {} min ago", s / 3600, (s % 3600) / 60),
        s => format!("{} d {} h ago", s / 86_400, (s % 86_400) / 3600),
    };
    let local = at.with_timezone(&Local);
    format!("{ago} · {}", local.format("%a %-d %b %H:%M"))
}

pub use doorbell_core::report::printable;

/// Wrap text at `width` columns, keeping the writer's own line breaks, indenting each line.
pub fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    for line in text.split('\n') {
        let mut column = 0;
        out.push_str(indent);
        for word in line.split(' ') {
            let len = word.chars().count();
            if column > 0 && column + 1 + len > width {
                out.push('\n');
                out.push_str(indent);
                column = 0;
            } else if column > 0 {
                out.push(' ');
                column += 1;
            }
            out.push_str(word);
            column += len;
        }
        out.push('\n');
    }
    out
}

/// A message for a person: a header line, then the text. The age is the sender's
/// `createdAt`, which is informative only.
pub fn message(envelope: &Envelope<'_>, now: DateTime<Utc>) -> String {
    let mut head = format!("{} {} → {}", envelope.kind, envelope.from, envelope.to);
    if let Some(state) = envelope.state {
        let _ = write!(head, " [{state}]");
    }
    if envelope.priority != 1 {
        let label = ["low", "normal", "high", "critical"][usize::from(envelope.priority.min(3))];
        let _ = write!(head, " priority {label}");
    }
    let _ = write!(head, " · sent {}", age(envelope.created_at, now));
    let mut ids = format!("id {}", envelope.id);
    if let Some(request) = &envelope.correlates_to {
        let _ = write!(ids, " · re {request}");
    }
    let _ = write!(ids, " · thread {}", envelope.thread());
    if let Some(task) = &envelope.task_id {
        let _ = write!(ids, " · task {}", printable(task));
    }
    if let Some(reply_by) = envelope.reply_by {
        let _ = write!(
            ids,
            " · reply by {}",
            reply_by.with_timezone(&Local).format("%a %-d %b %H:%M")
        );
    }
    format!(
        "{head}\n  {ids}\n{}",
        wrap(&printable(&envelope.message.text()), 76, "  ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_controls() {
        assert_eq!(
            printable("a\u{1b}[2Jb\n\tc\u{7}"),
            "a\\u{1b}[2Jb\n\tc\\u{7}"
        );
    }

    #[test]
    fn wraps_words_and_keeps_breaks() {
        assert_eq!(wrap("aaa bbb ccc\nd", 7, "> "), "> aaa bbb\n> ccc\n> d\n");
    }
}
