//! The bridge at a glance: per station what is unread, what it owes and is owed, and when
//! something last arrived; whether a judge runs; refusals; warnings a person should act on
//! (`doorbell status`). And the board (seed 002): the same as markdown, with the stalled
//! debts oldest first, what waits on the human and today's refusals, kept in
//! `<bridge>/STATUS.md` by a daemon whose config says `board = true`, for a person who walks
//! up to the folder. The board is replaced atomically and written only after the bridge
//! changed, never on an idle bridge.

use doorbell_core::report::{plural, printable};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use chrono::{DateTime, Local, SecondsFormat, TimeZone, Utc};
use doorbell_core::Request;
use serde::Serialize;

use crate::bridge::Stray;
use crate::{Bridge, Error, Result, View};

/// The board's file, in the bridge folder.
pub const BOARD_FILE: &str = "STATUS.md";

#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub name: String,
    pub has_inbox: bool,
    pub unread: u64,
    pub owes: u64,
    pub is_owed: u64,
    pub last_activity: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub dir: String,
    pub judge: String,
    pub judge_running: bool,
    pub agents: Vec<AgentStatus>,
    pub refused: u64,
    pub refused_by_reason: BTreeMap<String, u64>,
    pub warnings: Vec<String>,
}

impl AgentStatus {
    /// When the judge last accepted a line in the station's inbox.
    #[must_use]
    pub fn last_activity_at(&self) -> Option<DateTime<Utc>> {
        let at = DateTime::parse_from_rfc3339(self.last_activity.as_deref()?).ok()?;
        Some(at.with_timezone(&Utc))
    }

    /// The station's name, and that it has no inbox when it has none.
    #[must_use]
    pub fn label(&self) -> String {
        if self.has_inbox {
            self.name.clone()
        } else {
            format!("{} (no inbox)", self.name)
        }
    }
}

/// What the daemon's forwarder last said of remote `name`: `.doorbell/remote-<name>.json`.
fn remote_state(bridge: &crate::Bridge, name: &str) -> Option<serde_json::Value> {
    let path = bridge
        .dir()
        .join(crate::bridge::STATE_DIR)
        .join(format!("remote-{name}.json"));
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// How many lines remote `name`'s bridge refused, and the last, when it refused any.
fn refused_by_remote(bridge: &crate::Bridge, name: &str) -> Option<(u64, String)> {
    let state = remote_state(bridge, name)?;
    let n = state["refused"].as_u64().filter(|n| *n > 0)?;
    Some((n, state["last_refused"].as_str().unwrap_or("?").to_owned()))
}

/// How many answers from remote `name`'s station could not be taken here, and the last.
fn not_taken_from_remote(bridge: &crate::Bridge, name: &str) -> Option<(u64, String)> {
    let state = remote_state(bridge, name)?;
    let n = state["not_taken"].as_u64().filter(|n| *n > 0)?;
    Some((
        n,
        state["last_not_taken"].as_str().unwrap_or("?").to_owned(),
    ))
}

/// Why the daemon's forwarder cannot reach remote `name`, and since when, when it cannot.
fn unreachable(bridge: &crate::Bridge, name: &str) -> Option<String> {
    let state = remote_state(bridge, name)?;
    if state["reachable"] != false {
        return None;
    }
    Some(format!(
        "since {}: {}",
        state["at"].as_str().unwrap_or("?"),
        state["error"].as_str().unwrap_or("?")
    ))
}

/// Under this much free space the disk holding the judge's state is full for `status`: a
/// catch-up's batch of records, with the index's save, takes about this much.
const LOW_ROOM: u64 = 8 << 20;

/// The free space and whether it is read-only, of the file system holding `path`.
fn room(path: &Path) -> Option<(u64, bool)> {
    match crate::fault::failing(path) {
        Some(crate::fault::Fault::NoSpace) => return Some((0, false)),
        Some(crate::fault::Fault::ReadOnly) => return Some((0, true)),
        None => {}
    }
    let fs = rustix::fs::statvfs(path).ok()?;
    let free = fs.f_bavail.saturating_mul(fs.f_frsize);
    Some((
        free,
        fs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY),
    ))
}

