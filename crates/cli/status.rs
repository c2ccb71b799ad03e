//! `doorbell status`: per agent, what is unread, what it owes and is owed, and when something
//! last arrived; whether a judge is running; how many lines were refused; and warnings a
//! person should act on.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use serde::Serialize;

use crate::args::StatusArgs;
use crate::exit::OK;
use crate::session::Session;

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct AgentStatus {
    name: String,
    has_inbox: bool,
    unread: u64,
    owes: u64,
    is_owed: u64,
    last_activity: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    dir: String,
    judge: String,
    judge_running: bool,
    agents: Vec<AgentStatus>,
    refused: u64,
    refused_by_reason: BTreeMap<String, u64>,
    warnings: Vec<String>,
}

pub fn run(session: &Session, args: &StatusArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let mut view = crate::session::view(&bridge)?;
    let judge = view.judge().map(str::to_owned);
    let debts = view.debts()?;
    let inboxes = bridge.inboxes()?;
    let mut agents: BTreeMap<String, AgentStatus> = BTreeMap::new();
    for name in inboxes
        .iter()
        .chain(session.config.agents.iter().map(|a| &a.name))
    {
        agents.entry(name.clone()).or_insert_with(|| AgentStatus {
            name: name.clone(),
            has_inbox: inboxes.contains(name),
            ..AgentStatus::default()
        });
    }
    for debt in &debts {
        if let Some(agent) = agents.get_mut(debt.debtor_station()) {
            agent.owes += 1;
        }
        if let Some(agent) = agents.get_mut(debt.creditor_station()) {
            agent.is_owed += 1;
        }
    }
    for agent in agents.values_mut().filter(|a| a.has_inbox) {
        if let Some(journal) = view.inboxes().get(&agent.name) {
            agent.unread = view.unread(&agent.name)?;
            agent.last_activity = DateTime::from_timestamp_millis(journal.last_accepted_at)
                .filter(|_| journal.last_accepted_at > 0)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        }
    }
    let mut warnings = Vec::new();
    let human = &session.config.human;
    if !inboxes.contains(human) {
        warnings.push(format!(
            "the human station '{human}' has no inbox: escalations and reports have nowhere to go (doorbell agent add {human})"
        ));
    }
    for agent in agents.values().filter(|a| !a.has_inbox) {
        warnings.push(format!(
            "agent '{}' is in the config but has no inbox (doorbell agent add {})",
            agent.name, agent.name
        ));
    }
    for path in bridge.refused_inboxes()? {
        warnings.push(format!(
            "{} is not a regular file and is refused",
            path.display()
        ));
    }
    if judge.is_none() {
        warnings.push("no daemon is running: messages are judged only when a command runs (doorbell daemon, or scripts/install)".to_owned());
    }
    let status = Status {
        dir: bridge.dir().display().to_string(),
        judge_running: judge.is_some(),
        judge: judge.unwrap_or_else(|| "none running".to_owned()),
        agents: agents.into_values().collect(),
        refused: view.refused().values().sum(),
        refused_by_reason: view
            .refused()
            .iter()
            .map(|(r, n)| (r.code().to_owned(), *n))
            .collect(),
        warnings,
    };
    if args.json {
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
            .last_activity
            .as_deref()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map_or_else(
                || "-".to_owned(),
                |t| crate::output::age(t.with_timezone(&Utc), now),
            );
        let name = if agent.has_inbox {
            agent.name.clone()
        } else {
            format!("{} (no inbox)", agent.name)
        };
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
        eprintln!("warning: {warning}");
    }
    Ok(())
}
