//! Sending, for every front end: build the envelope every sender writes, pre-check it
//! against the rules this process can see (the stateless ones always, the ledger's through a
//! `View` when one is open), and append it to each recipient's inbox. The judge's verdict is
//! final; the pre-check only refuses early what the judge would refuse anyway, so a sender is
//! not told "sent" for a line that is sure to be refused.

use chrono::{DateTime, SecondsFormat, Utc};
use doorbell_core::ledger::transition_allowed;
use doorbell_core::report::plural;
use doorbell_core::{
    is_agent_name, is_id, is_reserved_id, judge_stateless, Limits, Registry, State, Verdict,
    BUILTIN_LOOPS,
};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::journal::Word;
use crate::{Bridge, Error, Result, View};

/// A message to send, as a person or an agent gives it.
#[derive(Debug, Clone, Default)]
pub struct Message {
    /// Recipients; `all` means every station but the sender (a broadcast).
    pub to: Vec<String>,
    pub from: Option<String>,
    /// How long to wait for an inbox another process holds locked (`None`: 10 s).
    pub lock_wait: Option<std::time::Duration>,
    /// `request`, `response` or `note` (default: note, or response with `correlates_to`).
    pub kind: Option<String>,
    pub state: Option<String>,
    pub correlates_to: Option<String>,
    pub context_id: Option<String>,
    pub task_id: Option<String>,
    pub priority: Option<u8>,
    /// RFC 3339, already resolved.
    pub reply_by: Option<String>,
    /// Whether `reply_by` was resolved from a duration (`--reply-by 2h`): a retry under the
    /// same id then keeps the time its accepted copy was given.
    pub reply_by_relative: bool,
    /// The id (a retry with the same id is safe); a new ULID when `None`.
    pub id: Option<String>,
    pub text: Option<String>,
    /// A JSON object, for a data part.
    pub data: Option<Box<RawValue>>,
    /// Parts after the text and the data, in order (what an A2A message carries).
    pub parts: Vec<Part>,
    /// `agent` (default) or `user`.
    pub role: Option<String>,
}

/// A part of a message beyond its text and data part.
#[derive(Debug, Clone)]
pub enum Part {
    Text(String),
    /// A JSON object.
    Data(Box<RawValue>),
    /// A file, by `uri` or as base64 `bytes`.
    File {
        name: Option<String>,
        mime_type: Option<String>,
        uri: Option<String>,
        bytes: Option<String>,
    },
}

fn refused(message: impl Into<String>) -> Error {
    Error::Refused {
        message: message.into(),
    }
}

/// The envelope as `send` writes it; the field order is the one every sender uses.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Outgoing<'a> {
    id: &'a str,
    from: &'a str,
    to: &'a str,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlates_to: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'a str>,
    created_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_by: Option<&'a str>,
    message: OutMessage<'a>,
}