/// A full or read-only file system under the judge's state: every verdict is journaled
/// before anything acts on it, so judging pauses there (the daemon's log says so, and a
/// paused daemon can write no file to say it): `status` says it, and what it means.
fn no_room(bridge: &Bridge) -> Option<String> {
    let state = bridge.dir().join(crate::bridge::STATE_DIR);
    let (free, read_only) = room(&state)?;
    let unjudged = "lines written meanwhile are not judged, counted or shown until it can (nothing judged before is lost, and no line is judged twice)";
    if read_only {
        return Some(format!(
            "the file system holding {} is read-only: the judge cannot journal, and {unjudged}; make it writable",
            state.display()
        ));
    }
    (free < LOW_ROOM).then(|| {
        format!(
            "the disk holding {} has {} KiB free: the judge journals every line it judges, and once a write fails for room, {unjudged}; free some space",
            state.display(),
            free / 1024
        )
    })
}

/// How long `status` says that an inbox began a new generation.
const NEW_GENERATION_SAID_FOR: chrono::Duration = chrono::Duration::days(7);

/// What a person should know of an inbox that was truncated, replaced or restored in the last
/// week: when, and whether the file is shorter than what was judged of the one before (an
/// older copy: lines judged then, and perhaps not read, are no longer in it).
fn new_generation(
    bridge: &Bridge,
    name: &str,
    journal: &crate::journal::InboxJournal,
    now: DateTime<Utc>,
) -> Option<String> {
    let since = DateTime::from_timestamp_millis(journal.since).filter(|_| journal.since > 0)?;
    if journal.gen == 0 || now - since > NEW_GENERATION_SAID_FOR {
        return None;
    }
    let mut text = format!(
        "{name}'s inbox was truncated, replaced or restored {} ago: it was read again from its start, and lines judged before count as judged, not as new",
        silent_for(since, now)
    );
    let earlier = journal.earlier.last();
    let judged_before = earlier.map_or(0, |e| e.offset);
    let file = bridge
        .inbox_path(name)
        .ok()
        .and_then(|path| crate::append::open_inbox(&path, false).ok());
    let length = file
        .as_ref()
        .and_then(|file| file.metadata().ok())
        .map_or(0, |meta| meta.len());
    // Whether the file still holds, byte for byte, what was judged of the one before: not
    // when it is shorter, and not when other lines were written where those stood (an older
    // copy restored and written on since, a truncation written past where it was): said as
    // long as the generation is, not only until the file is longer again.
    let holds_before = length >= judged_before
        && earlier.zip(file.as_ref()).is_none_or(|(earlier, file)| {
            earlier.marker.matches(file, earlier.offset).unwrap_or(true)
        });
    let read_none_before =
        matches!(journal.unread_from, Some(crate::journal::Unread::Since(..))) && judged_before > 0;
    if length < judged_before || (!holds_before && !read_none_before) {
        let _ = if length < judged_before {
            write!(
                text,
                "; it is shorter than what was judged of the file before ({judged_before} bytes, now {length})"
            )
        } else {
            write!(
                text,
                "; other lines stand now where the file before was judged ({judged_before} bytes)"
            )
        };
        let _ = write!(
            text,
            ": some of its lines are no longer in it (restored from an older copy, edited, or rotated: a rotation keeps them in the old file, such as {name}-inbox.jsonl.1)"
        );
        // Whether its reader had read the file replaced to the end.
        let unread = match journal.unread_from {
            // None of the file before, or part of it.
            Some(crate::journal::Unread::All | crate::journal::Unread::Since(..)) => true,
            Some(crate::journal::Unread::From(offset)) => offset < judged_before,
            None => false,
        };
        if unread {
            let _ = write!(
                text,
                "; {name} had not read all of the file before, and is not shown what of it is no longer in the file: read it there, or ask its senders to send it again (what is still in the file is shown again)"
            );
        } else {
            let _ = write!(text, ", and their senders may have to send them again");
        }
    } else if read_none_before {
        // Longer, but the file before it was never read: what of it this one does not hold
        // is shown nowhere.
        let _ = write!(
            text,
            "; {name} had read none of the file before ({judged_before} bytes), and is not shown what of it is not in this one: read it there, or ask its senders to send it again (what is in this one is shown)"
        );
    }
    Some(text)
}

