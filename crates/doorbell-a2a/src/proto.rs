//! A2A 1.0 `ProtoJSON`, both ways: the ledger's requests as Tasks and their lines as Messages,
//! Parts and Artifacts (camelCase, `TASK_STATE_*`, `ROLE_*`, no field the proto lacks, since
//! the official Python client parses results strictly), and an A2A Message as the envelope
//! a station's inbox takes.

use chrono::{DateTime, SecondsFormat, Utc};
use doorbell_core::envelope::Part;
use doorbell_core::{Envelope, Request, State};
use doorbell_store::send;
use doorbell_store::view::Message;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::rpc::RpcError;

/// A task state's `ProtoJSON` name.
#[must_use]
pub fn state_name(state: State) -> &'static str {
    match state {
        State::Submitted => "TASK_STATE_SUBMITTED",
        State::Working => "TASK_STATE_WORKING",
        State::InputRequired => "TASK_STATE_INPUT_REQUIRED",
        State::Completed => "TASK_STATE_COMPLETED",
        State::Failed => "TASK_STATE_FAILED",
        State::Canceled => "TASK_STATE_CANCELED",
        State::Rejected => "TASK_STATE_REJECTED",
    }
}

/// A `ListTasks` status filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    /// Unspecified: every task.
    Any,
    Is(State),
    /// A state of A2A no request of a bridge is ever in (`TASK_STATE_AUTH_REQUIRED`).
    Never,
}

impl StateFilter {
    #[must_use]
    pub fn admits(self, state: State) -> bool {
        match self {
            StateFilter::Any => true,
            StateFilter::Is(s) => s == state,
            StateFilter::Never => false,
        }
    }
}

/// A2A 1.0's name and number of the state a bridge's requests are never in.
const AUTH_REQUIRED: (&str, i64) = ("TASK_STATE_AUTH_REQUIRED", 8);

/// A `TaskState`, by its name or its number.
pub fn parse_state(value: &Value) -> Result<StateFilter, RpcError> {
    if let Some(n) = value.as_i64() {
        return Ok(match n {
            0 => StateFilter::Any,
            1 => StateFilter::Is(State::Submitted),
            2 => StateFilter::Is(State::Working),
            3 => StateFilter::Is(State::Completed),
            4 => StateFilter::Is(State::Failed),
            5 => StateFilter::Is(State::Canceled),
            6 => StateFilter::Is(State::InputRequired),
            7 => StateFilter::Is(State::Rejected),
            n if n == AUTH_REQUIRED.1 => StateFilter::Never,
            _ => return Err(RpcError::invalid_params(format!("no task state {n}"))),
        });
    }
    let name = value
        .as_str()
        .ok_or_else(|| RpcError::invalid_params("status must be a TASK_STATE_* name"))?;
    match name {
        "TASK_STATE_UNSPECIFIED" => return Ok(StateFilter::Any),
        n if n == AUTH_REQUIRED.0 => return Ok(StateFilter::Never),
        _ => {}
    }
    State::ALL
        .into_iter()
        .find(|s| state_name(*s) == name)
        .map(StateFilter::Is)
        .ok_or_else(|| RpcError::invalid_params(format!("no task state '{name}'")))
}

/// A state in which a task waits for its client: streams end there, as at a terminal one.
#[must_use]
pub fn is_interrupted(state: State) -> bool {
    state == State::InputRequired
}

/// RFC 3339 in UTC with milliseconds, as `ProtoJSON` writes a `Timestamp`.
#[must_use]
pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A part as A2A 1.0 writes it: one flat object whose member says what it is.
pub fn part_json(part: &Part<'_>) -> Value {
    match part {
        Part::Text(text) => json!({ "text": text }),
        Part::Data(data) => {
            let data: Value = serde_json::from_str(data.get()).unwrap_or(Value::Null);
            json!({ "data": data, "mediaType": "application/json" })
        }
        Part::File {
            name,
            mime_type,
            uri,
            bytes,
        } => {
            let mut part = Map::new();
            if let Some(uri) = uri {
                part.insert("url".into(), json!(uri));
            } else {
                part.insert("raw".into(), json!(bytes.as_deref().unwrap_or("")));
            }
            if let Some(name) = name {
                part.insert("filename".into(), json!(name));
            }
            if let Some(mime_type) = mime_type {
                part.insert("mediaType".into(), json!(mime_type));
            }
            Value::Object(part)
        }
    }
}

