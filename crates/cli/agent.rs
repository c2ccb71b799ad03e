//! `doorbell agent add` and `doorbell agent list`: stations, loops and their inboxes.

use doorbell_core::BUILTIN_LOOPS;

use crate::exit::OK;
use crate::session::Session;

pub fn add(session: &Session, name: &str) -> anyhow::Result<i32> {
    let bridge = session.bridge_or_create()?;
    let path = bridge.add_agent(name)?;
    out!("{}", path.display())?;
    Ok(OK)
}

pub fn list(session: &Session, json: bool) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let inboxes = bridge.inboxes()?;
    let mut stations: Vec<(String, bool)> = inboxes.iter().map(|n| (n.clone(), true)).collect();
    for agent in &session.config.agents {
        if !inboxes.contains(&agent.name) {
            stations.push((agent.name.clone(), false));
        }
    }
    stations.sort();
    let refused = bridge.refused_inboxes()?;
    let human = &session.config.human;
    let mut warnings = Vec::new();
    if !inboxes.contains(human) {
        warnings.push(format!(
            "the human station '{human}' has no inbox: escalations and reports have nowhere to go (doorbell agent add {human})"
        ));
    }
    for (name, has_inbox) in &stations {
        if !has_inbox {
            warnings.push(format!(
                "agent '{name}' is in the config but has no inbox (doorbell agent add {name})"
            ));
        }
    }
    for path in &refused {
        warnings.push(format!(
            "{} is not a regular file and is refused",
            path.display()
        ));
    }
    if json {
        let doc = serde_json::json!({
            "dir": bridge.dir().display().to_string(),
            "stations": stations.iter().map(|(name, has_inbox)| serde_json::json!({
                "name": name,
                "inbox": has_inbox.then(|| bridge.inbox_path(name).ok().map(|p| p.display().to_string())).flatten(),
            })).collect::<Vec<_>>(),
            "loops": session.config.loops,
            "loopOwners": session.config.loop_owners,
            "builtinLoops": BUILTIN_LOOPS,
            "warnings": warnings,
        });
        out!("{doc}")?;
        return Ok(OK);
    }
    out!("bridge {}", bridge.dir().display())?;
    out!("stations:")?;
    for (name, has_inbox) in &stations {
        let note = if *has_inbox { "" } else { "  (no inbox)" };
        out!("  {name}{note}")?;
    }
    if !session.config.loops.is_empty() {
        out!("loops:")?;
        for name in &session.config.loops {
            match session.config.loop_owners.get(name) {
                Some(owner) => out!("  {name}  (asks; {owner} answers for it)")?,
                None => out!("  {name}  (notes only)")?,
            }
        }
    }
    out!("built-in loops: {}", BUILTIN_LOOPS.join(", "))?;
    for warning in &warnings {
        eprintln!("warning: {warning}");
    }
    Ok(OK)
}