/// Lines written to `name`'s inbox a while ago that the running judge has not judged (it is
/// stopped, or stuck): they are not counted as unread, nor shown, until it does.
fn judge_behind(
    bridge: &Bridge,
    name: &str,
    journal: Option<&crate::journal::InboxJournal>,
    judge: &str,
) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(bridge.inbox_path(name).ok()?).ok()?;
    let idle = meta.modified().ok()?.elapsed().ok()?;
    let (same, judged_to) = journal.map_or((true, 0), |journal| {
        (
            (meta.dev(), meta.ino()) == (journal.dev, journal.ino),
            journal.judged_to,
        )
    });
    let behind = meta.len().saturating_sub(judged_to);
    // A last line without its newline is `unfinished_line`'s to say.
    let ended = {
        use std::os::unix::fs::FileExt;
        let file = crate::append::open_inbox(&bridge.inbox_path(name).ok()?, false).ok()?;
        let mut last = [0u8];
        file.read_exact_at(&mut last, meta.len().checked_sub(1)?)
            .ok()?;
        last[0] == b'\n'
    };
    (same && ended && behind > 0 && idle >= UNFINISHED_FOR).then(|| {
        format!(
            "{name}'s inbox has {behind} bytes written {} ago that the judge ({judge}) has not judged: they are not counted or shown until it does (is it stopped, or stuck?)",
            silent_for(Utc::now() - chrono::Duration::from_std(idle).unwrap_or_default(), Utc::now())
        )
    })
}

/// How long an inbox's last line may stay without its newline before `status` says so: a
/// writer is seldom that slow between the bytes of one line.
const UNFINISHED_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// How far back from an inbox's end its unfinished line is looked for.
const UNFINISHED_LOOKED_AT: u64 = 64 << 10;

/// Why `agent`'s unread count is unknown: its read position, or its inbox, cannot be read.
fn unread_unknown(agent: &str, error: &Error) -> String {
    match error {
        Error::Io { action, .. } if action.ends_with(" cursor") => format!(
            "{agent}'s read position cannot be read, so its reader stops and its unread count is unknown (move the file away to read from the start): {error}"
        ),
        _ => format!(
            "{agent}'s inbox cannot be read, so its messages are not judged or shown: {error}"
        ),
    }
}

/// An inbox whose last bytes have had no newline for a while: a line no reader sees, nor
/// the judge judges, until its writer ends it (or another line's writer does).
fn unfinished_line(bridge: &Bridge, name: &str) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let file = crate::append::open_inbox(&bridge.inbox_path(name).ok()?, false).ok()?;
    let meta = file.metadata().ok()?;
    let size = meta.len();
    let idle = meta.modified().ok()?.elapsed().ok()?;
    if size == 0 || idle < UNFINISHED_FOR {
        return None;
    }
    let from = size.saturating_sub(UNFINISHED_LOOKED_AT);
    let mut tail = vec![0; usize::try_from(size - from).ok()?];
    file.read_exact_at(&mut tail, from).ok()?;
    if tail.last() == Some(&b'\n') {
        return None;
    }
    let bytes = match tail.iter().rposition(|&b| b == b'\n') {
        Some(at) => format!("{} bytes", tail.len() - at - 1),
        None if from == 0 => format!("{size} bytes"),
        None => format!("more than {} KiB", UNFINISHED_LOOKED_AT >> 10),
    };
    Some(format!(
        "{name}'s inbox ends in an unfinished line ({bytes} with no newline, last written {} ago): no one sees it until its writer ends it with a newline (`doorbell check {}` shows it)",
        doorbell_core::trace::span(i64::try_from(idle.as_secs()).unwrap_or(i64::MAX)),
        bridge.inbox_path(name).ok()?.display()
    ))
}