/// Whether the line came from the task's client side: the requester, or for a loop's
/// request its owner, who speaks for it.
fn from_client(request: &Request, from: &str) -> bool {
    from == request.requester || from == request.requester_station()
}

/// One accepted line of a task as an A2A Message. The doorbell fields that A2A has no place
/// for (sender, kind, state) ride in `metadata`.
#[must_use]
pub fn message_json(message: &Message, request: &Request) -> Value {
    let row = &message.row;
    let role = if from_client(request, &row.from) {
        "ROLE_USER"
    } else {
        "ROLE_AGENT"
    };
    let parts: Vec<Value> = match message.envelope() {
        Some(envelope) => envelope.message.parts.iter().map(part_json).collect(),
        None => {
            vec![json!({ "text": "(this line is no longer in its inbox: the inbox was replaced)" })]
        }
    };
    let mut metadata = json!({ "from": row.from, "kind": row.kind.to_string() });
    if let Some(state) = row
        .state
        .filter(|_| row.kind != doorbell_core::Kind::Request)
    {
        metadata["state"] = json!(state.as_str());
    }
    json!({
        "messageId": row.id,
        "contextId": request.context_id,
        "taskId": request.id,
        "role": role,
        "parts": parts,
        "metadata": metadata,
    })
}

/// The data and file parts of a line from the station's side, as an Artifact named by the
/// line's id; `None` for a text-only line or one from the client.
#[must_use]
pub fn artifact_json(message: &Message, request: &Request) -> Option<Value> {
    if from_client(request, &message.row.from) {
        return None;
    }
    let envelope: Envelope<'_> = message.envelope()?;
    let parts: Vec<Value> = envelope
        .message
        .parts
        .iter()
        .filter(|p| !matches!(p, Part::Text(_)))
        .map(part_json)
        .collect();
    (!parts.is_empty()).then(|| json!({ "artifactId": message.row.id, "parts": parts }))
}

/// What of a task to include beyond its status.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The most recent messages of its history; `None`: all of them.
    pub history: Option<usize>,
    pub artifacts: bool,
}

impl Shape {
    pub const FULL: Shape = Shape {
        history: None,
        artifacts: true,
    };
}

/// The ledger's request as an A2A Task: its id, its thread as `contextId`, the ledger's
/// state (with the line that set it as the status message), the messages of the request as
/// history, and what the station sent as data or files as artifacts.
#[must_use]
pub fn task_json(request: &Request, conversation: &[Message], shape: Shape) -> Value {
    let mut status = json!({
        "state": state_name(request.state),
        "timestamp": timestamp(request.state_since),
    });
    if request.state != State::Submitted {
        if let Some(last) = conversation.iter().rev().find(|m| {
            m.row.kind == doorbell_core::Kind::Response && m.row.state == Some(request.state)
        }) {
            status["message"] = message_json(last, request);
        }
    }
    let mut task = json!({
        "id": request.id,
        "contextId": request.context_id,
        "status": status,
    });
    if shape.artifacts {
        let artifacts: Vec<Value> = conversation
            .iter()
            .filter_map(|m| artifact_json(m, request))
            .collect();
        if !artifacts.is_empty() {
            task["artifacts"] = Value::Array(artifacts);
        }
    }
    let keep = shape.history.unwrap_or(usize::MAX).min(conversation.len());
    if keep > 0 {
        let history: Vec<Value> = conversation[conversation.len() - keep..]
            .iter()
            .map(|m| message_json(m, request))
            .collect();
        task["history"] = Value::Array(history);
    }
    task
}

/// An A2A Message from a client, as the bridge takes it.
#[derive(Debug)]
pub struct Incoming {
    pub message_id: String,
    pub context_id: Option<String>,
    pub task_id: Option<String>,
    pub role: &'static str,
    pub parts: Vec<send::Part>,
    /// `metadata.from`: who the message says it is from.
    pub claimed_from: Option<String>,
    /// `metadata.priority` (0-3).
    pub priority: Option<u8>,
    /// `metadata.replyBy` (RFC 3339).
    pub reply_by: Option<String>,
    /// `metadata.kind`: `note` (a note, to the station or to the task) or `response` (the
    /// requester's answer, with `metadata.state`); absent, the gateway chooses.
    pub kind: Option<String>,
    /// `metadata.state`, for a `response`.
    pub state: Option<String>,
    /// `referenceTaskIds`' one task: what a note with no `taskId` is about (a closed task, or
    /// a task of the station's to the caller).
    pub reference: Option<String>,
}

