//! `doorbell status`: per agent, what is unread, what it owes and is owed, and when something
//! last arrived; whether a judge is running; how many lines were refused; and warnings a
//! person should act on.

use anyhow::Context as _;
use chrono::Utc;
use doorbell_store::board::{self, Status};

use crate::args::{StatusArgs, StatusFormat};
use crate::exit::OK;
use crate::session::Session;

pub fn run(session: &Session, args: &StatusArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let (mut view, stopped) = doorbell_store::View::open_or_as_journaled(&bridge)
        .context("catching up with the inboxes")?;
    if let Some(error) = stopped {
        // The warnings below say what it means; the cause is said once, here.
        eprintln!(
            "doorbell: the catch-up could not write ({error}): showing what was judged before it"
        );
    }
    if args.format == Some(StatusFormat::Markdown) {
        out_text!("{}", board::markdown(&mut view, Utc::now())?)?;
        return Ok(OK);
    }
    let status = board::status(&mut view)?;
    if args.json || args.format == Some(StatusFormat::Json) {
        out!("{}", serde_json::to_string(&status)?)?;
        return Ok(OK);
    }
    print_text(&status)?;
    Ok(OK)
}

fn print_text(status: &Status) -> std::io::Result<()> {
    out!("bridge {}", status.dir)?;
    out!("judge: {}", status.judge)?;
    out!(
        "{:<20} {:>7} {:>5} {:>8}  last message",
        "agent",
        "unread",
        "owes",
        "is owed"
    )?;
    let now = Utc::now();
    for agent in &status.agents {
        let last = agent
            .last_activity_at()
            .map_or_else(|| "-".to_owned(), |t| crate::output::age(t, now));
        let name = agent.label();
        out!(
            "{name:<20} {:>7} {:>5} {:>8}  {last}",
            agent.unread,
            agent.owes,
            agent.is_owed
        )?;
    }
    if status.refused > 0 {
        let by: Vec<String> = status
            .refused_by_reason
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        out!("refused lines: {} ({})", status.refused, by.join(", "))?;
    } else {
        out!("refused lines: 0")?;
    }
    for warning in &status.warnings {
        // A file's name, a far bridge's error: text from elsewhere, safe for a terminal.
        eprintln!("warning: {}", crate::output::printable(warning));
    }
    Ok(())
}