/// An inbox that another process holds locked, or that cannot be written, while lines the
/// bridge wrote for it (notices, rings) wait to go in: who holds it, so a person can let it
/// go, or why it cannot be written.
fn locked_with_lines_waiting(bridge: &Bridge, name: &str, waiting: usize) -> Option<String> {
    if waiting == 0 {
        return None;
    }
    let file = crate::append::open_inbox(&bridge.inbox_path(name).ok()?, false).ok()?;
    // A notice needs the lock to itself: a shared lock held elsewhere keeps it out too.
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            // Not locked, but perhaps not writable (a read-only file, a read-only mount).
            match crate::append::open_inbox(&bridge.inbox_path(name).ok()?, true) {
                Ok(_) => None,
                Err(error) => Some(format!(
                    "{name}'s inbox cannot be written ({error}): {} the bridge wrote for it (notices, rings) wait until it can",
                    plural(waiting, "line", "lines")
                )),
            }
        }
        Err(std::fs::TryLockError::WouldBlock) => Some(format!(
            "{name}'s inbox is locked by another process ({}): {} the bridge wrote for it (notices, rings) wait until it is let go, and senders to it are turned away",
            crate::lock::flock_holder(&file).unwrap_or_else(|| "which, this process cannot see".to_owned()),
            plural(waiting, "line", "lines")
        )),
        Err(std::fs::TryLockError::Error(_)) => None,
    }
}

/// What the person should know of the remotes on other bridges: lines their bridges
/// refused, answers not taken here, and those that cannot be reached.
fn remote_warnings(
    bridge: &Bridge,
    remotes: &[crate::config::RemoteConfig],
    agents: &BTreeMap<String, AgentStatus>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for remote in remotes.iter().filter(|r| r.url.is_some()) {
        if let Some((n, last)) = refused_by_remote(bridge, &remote.name) {
            warnings.push(format!(
                "the bridge of the remote '{}' refused {} since the daemon started (the last: {last}); they stay in its inbox here, undelivered",
                remote.name,
                plural(n, "line", "lines")
            ));
        }
        if let Some((n, last)) = not_taken_from_remote(bridge, &remote.name) {
            warnings.push(format!(
                "{} from the remote '{}' could not be taken here since the daemon started (the last: {last}); the requests they answer stay open",
                plural(n, "answer", "answers"),
                remote.name
            ));
        }
        if let Some(why) = unreachable(bridge, &remote.name) {
            let waiting = agents.get(&remote.name).map_or(0, |a| a.unread);
            warnings.push(format!(
                "the remote '{}' cannot be reached ({why}); lines waiting for it: {waiting}, tried again with backoff",
                remote.name
            ));
        }
    }
    warnings
}

/// Files in the bridge folder that look like inboxes and are not read as one: not regular
/// files (refused), or named close to an inbox without being one.
fn files_nothing_reads(bridge: &Bridge) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for file in bridge.files_nothing_reads()? {
        warnings.push(match file {
            Stray::NotRegular(path) => {
                format!("{} is not a regular file and is refused", path.display())
            }
            Stray::Reserved(path) => format!(
                "{} is no inbox and nothing reads it: its name is a built-in loop's or 'all', which no station may have",
                path.display()
            ),
            Stray::NearMiss {
                path,
                meant: Some(inbox),
            } => format!(
                "{} is no inbox and nothing reads it: was it meant to be {inbox}? (an inbox is named AGENT-inbox.jsonl, the agent's name in lower case)",
                path.display()
            ),
            Stray::NearMiss { path, meant: None } => format!(
                "{} is no inbox and nothing reads it (an inbox is named AGENT-inbox.jsonl; an agent's name is lower-case letters, digits, '.', '_' and '-')",
                path.display()
            ),
        });
    }
    Ok(warnings)
}