fn string_field(object: &Map<String, Value>, key: &str) -> Result<Option<String>, RpcError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(RpcError::invalid_params(format!(
            "message.{key} must be a string"
        ))),
    }
}

/// Parse `params.message` of `SendMessage`.
pub fn incoming(message: &Value) -> Result<Incoming, RpcError> {
    let object = message
        .as_object()
        .ok_or_else(|| RpcError::invalid_params("params.message must be a Message object"))?;
    let message_id = string_field(object, "messageId")?
        .ok_or_else(|| RpcError::invalid_params("message.messageId is required"))?;
    let role = match object.get("role") {
        Some(Value::String(r)) if r == "ROLE_USER" => "user",
        Some(Value::String(r)) if r == "ROLE_AGENT" => "agent",
        Some(Value::Number(n)) if n.as_i64() == Some(1) => "user",
        Some(Value::Number(n)) if n.as_i64() == Some(2) => "agent",
        _ => {
            return Err(RpcError::invalid_params(
                "message.role must be ROLE_USER or ROLE_AGENT",
            ))
        }
    };
    let parts = object
        .get("parts")
        .and_then(Value::as_array)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| RpcError::invalid_params("message.parts must hold at least one part"))?
        .iter()
        .enumerate()
        .map(|(i, part)| incoming_part(i, part))
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = match object.get("metadata") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(RpcError::invalid_params(
                "message.metadata must be an object",
            ))
        }
    };
    let priority = match metadata.get("priority") {
        None => None,
        Some(p) => Some(
            p.as_u64()
                .filter(|p| *p <= 3)
                .ok_or_else(|| RpcError::invalid_params("metadata.priority must be 0, 1, 2 or 3"))?
                as u8,
        ),
    };
    Ok(Incoming {
        message_id,
        context_id: string_field(object, "contextId")?,
        task_id: string_field(object, "taskId")?,
        role,
        parts,
        claimed_from: string_field(&metadata, "from")?,
        priority,
        reply_by: string_field(&metadata, "replyBy")?,
        kind: match string_field(&metadata, "kind")? {
            None => None,
            Some(kind) if kind == "note" || kind == "response" => Some(kind),
            Some(other) => {
                return Err(RpcError::invalid_params(format!(
                    "metadata.kind '{other}': a message is a note or a response here (a new message is a request)"
                )))
            }
        },
        state: string_field(&metadata, "state")?,
        reference: reference(object)?,
    })
}

/// `message.referenceTaskIds`: at most one task id here.
fn reference(object: &Map<String, Value>) -> Result<Option<String>, RpcError> {
    let bad =
        || RpcError::invalid_params("message.referenceTaskIds must be a list of one task id here");
    match object.get("referenceTaskIds") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(ids)) => match ids.as_slice() {
            [] => Ok(None),
            [Value::String(id)] if !id.is_empty() => Ok(Some(id.clone())),
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

pub fn incoming_part(i: usize, part: &Value) -> Result<send::Part, RpcError> {
    let bad = |why: &str| RpcError::invalid_params(format!("message.parts[{i}]: {why}"));
    let object = part.as_object().ok_or_else(|| bad("a part is an object"))?;
    // A name of the wrong type is refused, not dropped: the station would get a part
    // without what the caller meant to say.
    let name = |key: &str| match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) => Ok(Some(name.clone())),
        Some(_) => Err(bad(&format!("{key} must be a string"))),
    };
    let contents: Vec<&str> = ["text", "raw", "url", "data"]
        .into_iter()
        .filter(|k| object.contains_key(*k))
        .collect();
    if contents.len() != 1 {
        return Err(bad("a part has exactly one of text, raw, url and data"));
    }
    // Checked on every kind of part, though only a file keeps them.
    let (filename, media_type) = (name("filename")?, name("mediaType")?);
    let value = &object[contents[0]];
    Ok(match contents[0] {
        "text" => send::Part::Text(
            value
                .as_str()
                .ok_or_else(|| bad("text must be a string"))?
                .to_owned(),
        ),
        "data" => {
            if !value.is_object() {
                return Err(bad(
                    "data must be a JSON object here (a station's data part is one)",
                ));
            }
            send::Part::Data(
                RawValue::from_string(value.to_string()).expect("a Value serialises to JSON"),
            )
        }
        kind => {
            let text = value
                .as_str()
                .ok_or_else(|| bad(&format!("{kind} must be a string")))?
                .to_owned();
            // ProtoJSON's bytes are base64 (standard or URL-safe): anything else would be
            // written, then fail every strict client that reads the task.
            if kind == "raw" && !doorbell_core::is_base64(&text) {
                return Err(bad("raw must be base64"));
            }
            let (uri, bytes) = if kind == "url" {
                (Some(text), None)
            } else {
                (None, Some(text))
            };
            send::Part::File {
                name: filename,
                mime_type: media_type,
                uri,
                bytes,
            }
        }
    })
}

