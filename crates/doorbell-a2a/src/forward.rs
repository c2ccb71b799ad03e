//! Federation (DESIGN §11): a `[[remote]]` with a `url` is a station on another bridge. A
//! forwarder per such remote, run by the daemon, reads the remote's local inbox as its
//! reader would (past its cursor, accepted lines only) and sends each line to the far
//! gateway; and it brings the far task's answers back as responses in the requester's inbox.
//!
//! Exactly once, by construction: a line is sent with its doorbell id as the A2A
//! `messageId`, and the cursor moves past it only once the far side has judged it. A crash
//! in between sends it again, and the far judge counts the retry as a duplicate of the line
//! it accepted. An answer brought back keeps its far id, and is appended only when the
//! local bridge has no message of that id yet. An unreachable remote is retried with
//! backoff, and `.doorbell/remote-<name>.json` says so for `status`; nothing is dropped.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use doorbell_core::name::is_builtin_loop;
use doorbell_core::{Envelope, Kind, Request, State};
use doorbell_store::append::open_inbox;
use doorbell_store::view::envelope_of;
use doorbell_store::{cursor, send, Bridge, View};
use serde_json::{json, Value};

use crate::proto;
use crate::Error;

/// How often the far tasks of open requests are asked for news.
pub const POLL: Duration = Duration::from_secs(1);
/// The longest wait between two tries of an unreachable remote.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A remote station on another bridge.
#[derive(Clone)]
pub struct Remote {
    pub name: String,
    /// Its JSON-RPC endpoint on the far gateway.
    pub url: String,
    token: String,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Remote")
            .field("name", &self.name)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The remotes to forward to: every `[[remote]]` with a `url` (each needs a `token_file`,
/// the token the far gateway knows this bridge by).
pub fn remotes(bridge: &Bridge) -> Result<Vec<Remote>, Error> {
    let mut remotes = Vec::new();
    for remote in &bridge.config.remotes {
        let Some(url) = &remote.url else { continue };
        let Some(path) = &remote.token_file else {
            return Err(Error::Token {
                name: remote.name.clone(),
                path: "(none)".into(),
                why:
                    "a [[remote]] with a url needs a token_file: the token its bridge knows you by"
                        .into(),
            });
        };
        remotes.push(Remote {
            name: remote.name.clone(),
            url: url.clone(),
            token: crate::server::read_token(&remote.name, path)?,
        });
    }
    Ok(remotes)
}

/// Start one forwarding thread per remote.
pub fn start(bridge: &Bridge, remotes: Vec<Remote>) -> Result<(), Error> {
    for remote in remotes {
        let events = doorbell_daemon::waiter::Events::new(bridge)?;
        let bridge = bridge.clone();
        std::thread::Builder::new()
            .name(format!("a2a-{}", remote.name))
            .spawn(move || Forwarder::new(bridge, remote).run(&events))
            .map_err(Error::Thread)?;
    }
    Ok(())
}

/// Why a turn stopped.
#[derive(Debug)]
enum Stop {
    /// The far bridge could not be reached (or would not take our token): try again later.
    Unreachable(String),
    /// Something here went wrong.
    Local(String),
}

impl From<doorbell_store::Error> for Stop {
    fn from(error: doorbell_store::Error) -> Stop {
        Stop::Local(error.to_string())
    }
}

/// Whether a JSON-RPC error says the line itself is refused (bad params, no such task, a
/// closed one, an unknown method or version) rather than that the far side failed.
fn is_refusal(code: i64) -> bool {
    matches!(code, -32600 | -32601 | -32602 | -32001 | -32004 | -32009)
}

/// A far JSON-RPC call's outcome: its result, or the far side's error.
enum Answer {
    Result(Value),
    Error { code: i64, message: String },
}

struct Forwarder {
    bridge: Bridge,
    remote: Remote,
    agent: ureq::Agent,
    /// Ids appended by this process, which the judge may not have journaled yet.
    appended: HashSet<String>,
    next_id: u64,
    /// When the far tasks were last asked for news.
    polled: Option<Instant>,
    /// Lines the far bridge refused since this daemon started: how many, and the last.
    refused: (u64, Option<String>),
    /// Answers from the far station that could not be taken here: how many, and the last.
    not_taken: (u64, Option<String>),
}

/// The station's name on its own bridge: the last part of its endpoint (`…/a2a/web`), which
/// the far bridge writes as the `from` of its station's answers. This bridge may know it
/// under another name (the `[[remote]]`'s).
fn far_name(remote: &Remote) -> &str {
    crate::station_in_url(&remote.url).unwrap_or(&remote.name)
}

impl Forwarder {
    fn new(bridge: Bridge, remote: Remote) -> Forwarder {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .http_status_as_error(false)
            .build()
            .into();
        Forwarder {
            bridge,
            remote,
            agent,
            appended: HashSet::new(),
            next_id: 0,
            polled: None,
            refused: (0, None),
            not_taken: (0, None),
        }
    }

    fn run(mut self, events: &doorbell_daemon::waiter::Events) {
        let mut backoff = POLL;
        loop {
            let wait = match self.turn() {
                Ok(()) => {
                    backoff = POLL;
                    self.note_state(None);
                    POLL
                }
                Err(Stop::Unreachable(why)) => {
                    self.note_state(Some(&why));
                    tracing::warn!(remote = %self.remote.name, url = %self.remote.url, %why, "a2a: the remote cannot be reached; trying again in {}s", backoff.as_secs());
                    let wait = backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    // An unreachable remote waits out its backoff, whatever changes here.
                    let until = Instant::now() + wait;
                    while Instant::now() < until {
                        if !events.wait(Some(until)) && Instant::now() < until {
                            return;
                        }
                    }
                    continue;
                }
                Err(Stop::Local(why)) => {
                    tracing::warn!(remote = %self.remote.name, %why, "a2a: forwarding");
                    POLL
                }
            };
            // Woken early by a change here (a line to forward); else the poll of the far side.
            events.wait(Some(Instant::now() + wait));
        }
    }

    /// Say in `.doorbell/remote-<name>.json` whether the remote can be reached (and since
    /// when it cannot), and what its bridge refused.
    fn note_state(&self, unreachable: Option<&str>) {
        let Ok(dir) = self.bridge.state_dir() else {
            return;
        };
        let path = dir.join(format!("remote-{}.json", self.remote.name));
        let known = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let was_unreachable = known.as_ref().is_some_and(|k| k["reachable"] == false);
        let since = match (&known, unreachable.is_some() && was_unreachable) {
            (Some(known), true) => known["at"].clone(),
            _ => json!(proto::timestamp(chrono::Utc::now())),
        };
        let state = json!({
            "remote": self.remote.name,
            "url": self.remote.url,
            "reachable": unreachable.is_none(),
            "error": unreachable,
            "at": since,
            "refused": self.refused.0,
            "last_refused": self.refused.1,
            "not_taken": self.not_taken.0,
            "last_not_taken": self.not_taken.1,
        });
        // Written when it changes, not at every poll.
        if known.is_some_and(|k| {
            k["reachable"] == state["reachable"]
                && k["error"] == state["error"]
                && k["refused"] == state["refused"]
                && k["not_taken"] == state["not_taken"]
        }) {
            return;
        }
        if let Err(error) =
            doorbell_store::atomic::write_atomic(&path, state.to_string().as_bytes())
        {
            tracing::warn!(%error, "a2a: noting the remote's state");
        }
    }

    fn turn(&mut self) -> Result<(), Stop> {
        let mut view = View::open(&self.bridge)?;
        self.forward(&view)?;
        // The far side is asked for news once a POLL, however often things change here.
        if self.polled.is_some_and(|at| at.elapsed() < POLL) {
            return Ok(());
        }
        self.polled = Some(Instant::now());
        self.bring_back(&mut view)
    }

    /// Send each accepted line past the remote's cursor, moving the cursor past each once the
    /// far side has judged it.
    fn forward(&mut self, view: &View) -> Result<(), Stop> {
        let name = self.remote.name.clone();
        let path = self.bridge.inbox_path(&name)?;
        let file = open_inbox(&path, false)?;
        let from = cursor::load(&self.bridge, &name, &file)?.offset();
        let Some(mut inbox) = view.inbox(&name, from)? else {
            return Ok(());
        };
        let meta = file
            .metadata()
            .map_err(|e| Stop::Local(format!("stat {}: {e}", path.display())))?;
        if (meta.dev(), meta.ino()) != (inbox.journal.dev, inbox.journal.ino) {
            return Ok(());
        }
        let mut lines = Vec::new();
        let upto = inbox
            .accepted_messages(&file, from, |offset, bytes, _| -> std::io::Result<()> {
                lines.push((offset, bytes.to_vec()));
                Ok(())
            })
            .map_err(|e| Stop::Local(format!("read {}: {e}", path.display())))?;
        for (offset, bytes) in lines {
            let envelope = envelope_of(&bytes).ok_or_else(|| {
                Stop::Local(format!("{} changed at byte {offset}", path.display()))
            })?;
            self.forward_line(view, &envelope)?;
            self.advance(&file, offset + bytes.len() as u64 + 1)?;
        }
        self.advance(&file, upto)
    }

    fn advance(&self, file: &File, to: u64) -> Result<(), Stop> {
        Ok(cursor::advance(
            &self.bridge,
            &self.remote.name,
            file,
            to,
            "a2a",
        )?)
    }

    /// One line to the remote: a request as a new task; the requester's answer (`working`
    /// after input-required, a cancel) or a note as a message to its task; a note to the
    /// remote as a note. Lines of the built-in loops (rings) stay here: the far bridge keeps
    /// its own debts. What the far side refuses is logged; it stays in the inbox here.
    fn forward_line(&mut self, view: &View, envelope: &Envelope<'_>) -> Result<(), Stop> {
        if is_builtin_loop(&envelope.from) {
            return Ok(());
        }
        let parts: Vec<Value> = envelope
            .message
            .parts
            .iter()
            .map(proto::part_json)
            .collect();
        let mut metadata = json!({ "from": envelope.from });
        let mut message = json!({
            "messageId": envelope.id,
            "role": "ROLE_USER",
            "parts": parts,
        });
        let (method, params) = match (envelope.kind, envelope.correlates_to.as_deref()) {
            (Kind::Request, _) => {
                if let Some(context) = &envelope.context_id {
                    message["contextId"] = json!(context);
                }
                if envelope.priority != 1 {
                    metadata["priority"] = json!(envelope.priority);
                }
                if let Some(reply_by) = envelope.reply_by {
                    metadata["replyBy"] = json!(proto::timestamp(reply_by));
                }
                ("SendMessage", json!({ "message": message }))
            }
            (_, Some(request)) => match view.request(request) {
                // A cancel of the remote's task.
                Some(asked)
                    if asked.addressee == self.remote.name
                        && envelope.state == Some(State::Canceled) =>
                {
                    ("CancelTask", json!({ "id": request }))
                }
                // A note about a task between the two sides, to the station, naming the task
                // (a closed task takes no new message): about the remote's own task, and
                // about what the remote asked, open here or not. The remote's bridge brings
                // back what the task's history holds only while the task is open there: a
                // requester that cancelled first stops asking, and a note written meanwhile
                // would be lost. A note it brought too is told delivered, not written twice.
                Some(asked)
                    if envelope.kind == Kind::Note
                        && (asked.addressee == self.remote.name
                            || asked.requester_station() == self.remote.name) =>
                {
                    message["referenceTaskIds"] = json!([request]);
                    metadata["kind"] = json!("note");
                    ("SendMessage", json!({ "message": message }))
                }
                // The requester's answer to the remote's task (its input, a `working`).
                Some(asked) if asked.addressee == self.remote.name => {
                    message["taskId"] = json!(request);
                    metadata["kind"] = json!(envelope.kind.to_string());
                    if let Some(state) = envelope.state {
                        metadata["state"] = json!(state.as_str());
                    }
                    ("SendMessage", json!({ "message": message }))
                }
                // An answer to what the remote asked: its bridge brings it back from this
                // bridge's gateway (`bring_back` there).
                Some(asked) if asked.requester_station() == self.remote.name => return Ok(()),
                // A note about something the remote's bridge does not share: a note, in its
                // thread.
                _ => {
                    if let Some(context) = &envelope.context_id {
                        message["contextId"] = json!(context);
                    }
                    metadata["kind"] = json!("note");
                    ("SendMessage", json!({ "message": message }))
                }
            },
            (_, None) => {
                metadata["kind"] = json!("note");
                ("SendMessage", json!({ "message": message }))
            }
        };
        let mut params = params;
        if method == "SendMessage" {
            params["message"]["metadata"] = metadata;
            params["configuration"] = json!({ "returnImmediately": true });
        }
        match self.call(method, &params)? {
            // Done; or a cancel that came after the far task closed: nothing more to do.
            Answer::Result(_) | Answer::Error { code: -32002, .. } => {}
            // The far bridge failed, not the line: send it again later.
            Answer::Error { code, message } if code == -32603 || !is_refusal(code) => {
                return Err(Stop::Unreachable(format!(
                    "{method}: error {code}: {message}"
                )));
            }
            Answer::Error { code, message } => {
                // Said for status first: whoever reads the log line finds it there.
                self.refused = (
                    self.refused.0 + 1,
                    Some(format!("{}: {message}", envelope.id)),
                );
                self.note_state(None);
                tracing::warn!(remote = %self.remote.name, id = %envelope.id, code, %message, "a2a: the remote's bridge refused a line; it stays here, and status says so");
            }
        }
        Ok(())
    }

    /// For each open request to the remote, the far task's answers that are not here yet,
    /// appended to the requester's inbox with their far ids.
    fn bring_back(&mut self, view: &mut View) -> Result<(), Stop> {
        let open: Vec<Request> = view
            .debts_of(&self.remote.name)?
            .into_iter()
            .filter(|r| r.addressee == self.remote.name)
            .collect();
        for request in open {
            let task = match self.call("GetTask", &json!({ "id": request.id }))? {
                Answer::Result(task) => task,
                // Not there (yet): the request was not forwarded yet, or was refused there.
                Answer::Error { .. } => continue,
            };
            let history = task["history"].as_array().cloned().unwrap_or_default();
            for message in history {
                self.bring_one(view, &request, &message)?;
            }
        }
        Ok(())
    }

    fn bring_one(&mut self, view: &View, request: &Request, message: &Value) -> Result<(), Stop> {
        match self.bring_one_of(view, request, message) {
            // One answer that cannot be taken (a part no inbox holds) holds up no other.
            Err(Stop::Local(why)) => {
                if let Some(id) = message["messageId"].as_str() {
                    self.appended.insert(id.to_owned());
                }
                // Said for status first: whoever reads the log line finds it there.
                self.not_taken = (self.not_taken.0 + 1, Some(why.clone()));
                self.note_state(None);
                tracing::warn!(remote = %self.remote.name, %why, "a2a: an answer from the remote is not taken; status says so");
                Ok(())
            }
            other => other,
        }
    }

    fn bring_one_of(
        &mut self,
        view: &View,
        request: &Request,
        message: &Value,
    ) -> Result<(), Stop> {
        let metadata = &message["metadata"];
        let from = &metadata["from"];
        if message["role"] != "ROLE_AGENT"
            || (from != &json!(far_name(&self.remote)) && from != &json!(self.remote.name))
        {
            return Ok(());
        }
        let Some(id) = message["messageId"].as_str() else {
            return Ok(());
        };
        if self.appended.contains(id) {
            return Ok(());
        }
        if let Some(found) = view.message(id)? {
            // Brought back before; or another message here has its id, and this answer
            // cannot be written under it.
            if self.brought(&found, request) {
                return Ok(());
            }
            return Err(Stop::Local(format!(
                "{id} is the id of another message here ({}'s inbox)",
                found.inbox
            )));
        }
        let kind = metadata["kind"].as_str().unwrap_or("note");
        let parts = message["parts"]
            .as_array()
            .map(|parts| {
                parts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| proto::incoming_part(i, p))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()
            .map_err(|e| Stop::Local(format!("a part of {id} from the remote: {}", e.message)))?
            .unwrap_or_default();
        let line = send::Message {
            to: vec![request.requester_station().to_owned()],
            from: Some(self.remote.name.clone()),
            kind: Some(
                if kind == "response" {
                    "response"
                } else {
                    "note"
                }
                .to_owned(),
            ),
            state: metadata["state"].as_str().map(str::to_owned),
            correlates_to: Some(request.id.clone()),
            context_id: Some(request.context_id.clone()),
            id: Some(id.to_owned()),
            parts,
            ..send::Message::default()
        };
        match view.send(&line) {
            Ok(_) => {
                self.appended.insert(id.to_owned());
            }
            Err(doorbell_store::Error::Refused { message }) => {
                return Err(Stop::Local(format!(
                    "{id} would be refused here: {message}"
                )));
            }
            Err(other) => return Err(other.into()),
        }
        Ok(())
    }

    /// Whether `found` is an answer to `request` this forwarder brought back: in the
    /// requester's inbox, from the remote, to the request (when its line is still there).
    fn brought(&self, found: &doorbell_store::view::Found, request: &Request) -> bool {
        found.inbox == request.requester_station()
            && (found.line.is_none()
                || found.envelope().is_some_and(|envelope| {
                    envelope.from == self.remote.name
                        && envelope.correlates_to.as_deref() == Some(request.id.as_str())
                }))
    }

    /// One JSON-RPC call to the far gateway.
    fn call(&mut self, method: &str, params: &Value) -> Result<Answer, Stop> {
        self.next_id += 1;
        let body =
            json!({ "jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params });
        let mut response = self
            .agent
            .post(&self.remote.url)
            .header("Authorization", &format!("Bearer {}", self.remote.token))
            .header("A2A-Version", "1.0")
            .send_json(&body)
            .map_err(|e| Stop::Unreachable(e.to_string()))?;
        let status = response.status();
        if status != 200 {
            return Err(Stop::Unreachable(format!("{method}: HTTP {status}")));
        }
        let answer: Value = response
            .body_mut()
            .read_json()
            .map_err(|e| Stop::Unreachable(format!("{method}: {e}")))?;
        if let Some(error) = answer.get("error") {
            return Ok(Answer::Error {
                code: error["code"].as_i64().unwrap_or(0),
                message: error["message"].as_str().unwrap_or("").to_owned(),
            });
        }
        Ok(Answer::Result(answer["result"].clone()))
    }
}