/// The bridge's status as `view` sees it.
pub fn status(view: &mut View) -> Result<Status> {
    let bridge = view.bridge().clone();
    let config = &bridge.config;
    let judge = view.judge().map(str::to_owned);
    let debts = view.debts()?;
    let inboxes = bridge.inboxes()?;
    let mut agents: BTreeMap<String, AgentStatus> = BTreeMap::new();
    for name in inboxes.iter().chain(config.agents.iter().map(|a| &a.name)) {
        agents.entry(name.clone()).or_insert_with(|| AgentStatus {
            name: name.clone(),
            has_inbox: inboxes.contains(name),
            ..AgentStatus::default()
        });
    }
    let mut warnings = Vec::new();
    for debt in &debts {
        // A debt whose debtor or creditor is no station now (its inbox deleted, its
        // [[agent]] removed) is counted in no row: said instead.
        let (debtor, creditor) = (debt.debtor_station(), debt.creditor_station());
        let gone = [debtor, creditor]
            .into_iter()
            .find(|name| !agents.contains_key(*name) && !config.loops.iter().any(|l| l == name));
        if let Some(gone) = gone {
            let requester = debt.requester_station();
            let or_cancel = if gone == requester {
                String::new()
            } else {
                // A cancel is written to the addressee's inbox: not before it is one again.
                format!(
                    "; then {requester} can cancel it (doorbell cancel {} --from {requester})",
                    debt.id
                )
            };
            warnings.push(format!(
                "{debtor} owes {creditor} an answer to {}, but {gone} is no station now (its inbox gone?): nobody can answer it until it is one again (doorbell agent add {gone}){or_cancel}",
                debt.id
            ));
        }
        if let Some(agent) = agents.get_mut(debt.debtor_station()) {
            agent.owes += 1;
        }
        if let Some(agent) = agents.get_mut(debt.creditor_station()) {
            agent.is_owed += 1;
        }
    }
    for agent in agents.values_mut().filter(|a| a.has_inbox) {
        if let Some(journal) = view.inboxes().get(&agent.name) {
            agent.last_activity = DateTime::from_timestamp_millis(journal.last_accepted_at)
                .filter(|_| journal.last_accepted_at > 0)
                .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true));
        }
        let another = view.inbox_is_another(&agent.name)?;
        if let Some(other) = &another {
            warnings.push(format!(
                "{0}-inbox.jsonl is {other}'s inbox under another name (a hard link, or a rename): it is not judged; rename it back to {other}-inbox.jsonl, or give {0} an inbox of its own",
                agent.name
            ));
        }
        if let Some(journal) = view.inboxes().get(&agent.name) {
            warnings.extend(new_generation(&bridge, &agent.name, journal, Utc::now()));
        }
        warnings.extend(unfinished_line(&bridge, &agent.name));
        // An inbox the judge has not looked at yet counts too (a judge stopped as it
        // started); another's file under this name is said above.
        if let (Some(judge), None) = (&judge, &another) {
            let journal = view.inboxes().get(&agent.name);
            warnings.extend(judge_behind(&bridge, &agent.name, journal, judge));
        }
        warnings.extend(locked_with_lines_waiting(
            &bridge,
            &agent.name,
            view.unwritten_for(&agent.name),
        ));
        // One inbox that cannot be read (its mode, a disk error) is said, not fatal.
        match view.unread(&agent.name) {
            Ok(unread) => agent.unread = unread,
            Err(error) => warnings.push(unread_unknown(&agent.name, &error)),
        }
    }
    warnings.extend(no_room(&bridge));
    warnings.extend(bridge.config_warnings()?);
    for agent in agents.values().filter(|a| !a.has_inbox) {
        warnings.push(format!(
            "agent '{}' is in the config but has no inbox (doorbell agent add {})",
            agent.name, agent.name
        ));
    }
    warnings.extend(files_nothing_reads(&bridge)?);
    warnings.extend(remote_warnings(&bridge, &config.remotes, &agents));
    if judge.is_none() {
        warnings.push("no daemon is running: messages are judged only when a command runs (doorbell daemon, or scripts/install)".to_owned());
    }
    Ok(Status {
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
    })
}

/// A duration for a person: "45 s", "12 min", "2 h 5 min", "3 d 4 h".
fn silent_for(since: DateTime<Utc>, now: DateTime<Utc>) -> String {
    doorbell_core::trace::span((now - since).num_seconds().max(0))
}

/// "just now" under a minute, as `status` says it; else "3 min ago".
fn ago(since: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if (now - since).num_seconds() < 60 {
        "just now".to_owned()
    } else {
        format!("{} ago", silent_for(since, now))
    }
}

/// Text for a markdown table cell: one line, no pipe.
fn cell(text: &str) -> String {
    text.chars()
        .map(|c| if c == '|' || c.is_control() { ' ' } else { c })
        .collect()
}

/// The board as markdown: `status`, then the stalled debts oldest first, what waits on the
/// human, and the refusals since local midnight.
pub fn markdown(view: &mut View, now: DateTime<Utc>) -> Result<String> {
    markdown_judged_by(view, now, None)
}