/// A station's Agent Card: its description and skills from its `[[agent]]` entry, its
/// JSON-RPC endpoint at `url`, streaming, and bearer tokens as its security.
#[must_use]
pub fn agent_card(config: &doorbell_store::Config, station: &str, url: &str) -> Value {
    let entry = config.agents.iter().find(|a| a.name == station);
    let description = entry
        .and_then(|a| a.description.clone())
        .unwrap_or_else(|| {
            format!("The doorbell station '{station}': ask it (a request it owes an answer to) or tell it (a note).")
        });
    let mut skills: Vec<Value> = entry
        .map(|a| {
            a.skills
                .iter()
                .map(|s| {
                    let mut skill = json!({
                        "id": s.id,
                        "name": s.name,
                        "description": s.description,
                        "tags": s.tags,
                    });
                    if !s.examples.is_empty() {
                        skill["examples"] = json!(s.examples);
                    }
                    skill
                })
                .collect()
        })
        .unwrap_or_default();
    if skills.is_empty() {
        skills.push(json!({
            "id": "ask",
            "name": "Ask",
            "description": format!("Ask {station} a question or for a piece of work; it answers with working, input-required, then completed, failed or rejected."),
            "tags": ["doorbell"],
        }));
    }
    json!({
        "name": station,
        "description": description,
        "supportedInterfaces": [{
            "url": url,
            "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0",
        }],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": { "streaming": true },
        "securitySchemes": {
            "bearer": { "httpAuthSecurityScheme": { "scheme": "Bearer", "description": "the token of your [[remote]] entry" } },
        },
        "securityRequirements": [{ "schemes": { "bearer": { "list": [] } } }],
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    })
}

/// A 1.0 Task as A2A 0.3 JSON writes it: `kind` on every object, lowercase states and roles,
/// parts tagged by `kind` with files nested under `file`.
#[must_use]
pub fn v03_task(task: &Value) -> Value {
    let mut out = task.clone();
    out["kind"] = json!("task");
    if let Some(state) = task["status"]["state"].as_str() {
        out["status"]["state"] = json!(v03_state(state));
    }
    if let Some(message) = task["status"].get("message") {
        out["status"]["message"] = v03_message(message);
    }
    if let Some(history) = task["history"].as_array() {
        out["history"] = history.iter().map(v03_message).collect();
    }
    if let Some(artifacts) = task["artifacts"].as_array() {
        out["artifacts"] = artifacts
            .iter()
            .map(|a| {
                let mut a = a.clone();
                a["parts"] = a["parts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(v03_part)
                    .collect();
                a
            })
            .collect();
    }
    out
}

fn v03_state(state: &str) -> String {
    state
        .strip_prefix("TASK_STATE_")
        .unwrap_or("unknown")
        .to_lowercase()
        .replace('_', "-")
}

fn v03_message(message: &Value) -> Value {
    let mut out = message.clone();
    out["kind"] = json!("message");
    out["role"] = json!(if message["role"] == "ROLE_USER" {
        "user"
    } else {
        "agent"
    });
    out["parts"] = message["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(v03_part)
        .collect();
    out
}

fn v03_part(part: &Value) -> Value {
    if let Some(text) = part.get("text") {
        return json!({ "kind": "text", "text": text });
    }
    if let Some(data) = part.get("data") {
        return json!({ "kind": "data", "data": data });
    }
    let mut file = Map::new();
    if let Some(name) = part.get("filename") {
        file.insert("name".into(), name.clone());
    }
    if let Some(media) = part.get("mediaType") {
        file.insert("mimeType".into(), media.clone());
    }
    if let Some(url) = part.get("url") {
        file.insert("uri".into(), url.clone());
    }
    if let Some(raw) = part.get("raw") {
        file.insert("bytes".into(), raw.clone());
    }
    json!({ "kind": "file", "file": file })
}