#[derive(Serialize)]
struct OutMessage<'a> {
    role: &'a str,
    parts: &'a [OutPart<'a>],
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum OutPart<'a> {
    Text { text: &'a str },
    Data { data: &'a RawValue },
    File { file: OutFile<'a> },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutFile<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mime_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uri: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<&'a str>,
}

/// Check the sender, the kind and the id before anything is read or written.
pub fn sender_and_kind(message: &Message) -> Result<(String, String)> {
    let from = message
        .from
        .clone()
        .ok_or_else(|| refused("who is sending? give --from or set DOORBELL_AGENT"))?;
    if !is_agent_name(&from) {
        return Err(refused(format!(
            "--from '{from}' is not a valid agent name"
        )));
    }
    if BUILTIN_LOOPS.contains(&from.as_str()) {
        return Err(refused(format!(
            "--from '{from}' is a built-in loop of the bridge; send as yourself"
        )));
    }
    let kind = match (&message.kind, &message.correlates_to) {
        (Some(kind), _) => kind.clone(),
        (None, Some(_)) => "response".to_owned(),
        (None, None) => "note".to_owned(),
    };
    if kind == "response" && (message.correlates_to.is_none() || message.state.is_none()) {
        return Err(refused(
            "a response needs --correlates-to (the request) and --state (e.g. completed); or use 'doorbell reply'",
        ));
    }
    if let Some(id) = &message.id {
        if !is_id(id) {
            return Err(refused(format!(
                "--id '{id}' is not an id (1-128 of A-Z a-z 0-9 . _ -)"
            )));
        }
        if is_reserved_id(id) {
            return Err(refused(format!(
                "--id '{id}' contains ':', which is reserved for the bridge"
            )));
        }
    }
    Ok((from, kind))
}

/// Whether sending `message` needs the ledger's rules (a retry's id, the request answered).
#[must_use]
pub fn needs_ledger(message: &Message) -> bool {
    message.correlates_to.is_some() || message.id.is_some()
}

/// The checks of the sender, the kind, the id and the recipients that need no text: what a
/// front end runs before it reads a message's text from somewhere slow (stdin).
pub fn check(bridge: &Bridge, message: &Message) -> Result<()> {
    checked(bridge, None, message).map(|_| ())
}

/// The sender, the kind, the recipients, the registry and the line limit, checked: a running
/// judge's, as it published them ([`judges_terms`]), else the config file's.
fn checked(
    bridge: &Bridge,
    view: Option<&View>,
    message: &Message,
) -> Result<(String, String, Vec<String>, Registry, usize)> {
    let (from, kind) = sender_and_kind(message)?;
    let (registry, max_line_bytes) = judges_terms(bridge, view, (&from, &kind))?;
    let recipients = recipients(bridge, &message.to, &from)?;
    for to in &recipients {
        refuse_second_name(bridge, view, to)?;
    }
    // A loop of the judge's (whatever the config file says now) has no inbox it reads.
    if let Some(to) = recipients.iter().find(|to| registry.loops.contains(*to)) {
        return Err(Error::NameTaken {
            name: to.clone(),
            why: "it is a [[loop]] of the running judge's config, which sends and has no inbox; send to an agent instead".to_owned(),
        });
    }
    if !registry.knows(&from) {
        let known: Vec<_> = registry.stations.iter().cloned().collect();
        return Err(refused(format!(
            "unknown sender '{from}' (known: {}; add one with 'doorbell agent add')",
            known.join(", ")
        )));
    }
    if let Some(why) = doorbell_core::judge::loop_refusal(&registry, &from, kind_of(&kind)) {
        return Err(refused(format!("refused: bad-field: {why}")));
    }
    // A request's answers go to its sender's inbox: a station without one (an [[agent]] of
    // the config not added yet) would leave its addressee a debt no reply can pay.
    let inbox = bridge
        .dir()
        .join(format!("{from}{}", crate::bridge::INBOX_SUFFIX));
    if kind == "request"
        && !registry.loops.contains(&from)
        && std::fs::symlink_metadata(&inbox).is_err()
    {
        return Err(refused(format!(
            "'{from}' has no inbox, so the answer to its request would have nowhere to go: add it with 'doorbell agent add {from}', then ask"
        )));
    }
    Ok((from, kind, recipients, registry, max_line_bytes))
}

/// A recipient whose inbox file is a known station's under a second name (a hard link): the
/// judge reads that file as the other's inbox, so a line to this name would be refused as
/// misaddressed after the sender was told it was sent. Only a file with more than one name
/// is looked up.
fn refuse_second_name(bridge: &Bridge, view: Option<&View>, to: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let linked = std::fs::metadata(bridge.inbox_path(to)?).is_ok_and(|meta| meta.nlink() > 1);
    if !linked {
        return Ok(());
    }
    let opened;
    let view = match view {
        Some(view) => view,
        None => match View::open(bridge) {
            Ok(view) => {
                opened = view;
                &opened
            }
            // No view (nothing judged yet, so no inbox is known by its file; or a judge
            // that does not let go in time): the judge's refusal will say it, as before.
            Err(_) => return Ok(()),
        },
    };
    match view.inbox_is_another(to)? {
        Some(other) => Err(refused(format!(
            "{to}-inbox.jsonl is {other}'s inbox under another name (a hard link): the judge reads it as {other}'s, so a message to {to} would be refused as misaddressed; nothing was sent: send to {other}, or give {to} an inbox of its own (remove the link, then 'doorbell agent add {to}')"
        ))),
        None => Ok(()),
    }
}

/// The registry and line limit a running judge goes by, as it published them: the config
/// file may have changed since it loaded it. A sender it does not know is refused here, with
/// how to make it load the file; without a running judge, the file's.
fn judges_terms(
    bridge: &Bridge,
    view: Option<&View>,
    (from, kind): (&str, &str),
) -> Result<(Registry, usize)> {
    let file_limit = bridge.max_line_bytes();
    let holder = match view {
        Some(view) => view.judge().map(str::to_owned),
        None => crate::lock::running_judge(bridge),
    };
    let Some(holder) = holder else {
        return Ok((bridge.registry()?, file_limit));
    };
    // One listing of the folder for both registries.
    let inboxes = bridge.inboxes()?;
    let file = bridge.registry_of(inboxes.clone())?;
    let Some((judges, limit)) = bridge.published_registry(inboxes) else {
        return Ok((file, file_limit));
    };
    let reload = || {
        format!(
            "the running judge ({holder}) has not loaded the config as it is now: reload it (SIGHUP, or `systemctl --user reload doorbell`) and send again"
        )
    };
    // What only the file allows is the reload's to give; what neither allows is refused
    // by the checks that follow, as without a judge.
    if !judges.knows(from) && file.knows(from) {
        return Err(refused(format!(
            "unknown sender '{from}' to the running judge: {}",
            reload()
        )));
    }
    let loop_refusal =
        |registry: &Registry| doorbell_core::judge::loop_refusal(registry, from, kind_of(kind));
    if let (Some(why), None) = (loop_refusal(&judges), loop_refusal(&file)) {
        return Err(refused(format!("refused: bad-field: {why}; {}", reload())));
    }
    Ok((judges, limit.unwrap_or(file_limit)))
}

fn kind_of(kind: &str) -> doorbell_core::Kind {
    doorbell_core::Kind::parse(kind).unwrap_or(doorbell_core::Kind::Note)
}

/// Send `message`: pre-check every recipient's line, then write them all. Returns the ids,
/// one per recipient (a duplicate, already delivered, is not written again).
pub fn send(bridge: &Bridge, view: Option<&View>, message: &Message) -> Result<Vec<String>> {
    Ok(send_placed(bridge, view, message)?
        .into_iter()
        .map(|sent| sent.id)
        .collect())
}

/// A line sent: its id, its inbox, and where it was appended (`None`: a duplicate of a line
/// already delivered, not written again).
#[derive(Debug, Clone)]
pub struct Placed {
    pub id: String,
    pub inbox: String,
    pub offset: Option<u64>,
}

/// [`send`], saying where each line went: a front end that waits for the judge's verdict on
/// its own line looks for it there.
pub fn send_placed(bridge: &Bridge, view: Option<&View>, message: &Message) -> Result<Vec<Placed>> {
    let (from, kind, recipients, registry, max_line_bytes) = checked(bridge, view, message)?;
    let now: DateTime<Utc> = Utc::now();
    let created_at = now.to_rfc3339_opts(SecondsFormat::Millis, true);
    let base_id = message
        .id
        .clone()
        .unwrap_or_else(|| ulid::Ulid::new().to_string());
    let broadcast = recipients.len() > 1;
    let limits = Limits { max_line_bytes };
    let mut parts = Vec::new();
    if let Some(text) = &message.text {
        parts.push(OutPart::Text { text });
    }
    if let Some(data) = &message.data {
        parts.push(OutPart::Data { data });
    }
    for part in &message.parts {
        parts.push(match part {
            Part::Text(text) => OutPart::Text { text },
            Part::Data(data) => OutPart::Data { data },
            Part::File {
                name,
                mime_type,
                uri,
                bytes,
            } => OutPart::File {
                file: OutFile {
                    name: name.as_deref(),
                    mime_type: mime_type.as_deref(),
                    uri: uri.as_deref(),
                    bytes: bytes.as_deref(),
                },
            },
        });
    }
    let state = match (&message.state, kind.as_str()) {
        (None, "request") => Some("submitted"),
        (state, _) => state.as_deref(),
    };
    let mut lines = Vec::new();
    for to in &recipients {
        let id = if broadcast {
            format!("{base_id}.{to}")
        } else {
            base_id.clone()
        };
        // A broadcast shares one thread (DESIGN §5), a note too unless it is about a
        // request (it is in that request's thread); a request is otherwise its own thread.
        let about_a_request = message.correlates_to.is_some();
        let context_id = match (&message.context_id, kind.as_str(), broadcast) {
            (Some(context), _, _) => Some(context.as_str()),
            (None, "request", true) => Some(base_id.as_str()),
            (None, "note", true) if !about_a_request => Some(base_id.as_str()),
            (None, "request", false) => Some(id.as_str()),
            (None, _, _) => None,
        };
        // `--reply-by 2h` again is another time, and would make a retry another message.
        let reply_by = match (message.id.is_some() && message.reply_by_relative, view) {
            (true, Some(view)) => earlier_reply_by(view, &id)?.or_else(|| message.reply_by.clone()),
            _ => message.reply_by.clone(),
        };
        let outgoing = Outgoing {
            id: &id,
            from: &from,
            to,
            kind: &kind,
            correlates_to: message.correlates_to.as_deref(),
            context_id,
            task_id: message.task_id.as_deref(),
            state,
            created_at: &created_at,
            priority: message.priority,
            reply_by: reply_by.as_deref(),
            message: OutMessage {
                role: message.role.as_deref().unwrap_or("agent"),
                parts: &parts,
            },
        };
        let line = serde_json::to_string(&outgoing).expect("an envelope always serialises");
        let envelope = judge_stateless(line.as_bytes(), Some(to), &limits)
            .map_err(|refusal| refused(format!("refused: {refusal}")))?;
        let verdict = view.map_or(Verdict::Accepted, |view| {
            view.precheck(&envelope, to, &registry)
        });
        match verdict {
            Verdict::Refused(refusal) => return Err(refused(format!("refused: {refusal}"))),
            Verdict::Duplicate => lines.push((to.clone(), id, None)),
            Verdict::Accepted => lines.push((to.clone(), id.clone(), Some(line))),
        }
    }
    // Every recipient passed the pre-check: now write. A duplicate was already delivered.
    let who = (from.as_str(), kind.as_str());
    write_placed(bridge, view, message, who, lines, &base_id)
}

/// The `replyBy` of the accepted message `id`, as written: what a retry of it with the
/// deadline given as a duration gets, so that it is the same message again.
fn earlier_reply_by(view: &View, id: &str) -> Result<Option<String>> {
    let Some(found) = view.message(id)? else {
        return Ok(None);
    };
    if found.verdict != Word::Accepted {
        return Ok(None);
    }
    Ok(found
        .line
        .and_then(|line| serde_json::from_slice::<serde_json::Value>(&line).ok())
        .and_then(|envelope| envelope.get("replyBy")?.as_str().map(str::to_owned)))
}

/// Write each recipient's line (none for a duplicate); a failure once some were written says
/// which ([`Error::PartlyWritten`]).
fn write_placed(
    bridge: &Bridge,
    view: Option<&View>,
    message: &Message,
    who: (&str, &str),
    lines: Vec<(String, String, Option<String>)>,
    base_id: &str,
) -> Result<Vec<Placed>> {
    let mut placed: Vec<Placed> = Vec::with_capacity(lines.len());
    for (to, id, line) in lines {
        let offset = match line.map(|line| append_one(bridge, view, message, who, &to, &id, &line))
        {
            None => None,
            Some(Ok(offset)) => Some(offset),
            Some(Err(error)) if placed.is_empty() => return Err(error),
            // Some inboxes have the message already: say which, and how to finish.
            Some(Err(error)) => {
                let list = |each: &dyn Fn(&Placed) -> &str| {
                    placed.iter().map(each).collect::<Vec<_>>().join(", ")
                };
                return Err(Error::PartlyWritten {
                    written: list(&|p| p.inbox.as_str()),
                    ids: list(&|p| p.id.as_str()),
                    failed: to,
                    why: match &error {
                        Error::InboxLocked { path, secs } => format!(
                            "whose inbox {} has been locked by another process for {secs} s (a writer that hangs? `fuser` finds it)",
                            path.display()
                        ),
                        error => format!("as {error}"),
                    },
                    advice: send_again(message, base_id, &error),
                });
            }
        };
        placed.push(Placed {
            id,
            inbox: to,
            offset,
        });
    }
    Ok(placed)
}

/// How to write the rest of a message cut short by `error`: the same again, with its id and
/// the time it must be answered by as written (a `--reply-by 2h` again would be another
/// time, and another message); nothing, when what stopped it was a refusal.
fn send_again(message: &Message, id: &str, error: &Error) -> String {
    if matches!(error, Error::Refused { .. }) {
        return String::new();
    }
    let reply_by = message
        .reply_by
        .as_deref()
        .map(|at| format!(" --reply-by {at}"))
        .unwrap_or_default();
    format!(
        ". To write the rest, send the same again with --id {id}{reply_by}: what was written is then taken as a duplicate, not delivered twice"
    )
}

/// Append `line`, message `id` from `from` of `kind`, to `to`'s inbox, checked against what
/// that inbox holds unjudged, under its lock ([`unjudged_conflict`]).
fn append_one(
    bridge: &Bridge,
    view: Option<&View>,
    message: &Message,
    (from, kind): (&str, &str),
    to: &str,
    id: &str,
    line: &str,
) -> Result<u64> {
    let path = bridge.inbox_path(to)?;
    // The top-level field: every field before it is an id, a name or a state, with no
    // quote of its own.
    let created_at = memchr::memmem::find(line.as_bytes(), br#""createdAt":""#)
        .map(|at| at + br#""createdAt":""#.len())
        .and_then(|at| {
            let len = memchr::memchr(b'"', &line.as_bytes()[at..])?;
            Some(at..at + len)
        });
    let Some(view) = view else {
        return crate::append::append_line_checked(
            &path,
            line.as_bytes(),
            created_at,
            message.lock_wait.unwrap_or(crate::append::SENDER_WAIT),
            |_, _| Ok(()),
        );
    };
    let judged = view
        .inboxes()
        .get(to)
        .map(|j| ((j.dev, j.ino), j.judged_to));
    // A response's request as the judge will find it, the lines before it aside.
    let response = match (kind, message.correlates_to.as_deref()) {
        ("response", Some(request)) => view.request(request).and_then(|r| {
            Some(Answer {
                request: r.into_owned(),
                state: message.state.as_deref().and_then(State::parse)?,
            })
        }),
        _ => None,
    };
    let new = New {
        id,
        fingerprint: judge_stateless(line.as_bytes(), Some(to), &ANY_LENGTH)
            .map_err(|refusal| refused(format!("refused: {refusal}")))?
            .fingerprint,
        from,
        response,
        // A broadcast's ids are derived, one per inbox: an id of its own found in one inbox
        // could refuse it after others were written.
        broadcast: message.to.len() > 1 || message.to.iter().any(|to| to == "all"),
    };
    crate::append::append_line_checked(
        &path,
        line.as_bytes(),
        created_at,
        message.lock_wait.unwrap_or(crate::append::SENDER_WAIT),
        |file, len| unjudged_conflict(file, len, judged, to, &new),
    )
}

/// The most of an inbox's unjudged tail a sender reads for a line its own would conflict
/// with; past it, the judge is far behind and says so itself.
const UNJUDGED_SEARCHED: u64 = 4 << 20;

/// A line about to be appended, as [`unjudged_conflict`] weighs it.
struct New<'a> {
    id: &'a str,
    /// Equal under one id: a retry, which the judge takes for a duplicate.
    fingerprint: u64,
    from: &'a str,
    response: Option<Answer>,
    broadcast: bool,
}

/// A response: its request as the sender's view has it, and the state it moves it to.
struct Answer {
    request: doorbell_core::Request,
    state: State,
}

/// Refuse `new` when `inbox` (`file`, `len` bytes) holds, past where the judge stopped
/// (`judged`: the file it read and how far), a line the judge will take first that makes
/// it refuse `new`: another line under its id (`id-reused`), or the same sender's earlier
/// answers to the same request, which closed it (`request-closed`) or moved it to a state
/// `new`'s cannot follow (`bad-transition`). Two lines written at once both pass the
/// pre-check before either is judged, and a sender must not be told "sent" for a line the
/// bridge will refuse.
fn unjudged_conflict(
    file: &std::fs::File,
    len: u64,
    judged: Option<((u64, u64), u64)>,
    inbox: &str,
    new: &New<'_>,
) -> Result<()> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let meta = file
        .metadata()
        .map_err(|e| refused(format!("stat {inbox}'s inbox: {e}")))?;
    let from = match judged {
        Some((file_id, judged_to)) if file_id == (meta.dev(), meta.ino()) => judged_to,
        _ => 0,
    };
    if len <= from || len - from > UNJUDGED_SEARCHED {
        return Ok(());
    }
    let mut tail = vec![0; (len - from) as usize];
    if file.read_exact_at(&mut tail, from).is_err() {
        return Ok(());
    }
    // The request as the judge will find it: the same sender's unjudged answers to it,
    // replayed through the transition table.
    let mut request = new.response.as_ref().map(|answer| answer.request.clone());
    for line in tail.split(|b| *b == b'\n') {
        let Ok(envelope) = judge_stateless(line, Some(inbox), &ANY_LENGTH) else {
            continue;
        };
        if envelope.from != new.from {
            continue;
        }
        if envelope.id == new.id {
            if envelope.fingerprint == new.fingerprint {
                // A retry of a line not judged yet: the judge takes it for a duplicate.
                return Ok(());
            }
            if !new.broadcast {
                return Err(refused(format!(
                    "refused: id-reused: {} is in {inbox}'s inbox already with other content, written and not judged yet",
                    new.id
                )));
            }
            continue;
        }
        let (Some(request), Some(next)) = (&mut request, envelope.state) else {
            continue;
        };
        if envelope.correlates_to.as_deref() == Some(request.id.as_str()) {
            if let Some(side) = request.side_of(&envelope.from, next) {
                if transition_allowed(request.state, side, next) {
                    request.state = next;
                }
            }
        }
    }
    let (Some(answer), Some(now)) = (&new.response, request) else {
        return Ok(());
    };
    if now.state == answer.request.state {
        return Ok(());
    }
    if now.state.is_terminal() {
        return Err(refused(format!(
            "refused: request-closed: {} is {} by an answer written and not judged yet",
            now.id, now.state
        )));
    }
    let allowed = now
        .side_of(new.from, answer.state)
        .is_some_and(|side| transition_allowed(now.state, side, answer.state));
    if !allowed {
        return Err(refused(format!(
            "refused: bad-transition: {} is {} by an answer written and not judged yet; {} cannot follow it",
            now.id, now.state, answer.state
        )));
    }
    Ok(())
}

/// No line limit: a line already in an inbox, or one checked against the limit already.
const ANY_LENGTH: Limits = Limits {
    max_line_bytes: usize::MAX,
};

/// The inboxes a message goes to: each `--to`, or every station for `all`.
fn recipients(bridge: &Bridge, to: &[String], from: &str) -> Result<Vec<String>> {
    if to.iter().any(|t| t == "all") {
        // Everyone but the sender: a broadcast request is not a debt one owes oneself.
        let all: Vec<String> = bridge
            .inboxes()?
            .into_iter()
            .filter(|n| n != from)
            .collect();
        if all.is_empty() {
            return Err(refused("no agents yet; add one with 'doorbell agent add'"));
        }
        return Ok(all);
    }
    let mut out: Vec<String> = Vec::new();
    for name in to {
        if !is_agent_name(name) {
            return Err(refused(format!("--to '{name}' is not a valid agent name")));
        }
        bridge.require_inbox(name)?;
        if !out.contains(name) {
            out.push(name.clone());
        }
    }
    Ok(out)
}

impl View {
    /// Send `message` with the pre-checks this view can make.
    pub fn send(&self, message: &Message) -> Result<Vec<String>> {
        send(self.bridge(), Some(self), message)
    }

    /// [`View::send`], saying where each line went.
    pub fn send_placed(&self, message: &Message) -> Result<Vec<Placed>> {
        send_placed(self.bridge(), Some(self), message)
    }

    /// The requests `from` cancels by `id`: the request itself, or of a broadcast's those
    /// `from` asked that are still open (none open: the id itself, so that the answer says
    /// why).
    pub fn to_cancel(&self, id: &str, from: Option<&str>) -> Result<Vec<String>> {
        if self.request(id).is_some() {
            return Ok(vec![id.to_owned()]);
        }
        let open: Vec<String> = self
            .requests_named(id)?
            .into_iter()
            .filter(|named| {
                self.request(named).is_some_and(|r| {
                    r.is_open()
                        && from.is_some_and(|f| f == r.requester || f == r.requester_station())
                })
            })
            .collect();
        Ok(if open.is_empty() {
            vec![id.to_owned()]
        } else {
            open
        })
    }

    /// The answer to request `id` from `from` with `state`, without its text yet: the
    /// recipient, `correlatesTo` and the thread come from the ledger.
    /// A broadcast's id (`<id>.<station>` for each station asked) stands for the request
    /// `from` was asked; its requester answers each by its own id ([`View::to_cancel`]).
    pub fn answer(&self, id: &str, from: Option<String>, state: &str) -> Result<Message> {
        let from =
            from.ok_or_else(|| refused("who is answering? give --from or set DOORBELL_AGENT"))?;
        if self.request(id).is_none() {
            let named = self.requests_named(id)?;
            let asked = format!("{id}.{from}");
            if named.contains(&asked) {
                return self.answer(&asked, Some(from), state);
            }
            if !named.is_empty() {
                return Err(refused(format!(
                    "'{id}' is a broadcast: {} asked, as {}; answer one by its id",
                    plural(named.len(), "station was", "stations were"),
                    named.join(", ")
                )));
            }
        }
        let Some(request) = self.request(id) else {
            // Say what the id is when it is a message, so an answer is not looked for in vain.
            let what = match self.message(id).ok().flatten() {
                Some(found) if found.verdict == crate::journal::Word::Accepted => {
                    format!(
                        "'{id}' is a note or a response, not a request: only a request is answered"
                    )
                }
                Some(found) => format!(
                    "'{id}' was not accepted ({}): there is no request to answer",
                    found.reason.as_deref().unwrap_or("a duplicate")
                ),
                None => {
                    format!("no request '{id}' in the ledger (doorbell debts lists the open ones)")
                }
            };
            return Err(refused(what));
        };
        // A loop's request is answered to its owner, who also speaks for the loop.
        let to = if from == request.addressee {
            request.requester_station().to_owned()
        } else if from == request.requester || from == request.requester_station() {
            request.addressee.clone()
        } else {
            return Err(refused(format!(
                "'{from}' is not a party of {id} ({} asked {}); answer as one of them with --from",
                request.requester, request.addressee
            )));
        };
        Ok(Message {
            to: vec![to],
            from: Some(from),
            kind: Some("response".to_owned()),
            state: Some(state.to_owned()),
            correlates_to: Some(id.to_owned()),
            context_id: Some(request.context_id.clone()),
            ..Message::default()
        })
    }
}