/// [`markdown`], saying `judge` for the judge when given (a daemon's last board, written as
/// it stops, while it still holds the lock).
fn markdown_judged_by(view: &mut View, now: DateTime<Utc>, judge: Option<&str>) -> Result<String> {
    let mut status = status(view)?;
    if let Some(judge) = judge {
        judge.clone_into(&mut status.judge);
    }
    let config = view.bridge().config.clone();
    let stalled_after =
        chrono::Duration::from_std(config.debts.stalled_after).unwrap_or(chrono::Duration::MAX);
    let debts: Vec<Request> = view.debts()?;
    let midnight = Local::now()
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .and_then(|t| Local.from_local_datetime(&t).earliest())
        .map_or(now, |t| t.with_timezone(&Utc));
    let today = view.activity(midnight)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# doorbell: {}\n\n{} · judge: {}\n",
        status.dir,
        now.with_timezone(&Local).format("%a %-d %b %Y %H:%M"),
        status.judge
    );
    out.push_str(
        "| station | unread | owes | is owed | last message |\n|---|---:|---:|---:|---|\n",
    );
    for agent in &status.agents {
        let last = agent
            .last_activity_at()
            .map_or_else(|| "-".to_owned(), |t| ago(t, now));
        let name = agent.label();
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {last} |",
            agent.unread, agent.owes, agent.is_owed
        );
    }
    let human = &config.human;
    let stalled: Vec<&Request> = debts
        .iter()
        .filter(|r| r.debtor_station() != human && now - r.state_since >= stalled_after)
        .collect();
    out.push_str("\n## Stalled debts, oldest first\n\n");
    if stalled.is_empty() {
        out.push_str("none\n");
    } else {
        out.push_str(
            "| request | owed by | to | state | silent for | rings |\n|---|---|---|---|---|---:|\n",
        );
        for r in &stalled {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                cell(&r.id),
                r.debtor_station(),
                r.creditor(),
                r.state,
                silent_for(r.state_since, now),
                r.rings
            );
        }
    }
    let waiting: Vec<&Request> = debts
        .iter()
        .filter(|r| r.debtor_station() == human)
        .collect();
    let _ = writeln!(out, "\n## Waiting on {human}\n");
    if waiting.is_empty() {
        out.push_str("nothing\n");
    } else {
        for r in &waiting {
            let _ = writeln!(
                out,
                "- {} from {}, {} for {} ({})",
                cell(&r.id),
                r.creditor(),
                r.state,
                silent_for(r.state_since, now),
                cell(&doorbell_core::debts::answer_command(r))
            );
        }
    }
    out.push_str("\n## Refused today\n\n");
    if today.refused.is_empty() {
        out.push_str("none\n");
    } else {
        for (reason, n) in &today.refused {
            let _ = writeln!(out, "- {reason}: {n}");
        }
    }
    for warning in &status.warnings {
        // A file's name, a far bridge's error: text from elsewhere, safe for a terminal.
        let _ = writeln!(out, "\n> warning: {}", printable(warning));
    }
    Ok(out)
}

/// Write the board (`STATUS.md`) from what the index and the journal say now, atomically.
pub fn write(bridge: &Bridge) -> Result<()> {
    write_judged_by(bridge, None)
}

/// The board after the last judge let go: as the daemon stops (`what`: "the daemon
/// stopped"), or after `daemon --once` ("`daemon --once` judged"). It names no judge, and
/// when that was: the next start, or a command's catch-up, judges what comes meanwhile.
pub fn write_no_judge(bridge: &Bridge, what: &str) -> Result<()> {
    let none = format!(
        "none running ({what} {})",
        Local::now().format("%a %-d %b %H:%M")
    );
    write_judged_by(bridge, Some(&none))
}

fn write_judged_by(bridge: &Bridge, judge: Option<&str>) -> Result<()> {
    let mut view = View::unjudged_as_judge(bridge)?;
    let text = markdown_judged_by(&mut view, Utc::now(), judge)?;
    crate::atomic::write_atomic_unsynced(&bridge.dir().join(BOARD_FILE), text.as_bytes())
}
