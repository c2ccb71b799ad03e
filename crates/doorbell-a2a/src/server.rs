//! The gateway: one HTTP server for every station of the bridge. Each station has its Agent
//! Card at `/a2a/<station>/.well-known/agent-card.json` and its JSON-RPC endpoint at
//! `/a2a/<station>`. Every call goes through the bridge API (`View`, `send`) as the caller
//! its bearer token names, and returns once the judge has said its verdict on what it sent.
//!
//! Bounds: a request body of at most twice the line limit, JSON nested at most
//! [`rpc::MAX_DEPTH`] deep, at most [`MAX_STREAMS`] open streams and 256 connections
//! (`listen.rs`). Tokens are compared in constant time and never logged.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State as AxumState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use doorbell_core::{Kind, Request, State};
use doorbell_store::journal::Word;
use doorbell_store::{send, Bridge, View};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;

use crate::proto::{self, Shape};
use crate::rpc::{self, Call, RpcError};
use crate::Error;

/// The most streams open at once.
pub const MAX_STREAMS: usize = 64;
/// The most streams one caller has open at once.
pub const MAX_STREAMS_PER_CALLER: usize = 16;
/// The events a stream holds for a client that reads slowly.
const STREAM_BACKLOG: usize = 256;
/// How long a call waits for the judge's verdict on what it sent.
pub const VERDICT_WITHIN: Duration = Duration::from_secs(5);
/// How long the calls in flight and the streams open have to end once the gateway stops.
pub const STOP_WITHIN: Duration = Duration::from_secs(2);
/// How long a blocking `SendMessage` waits for the task to close or ask for input.
pub const BLOCK_FOR: Duration = Duration::from_secs(60);

/// The gateway's shared state.
pub struct Gateway {
    bridge: Bridge,
    addr: SocketAddr,
    /// Each caller's token and name.
    callers: Vec<(Vec<u8>, String)>,
    /// Bumped whenever the journal (or, with no judge running, an inbox) changes.
    changes: watch::Receiver<u64>,
    streams: Arc<Semaphore>,
    per_caller: std::sync::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>,
}

/// Read a token: a file only its owner can read, of at least 16 characters.
pub(crate) fn read_token(name: &str, path: &std::path::Path) -> Result<String, Error> {
    let bad = |why: String| Error::Token {
        name: name.to_owned(),
        path: path.to_path_buf(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad(format!(
            "others can read it (mode {:o}): chmod 600 it",
            meta.permissions().mode() & 0o777
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let token = text.trim();
    if token.len() < 16 {
        return Err(bad("a token is at least 16 characters".into()));
    }
    Ok(token.to_owned())
}

/// Each caller's token and name: every `[[remote]]` with a `token_file` (one with a `url`
/// too: the same secret is presented there and accepted from there, so two bridges can ask
/// each other).
fn callers(bridge: &Bridge) -> Result<Vec<(Vec<u8>, String)>, Error> {
    let mut callers: Vec<(Vec<u8>, String)> = Vec::new();
    for remote in &bridge.config.remotes {
        let Some(path) = &remote.token_file else {
            continue;
        };
        let token = read_token(&remote.name, path)?;
        if callers
            .iter()
            .any(|(t, _)| t.as_slice() == token.as_bytes())
        {
            return Err(Error::Token {
                name: remote.name.clone(),
                path: path.clone(),
                why: "another [[remote]] has the same token".into(),
            });
        }
        callers.push((token.into_bytes(), remote.name.clone()));
    }
    Ok(callers)
}

/// Make each `[[remote]]`'s inbox: a remote is a station like any other.
pub fn make_remote_inboxes(bridge: &Bridge) -> Result<(), Error> {
    for remote in &bridge.config.remotes {
        match bridge.add_agent(&remote.name) {
            Ok(_) | Err(doorbell_store::Error::AgentExists { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// A thread that follows the bridge and bumps `changes` at every change; with no judge
/// running it judges what arrived first, as a waiting command would.
fn follow(bridge: Bridge, changes: watch::Sender<u64>) -> Result<(), Error> {
    let events = doorbell_daemon::waiter::Events::new(&bridge)?;
    std::thread::Builder::new()
        .name("a2a-changes".into())
        .spawn(move || {
            while events.wait(None) {
                if events.take_unjudged() {
                    if let Err(error) = doorbell_daemon::waiter::judge_if_idle(&bridge) {
                        tracing::warn!(%error, "a2a: judging what arrived");
                    }
                }
                changes.send_modify(|n| *n = n.wrapping_add(1));
                if changes.is_closed() {
                    return;
                }
            }
        })
        .map_err(Error::Thread)?;
    Ok(())
}

/// Bind the gateway's address and get it ready: the callers' tokens read, each
/// `[[remote]]`'s inbox made, the bridge followed.
pub async fn bind(
    bridge: Bridge,
    listen: SocketAddr,
) -> Result<(tokio::net::TcpListener, Arc<Gateway>), Error> {
    let callers = callers(&bridge)?;
    if !listen.ip().is_loopback() && callers.is_empty() {
        return Err(Error::NotLoopback { addr: listen });
    }
    if callers.is_empty() {
        tracing::warn!(
            "a2a: no [[remote]] has a token_file, so every call will be refused (docs/A2A.md)"
        );
    }
    make_remote_inboxes(&bridge)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| Error::Bind {
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: listen,
        source,
    })?;
    let (tx, changes) = watch::channel(0);
    follow(bridge.clone(), tx)?;
    let gateway = Gateway {
        bridge,
        addr,
        callers,
        changes,
        streams: Arc::new(Semaphore::new(MAX_STREAMS)),
        per_caller: std::sync::Mutex::default(),
    };
    Ok((listener, Arc::new(gateway)))
}

impl Gateway {
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Serve until `shutdown` completes, then give the calls in flight [`STOP_WITHIN`] to end.
/// Streams never end of themselves: they are cut then, and their clients subscribe again
/// to a gateway that runs.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let addr = gateway.addr;
    let app = Router::new()
        .route("/a2a/{station}/.well-known/agent-card.json", get(card))
        .route("/a2a/{station}", post(call))
        .with_state(gateway);
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = axum::serve(crate::listen::Bounded::new(listener), app).with_graceful_shutdown(
        async move {
            shutdown.await;
            let _ = stopping.send(());
        },
    );
    let cut = async move {
        match stopped.await {
            Ok(()) => tokio::time::sleep(STOP_WITHIN).await,
            // The server ended on its own.
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        served = std::future::IntoFuture::into_future(served) => served.map_err(|source| Error::Bind { addr, source }),
        () = cut => Ok(()),
    }
}

type Shared = AxumState<Arc<Gateway>>;

/// Whether `station` is a station of the bridge with an inbox.
fn is_station(bridge: &Bridge, station: &str) -> bool {
    doorbell_core::is_agent_name(station)
        && bridge.require_inbox(station).is_ok()
        && bridge
            .registry()
            .is_ok_and(|registry| registry.is_station(station))
}

fn no_station(station: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!("no station '{station}' on this bridge\n"),
    )
        .into_response()
}

/// The base URL callers reach this gateway at: the `Host` they used, else the bound address.
fn base_url(gateway: &Gateway, headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .map_or_else(|| gateway.addr.to_string(), str::to_owned);
    // Behind a TLS proxy the card must send callers (and their tokens) to https.
    let scheme = match headers
        .get("X-Forwarded-Proto")
        .and_then(|h| h.to_str().ok())
    {
        Some(proto) if proto.eq_ignore_ascii_case("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}")
}

async fn card(
    AxumState(gateway): Shared,
    Path(station): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !is_station(&gateway.bridge, &station) {
        return no_station(&station);
    }
    let url = format!("{}/a2a/{station}", base_url(&gateway, &headers));
    Json(proto::agent_card(&gateway.bridge.config, &station, &url)).into_response()
}

/// The caller a request's bearer token names.
fn caller(gateway: &Gateway, headers: &HeaderMap) -> Result<String, &'static str> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err("no bearer token: send Authorization: Bearer <your token>");
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .ok_or("the Authorization header must be Bearer <token>")?
        .1
        .trim()
        .as_bytes();
    let mut found = None;
    for (known, name) in &gateway.callers {
        if constant_time_eq(known, token) {
            found = Some(name);
        }
    }
    found.cloned().ok_or("this token names no caller")
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unauthorized(why: &str) -> Response {
    let body = RpcError::invalid_request(why).response(&Value::Null);
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        Json(body),
    )
        .into_response()
}

/// A JSON-RPC error, with HTTP 200 as the binding wants (clients read the error then).
fn error(id: &Value, error: &RpcError) -> Response {
    Json(error.response(id)).into_response()
}

async fn call(
    AxumState(gateway): Shared,
    Path(station): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !is_station(&gateway.bridge, &station) {
        return no_station(&station);
    }
    let caller = match caller(&gateway, &headers) {
        Ok(caller) => caller,
        Err(why) => return unauthorized(why),
    };
    let limit = gateway.bridge.max_line_bytes() * 2;
    let Ok(body) = axum::body::to_bytes(body, limit).await else {
        return error(
            &Value::Null,
            &RpcError::invalid_request(format!(
                "the request is over {limit} bytes (twice the bridge's line limit)"
            )),
        );
    };
    let call = match rpc::parse(&body) {
        Ok(call) => call,
        Err((id, e)) => return error(&id, &e),
    };
    // No header at all is taken as 1.0; an empty one means 0.3, as the spec says.
    if let Some(version) = headers
        .get("A2A-Version")
        .map(|v| v.to_str().unwrap_or("?"))
    {
        if !matches!(version.trim(), "1.0" | "1") {
            let version = if version.trim().is_empty() {
                "0.3 (an empty A2A-Version)"
            } else {
                version
            };
            return error(&call.id, &RpcError::version_not_supported(version));
        }
    }
    tracing::debug!(method = %call.method, %caller, %station, "a2a call");
    let who = Who {
        gateway,
        station,
        caller,
    };
    match dispatch(who, call).await {
        Ok(response) => response,
        Err((id, e)) => error(&id, &e),
    }
}

/// Who calls, at which station, through which gateway.
#[derive(Clone)]
struct Who {
    gateway: Arc<Gateway>,
    station: String,
    caller: String,
}

async fn dispatch(who: Who, call: Call) -> Result<Response, (Value, RpcError)> {
    let Call { id, method, params } = call;
    let fail = |e: RpcError| (id.clone(), e);
    let answer = |value: Value| Json(rpc::result(&id, &value)).into_response();
    match method.as_str() {
        "GetTask" => {
            let task_id = task_id(&params).map_err(fail)?;
            let history = history_length(&params).map_err(fail)?;
            let shape = Shape {
                history,
                artifacts: true,
            };
            let task = blocking(move || {
                let view = View::open(&who.gateway.bridge)?;
                let request = visible(&view, &who, &task_id)?;
                task_of(&view, &request, shape)
            })
            .await
            .map_err(fail)?;
            Ok(answer(task))
        }
        "ListTasks" => {
            let listed = blocking(move || list(&who, &params)).await.map_err(fail)?;
            Ok(answer(listed))
        }
        "CancelTask" => {
            let task_id = task_id(&params).map_err(fail)?;
            let task = cancel(&who, task_id).await.map_err(fail)?;
            Ok(answer(task))
        }
        "SendMessage" => {
            // A blocking send takes its place among the streams before it sends anything.
            let blocks = !return_immediately(&params).map_err(fail)?;
            let waiting = if blocks {
                Some(stream_permit(&who).map_err(fail)?)
            } else {
                None
            };
            let (sent, shape) = send_message(&who, &params).await.map_err(fail)?;
            let sent = match sent {
                Sent::Task(task) => task,
                Sent::Note { id, context } => {
                    return Ok(answer(json!({ "message": delivered(&who, &id, &context) })))
                }
            };
            if waiting.is_some() {
                settled(&who, &sent).await.map_err(fail)?;
            }
            let task = current_task(&who, sent, shape).await.map_err(fail)?;
            Ok(answer(json!({ "task": task })))
        }
        "SendStreamingMessage" => {
            let permit = stream_permit(&who).map_err(fail)?;
            let (sent, _) = send_message(&who, &params).await.map_err(fail)?;
            let sent = match sent {
                Sent::Task(task) => task,
                Sent::Note { id: note, context } => {
                    let delivered = delivered(&who, &note, &context);
                    let only = event(&id, &note, &json!({ "message": delivered }));
                    let events = tokio_stream::iter([Ok::<_, Infallible>(only)]);
                    return Ok(Sse::new(events).into_response());
                }
            };
            Ok(stream(who, sent, id.clone(), permit).await.map_err(fail)?)
        }
        "SubscribeToTask" => {
            let task_id = task_id(&params).map_err(fail)?;
            let permit = stream_permit(&who).map_err(fail)?;
            let check = who.clone();
            let checked = task_id.clone();
            blocking(move || {
                let view = View::open(&check.gateway.bridge)?;
                let request = visible(&view, &check, &checked)?;
                if request.state.is_terminal() {
                    return Err(RpcError::unsupported(format!(
                        "task '{checked}' is {}: a closed task has no updates to stream",
                        request.state.as_str()
                    )));
                }
                Ok(())
            })
            .await
            .map_err(fail)?;
            Ok(stream(who, task_id, id.clone(), permit)
                .await
                .map_err(fail)?)
        }
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => Err(fail(RpcError::push_not_supported())),
        "GetExtendedAgentCard" => Err(fail(RpcError::extended_card_not_configured())),
        other => Err(fail(RpcError::method_not_found(other))),
    }
}

/// Run store work off the async runtime; a store error is an internal error that says what.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RpcError> + Send + 'static,
) -> Result<T, RpcError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|join| Err(RpcError::internal(join.to_string())))
}

impl From<doorbell_store::Error> for RpcError {
    fn from(error: doorbell_store::Error) -> RpcError {
        match error {
            doorbell_store::Error::Refused { message } => RpcError::invalid_params(message),
            other => RpcError::internal(other.to_string()),
        }
    }
}

fn task_id(params: &Value) -> Result<String, RpcError> {
    params
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| RpcError::invalid_params("params.id (the task's id) is required"))
}

/// `configuration.returnImmediately`; a configuration that is not an object, or a flag that
/// is not a boolean, is invalid params (taken as absent, the call would block for a minute
/// after its message was sent).
fn return_immediately(params: &Value) -> Result<bool, RpcError> {
    match params.get("configuration") {
        None | Some(Value::Null) => Ok(false),
        Some(configuration @ Value::Object(_)) => Ok(optional(
            configuration,
            "returnImmediately",
            Value::as_bool,
            "true or false",
        )?
        .unwrap_or(false)),
        Some(_) => Err(RpcError::invalid_params("configuration must be an object")),
    }
}

/// Whether a send's configuration asks for push notifications (1.0's
/// `taskPushNotificationConfig`, 0.3's `pushNotificationConfig`). It is refused as the push
/// methods are, before anything is sent: taken in silence, the caller would wait for calls
/// that never come.
fn asks_for_pushes(configuration: Option<&Value>) -> bool {
    configuration.is_some_and(|configuration| {
        ["taskPushNotificationConfig", "pushNotificationConfig"]
            .iter()
            .any(|key| configuration.get(key).is_some_and(|push| !push.is_null()))
    })
}

fn history_length(params: &Value) -> Result<Option<usize>, RpcError> {
    optional(
        params,
        "historyLength",
        |n| n.as_u64().map(|n| n as usize),
        "a number of messages",
    )
}

/// The field `key` of `params` read by `read`, `None` when absent or null; any other type is
/// invalid params, not "no filter".
fn optional<'a, T>(
    params: &'a Value,
    key: &str,
    read: impl Fn(&'a Value) -> Option<T>,
    what: &str,
) -> Result<Option<T>, RpcError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => read(value)
            .map(Some)
            .ok_or_else(|| RpcError::invalid_params(format!("{key} must be {what}"))),
    }
}

/// Request `id` when the caller may see it: a request from the caller to this station.
/// Any other is "not found", so a caller learns nothing of another's tasks.
fn visible(view: &View, who: &Who, id: &str) -> Result<Request, RpcError> {
    match view.request(id) {
        Some(request) if request.addressee == who.station && request.requester == who.caller => {
            Ok(request.into_owned())
        }
        _ => Err(RpcError::task_not_found(id)),
    }
}

/// A request between the caller and the station, whichever of them asked: what a note may
/// be about. Any other is no task of the caller's.
fn between_sides(view: &View, who: &Who, id: &str) -> Result<Request, RpcError> {
    match view.request(id) {
        Some(request)
            if (request.addressee == who.station && request.requester == who.caller)
                || (request.addressee == who.caller
                    && request.requester_station() == who.station) =>
        {
            Ok(request.into_owned())
        }
        _ => Err(RpcError::task_not_found(id)),
    }
}

fn task_of(view: &View, request: &Request, shape: Shape) -> Result<Value, RpcError> {
    let conversation = between(view, request)?;
    Ok(proto::task_json(request, &conversation, shape))
}

/// The lines of a request between its two sides: the caller's, and those to the caller.
/// Lines about it to others (rings to the station, a note to the human) are not the
/// caller's to see.
fn between(view: &View, request: &Request) -> Result<Vec<doorbell_store::view::Message>, RpcError> {
    between_past(view, request, &HashSet::new())
}

/// [`between`], leaving out the lines `seen` names (and reading only the others).
fn between_past(
    view: &View,
    request: &Request,
    seen: &HashSet<String>,
) -> Result<Vec<doorbell_store::view::Message>, RpcError> {
    let client = request.requester_station();
    Ok(view.conversation_past(request, &|m| {
        seen.contains(&m.id)
            || !(m.from == request.requester || m.from == client || m.inbox == client)
    })?)
}

async fn current_task(who: &Who, id: String, shape: Shape) -> Result<Value, RpcError> {
    let who = who.clone();
    blocking(move || {
        let view = View::open(&who.gateway.bridge)?;
        let request = visible(&view, &who, &id)?;
        task_of(&view, &request, shape)
    })
    .await
}

/// `ListTasks`: the caller's requests to this station, filtered, in id order, a page at a
/// time (`pageToken` is the last id of the page before).
fn list(who: &Who, params: &Value) -> Result<Value, RpcError> {
    let context = optional(params, "contextId", Value::as_str, "a string")?;
    let state = match params.get("status") {
        None | Some(Value::Null) => proto::StateFilter::Any,
        Some(status) => proto::parse_state(status)?,
    };
    let after = optional(params, "statusTimestampAfter", Value::as_str, "a string")?
        .map(|t| {
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|t| t.with_timezone(&chrono::Utc))
                .map_err(|_| RpcError::invalid_params("statusTimestampAfter must be RFC 3339"))
        })
        .transpose()?;
    let page_size = match params.get("pageSize") {
        None | Some(Value::Null) => 50,
        Some(n) => match n.as_u64() {
            Some(0) => 50,
            Some(n) if n <= 100 => n as usize,
            _ => {
                return Err(RpcError::invalid_params(format!(
                    "pageSize {n}: a number of tasks from 1 to 100"
                )))
            }
        },
    };
    let token = optional(params, "pageToken", Value::as_str, "a string")?.filter(|t| !t.is_empty());
    let shape = Shape {
        history: Some(history_length(params)?.unwrap_or(0)),
        artifacts: optional(params, "includeArtifacts", Value::as_bool, "a boolean")?
            .unwrap_or(false),
    };
    let view = View::open(&who.gateway.bridge)?;
    // A token is the last task of the page before: one that names no task of the caller's
    // here would give an empty last page, and the caller would take its list for whole.
    if let Some(token) = token {
        visible(&view, who, token).map_err(|_| {
            RpcError::invalid_params(format!(
                "pageToken '{token}' names no task of yours here: pass the nextPageToken of the page before, or none for the first page"
            ))
        })?;
    }
    let matching: Vec<Request> = view
        .requests_to(&who.station, Some(&who.caller))?
        .into_iter()
        .filter(|r| context.is_none_or(|c| r.context_id == c))
        .filter(|r| state.admits(r.state))
        .filter(|r| after.is_none_or(|t| r.state_since > t))
        .collect();
    let total = matching.len();
    let rest: Vec<&Request> = matching
        .iter()
        .filter(|r| token.is_none_or(|t| r.id.as_str() > t))
        .collect();
    let page = &rest[..rest.len().min(page_size)];
    let next = if rest.len() > page.len() {
        page.last().map_or("", |r| r.id.as_str())
    } else {
        ""
    };
    let tasks = page
        .iter()
        .map(|r| task_of(&view, r, shape))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(json!({
        "tasks": tasks,
        "nextPageToken": next,
        "pageSize": page_size,
        "totalSize": total,
    }))
}

/// What a `SendMessage` made: a task (a request, or a line to one), or a note to the station
/// (its id and its thread).
enum Sent {
    Task(String),
    Note { id: String, context: String },
}

/// The gateway's answer to a note: where it went.
fn delivered(who: &Who, note: &str, context: &str) -> Value {
    json!({
        "messageId": format!("{note}.delivered"),
        "contextId": context,
        "role": "ROLE_AGENT",
        "parts": [{ "text": format!("delivered to {}'s inbox as note {note}", who.station) }],
    })
}

/// `SendMessage`'s params as the bridge takes them, sent, and judged: what was made, and
/// what of the task to return.
async fn send_message(who: &Who, params: &Value) -> Result<(Sent, Shape), RpcError> {
    let message = params
        .get("message")
        .ok_or_else(|| RpcError::invalid_params("params.message is required"))?;
    let incoming = proto::incoming(message)?;
    if let Some(claimed) = &incoming.claimed_from {
        if *claimed != who.caller && !known_as(who, claimed) {
            return Err(RpcError::invalid_params(format!(
                "this token is '{}''s: a message over it cannot be from '{claimed}'",
                who.caller
            )));
        }
    }
    let configuration = params.get("configuration");
    if asks_for_pushes(configuration) {
        return Err(RpcError::push_not_supported());
    }
    let shape = Shape {
        history: match configuration {
            Some(c) => history_length(c)?,
            None => None,
        },
        artifacts: true,
    };
    let sender = who.clone();
    let mut changes = who.gateway.changes.clone();
    changes.borrow_and_update();
    let (task, placed, context) = blocking(move || send_incoming(&sender, incoming)).await?;
    if let Err(refused) = judged(who, &placed, changes).await {
        // A line to a task that closed while it was on its way: what a closed task says.
        let closed = match &task {
            Some(task) if *task != placed.id => closed(who, task).await,
            _ => None,
        };
        return Err(match (closed, task) {
            (Some(state), Some(task)) => closed_task(&task, state),
            _ => refused,
        });
    }
    let sent = match task {
        Some(task) => Sent::Task(task),
        None => Sent::Note {
            id: placed.id,
            context,
        },
    };
    Ok((sent, shape))
}

/// Send `incoming` to the station as the caller: a new request, or naming an existing task,
/// the requester's `working` when the task waits for input, else a note to it. Returns the
/// task's id (none for a note to the station), where the line went, and its thread.
fn send_incoming(
    who: &Who,
    incoming: proto::Incoming,
) -> Result<(Option<String>, send::Placed, String), RpcError> {
    let id = incoming.message_id;
    if !doorbell_core::is_id(&id) || doorbell_core::is_reserved_id(&id) {
        return Err(RpcError::invalid_params(format!(
            "messageId '{id}' cannot be a doorbell id (1-128 of A-Z a-z 0-9 . _ -)"
        )));
    }
    let view = View::open(&who.gateway.bridge)?;
    let base = send::Message {
        from: Some(who.caller.clone()),
        id: Some(id.clone()),
        parts: incoming.parts,
        role: Some(incoming.role.to_owned()),
        priority: incoming.priority,
        reply_by: incoming.reply_by,
        ..send::Message::default()
    };
    let (task, message) = match (incoming.task_id, incoming.kind.as_deref()) {
        (None, Some("note")) => {
            let reference = incoming.reference.as_deref();
            let note = note_to(&view, who, reference, incoming.context_id, base)?;
            // Here already: a bridge that asked brought it back from the task's history,
            // and its own forwarder sends it too. Delivered, not written twice.
            let task = note.correlates_to.as_deref();
            if let Some(placed) = sent_before(&view, who, &id, |f| is_note_of(f, who, task))? {
                let context = note.context_id.clone().unwrap_or(id);
                return Ok((None, placed, context));
            }
            (None, note)
        }
        (None, Some(_)) => {
            return Err(RpcError::invalid_params(
                "a response names its task (message.taskId)",
            ))
        }
        (None, None) => (
            Some(id.clone()),
            send::Message {
                to: vec![who.station.clone()],
                kind: Some("request".into()),
                context_id: incoming.context_id,
                ..base
            },
        ),
        (Some(task), kind) => {
            let request = visible(&view, who, &task)?;
            if incoming
                .context_id
                .as_ref()
                .is_some_and(|c| *c != request.context_id)
            {
                return Err(RpcError::invalid_params(format!(
                    "task '{task}' is in context '{}', not the message's",
                    request.context_id
                )));
            }
            if request.state.is_terminal() {
                // A retry of a message the task got before it closed (its answer was lost on
                // the way back): delivered once, and said so again, as a retry while it was
                // open would be.
                let of_task = |f: &_| is_message_of(f, who, Some(&task));
                if let Some(placed) = sent_before(&view, who, &id, of_task)? {
                    return Ok((Some(task), placed, request.context_id.clone()));
                }
                return Err(closed_task(&task, request.state));
            }
            let answer = match (kind, incoming.state.as_deref()) {
                (Some("response"), Some(state)) => Some(state),
                (Some("response"), None) => {
                    return Err(RpcError::invalid_params(
                        "a response needs metadata.state (working, or canceled)",
                    ))
                }
                // The input it asked for: the requester's `working`.
                (None, _) if request.state == State::InputRequired => Some("working"),
                _ => None,
            };
            let message = match answer {
                Some(state) => {
                    let answer = view.answer(&task, Some(who.caller.clone()), state)?;
                    answer_with(answer, base)
                }
                None => send::Message {
                    to: vec![who.station.clone()],
                    kind: Some("note".into()),
                    correlates_to: Some(task.clone()),
                    context_id: Some(request.context_id.clone()),
                    priority: None,
                    reply_by: None,
                    ..base
                },
            };
            (Some(task), message)
        }
    };
    let context = message.context_id.clone().unwrap_or(id);
    let placed = view
        .send_placed(&message)?
        .into_iter()
        .next()
        .ok_or_else(|| RpcError::internal("nothing was sent"))?;
    Ok((task, placed, context))
}

/// The caller's message `id`, accepted already in the station's inbox, when `is_it` says it
/// is the one sent again: a retry, delivered once.
fn sent_before(
    view: &View,
    who: &Who,
    id: &str,
    is_it: impl Fn(&doorbell_store::view::Found) -> bool,
) -> Result<Option<send::Placed>, RpcError> {
    Ok(view.message(id)?.filter(is_it).map(|_| send::Placed {
        id: id.to_owned(),
        inbox: who.station.clone(),
        offset: None,
    }))
}

/// What a message to a closed task is told.
fn closed_task(task: &str, state: State) -> RpcError {
    RpcError::unsupported(format!(
        "task '{task}' is {}: send a note naming it (referenceTaskIds), or a new message",
        state.as_str()
    ))
}

/// A note to the station: about a task between the two sides when it names one (whichever
/// asked, open or closed), and in that task's thread.
fn note_to(
    view: &View,
    who: &Who,
    reference: Option<&str>,
    context: Option<String>,
    base: send::Message,
) -> Result<send::Message, RpcError> {
    let about = reference
        .map(|task| between_sides(view, who, task))
        .transpose()?;
    if let (Some(about), Some(context)) = (&about, &context) {
        if *context != about.context_id {
            return Err(RpcError::invalid_params(format!(
                "task '{}' is in context '{}', not the message's",
                about.id, about.context_id
            )));
        }
    }
    Ok(send::Message {
        to: vec![who.station.clone()],
        kind: Some("note".into()),
        correlates_to: about.as_ref().map(|r| r.id.clone()),
        context_id: about.map(|r| r.context_id).or(context),
        priority: None,
        reply_by: None,
        ..base
    })
}

/// An answer's addressing with the message's id and content.
fn answer_with(answer: send::Message, base: send::Message) -> send::Message {
    send::Message {
        id: base.id,
        parts: base.parts,
        role: base.role,
        ..answer
    }
}

/// Wait for the judge's verdict on the line sent (a retry of a delivered line, not written
/// again, needs none): accepted or a duplicate is fine; refused is the caller's error.
async fn judged(
    who: &Who,
    sent: &send::Placed,
    mut changes: watch::Receiver<u64>,
) -> Result<(), RpcError> {
    let Some(offset) = sent.offset else {
        return Ok(());
    };
    let deadline = Instant::now() + VERDICT_WITHIN;
    loop {
        let bridge = who.gateway.bridge.clone();
        let (id, inbox) = (sent.id.clone(), sent.inbox.clone());
        let verdict =
            blocking(move || Ok(View::open(&bridge)?.verdict_at(&id, &inbox, offset)?)).await?;
        match verdict {
            Some((Word::Refused, reason)) => {
                return Err(RpcError::invalid_params(format!(
                    "the bridge refused it: {}",
                    reason.unwrap_or_default()
                )))
            }
            Some(_) => return Ok(()),
            None => {}
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return Err(RpcError::internal(format!(
                "sent '{}', but the judge gave no verdict within {}s: GetTask will tell",
                sent.id,
                VERDICT_WITHIN.as_secs()
            )));
        }
    }
}

/// A blocking send: wait until the task closes or asks for input, at most [`BLOCK_FOR`].
async fn settled(who: &Who, task: &str) -> Result<(), RpcError> {
    let deadline = Instant::now() + BLOCK_FOR;
    let mut changes = who.gateway.changes.clone();
    loop {
        changes.borrow_and_update();
        let bridge = who.gateway.bridge.clone();
        let id = task.to_owned();
        let state =
            blocking(move || Ok(View::open(&bridge)?.request(&id).map(|r| r.state))).await?;
        if state.is_none_or(|s| s.is_terminal() || proto::is_interrupted(s)) {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return Ok(());
        }
    }
}

/// `CancelTask`: the requester's `canceled`, once the judge accepted it.
async fn cancel(who: &Who, task: String) -> Result<Value, RpcError> {
    let sender = who.clone();
    let mut changes = who.gateway.changes.clone();
    changes.borrow_and_update();
    let checked = task.clone();
    let line = blocking(move || {
        let view = View::open(&sender.gateway.bridge)?;
        let request = visible(&view, &sender, &checked)?;
        if request.state.is_terminal() {
            return Err(RpcError::not_cancelable(&checked, request.state.as_str()));
        }
        let mut answer = view.answer(&checked, Some(sender.caller.clone()), "canceled")?;
        // One id for every try, so a retried cancel is one line; unless that id is no id
        // (the task's own is as long as an id may be) or another message's, when the
        // cancel takes a new one.
        let retry_safe = format!("{checked}.cancel");
        let usable = doorbell_core::is_id(&retry_safe)
            && view
                .message(&retry_safe)?
                .is_none_or(|found| is_cancel_of(&found, &checked, &sender.caller));
        if usable {
            answer.id = Some(retry_safe);
        }
        answer.text = Some(format!("canceled by {} over A2A", sender.caller));
        view.send_placed(&answer)?
            .into_iter()
            .next()
            .ok_or_else(|| RpcError::internal("nothing was sent"))
    })
    .await?;
    if let Err(refused) = judged(who, &line, changes).await {
        // The station's closing answer came first: the task is no longer cancelable.
        return Err(match closed(who, &task).await {
            Some(state) => RpcError::not_cancelable(&task, state.as_str()),
            None => refused,
        });
    }
    current_task(who, task, Shape::FULL).await
}

/// The task's state if it is closed now.
async fn closed(who: &Who, task: &str) -> Option<State> {
    let bridge = who.gateway.bridge.clone();
    let id = task.to_owned();
    blocking(move || Ok(View::open(&bridge)?.request(&id).map(|r| r.state)))
        .await
        .ok()
        .flatten()
        .filter(|s| s.is_terminal())
}

/// Whether `found` is the caller's note to the station about `task`.
fn is_note_of(found: &doorbell_store::view::Found, who: &Who, task: Option<&str>) -> bool {
    is_message_of(found, who, task)
        && found
            .envelope()
            .is_some_and(|envelope| envelope.kind == doorbell_core::Kind::Note)
}

/// Whether `found` is the caller's message to the station about `task` (a note or an
/// answer), accepted already.
fn is_message_of(found: &doorbell_store::view::Found, who: &Who, task: Option<&str>) -> bool {
    found.inbox == who.station
        && found.envelope().is_some_and(|envelope| {
            envelope.from == who.caller && envelope.correlates_to.as_deref() == task
        })
}

/// Whether `claimed` is the caller's name on its own bridge: the station its `[[remote]]`'s
/// url names here. A bridge that this one knows under another name forwards its station's
/// lines as from that station.
fn known_as(who: &Who, claimed: &str) -> bool {
    who.gateway.bridge.config.remotes.iter().any(|remote| {
        remote.name == who.caller
            && remote.url.as_deref().and_then(crate::station_in_url) == Some(claimed)
    })
}

/// Whether `found` is `caller`'s cancel of `task` (a retried `CancelTask` finds its own).
fn is_cancel_of(found: &doorbell_store::view::Found, task: &str, caller: &str) -> bool {
    found.envelope().is_some_and(|envelope| {
        envelope.from == caller
            && envelope.correlates_to.as_deref() == Some(task)
            && envelope.state == Some(doorbell_core::State::Canceled)
    })
}

/// A place among the open streams (a blocking `SendMessage` takes one too): one of
/// [`MAX_STREAMS`] in all and of [`MAX_STREAMS_PER_CALLER`] for the caller.
struct Permit {
    _all: tokio::sync::OwnedSemaphorePermit,
    _caller: tokio::sync::OwnedSemaphorePermit,
}

fn stream_permit(who: &Who) -> Result<Permit, RpcError> {
    let mine = Arc::clone(
        who.gateway
            .per_caller
            .lock()
            .expect("the streams' map is never poisoned")
            .entry(who.caller.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_STREAMS_PER_CALLER))),
    );
    let caller = mine.try_acquire_owned().map_err(|_| {
        RpcError::internal(format!(
            "you have {MAX_STREAMS_PER_CALLER} streams open already: close one, or GetTask"
        ))
    })?;
    let all = Arc::clone(&who.gateway.streams)
        .try_acquire_owned()
        .map_err(|_| {
            RpcError::internal(format!(
                "{MAX_STREAMS} streams are open already: close one, or GetTask"
            ))
        })?;
    Ok(Permit {
        _all: all,
        _caller: caller,
    })
}

/// One SSE event: the JSON-RPC response carrying `result`, with the line's id as its own.
fn event(rpc_id: &Value, id: &str, result: &Value) -> Event {
    Event::default()
        .id(id)
        .data(rpc::result(rpc_id, result).to_string())
}

/// Stream task `task`: the Task as it stands first, then for each line of the station's
/// side an artifact update (for data and files) and a status update, until the task closes
/// or asks for input. A client that reconnects (`SubscribeToTask`) gets the whole history in
/// the first Task, so no update is lost between two streams.
async fn stream(
    who: Who,
    task: String,
    rpc_id: Value,
    permit: Permit,
) -> Result<Response, RpcError> {
    let mut changes = who.gateway.changes.clone();
    changes.borrow_and_update();
    let (request, first, mut sent) = load(&who, &task).await?;
    // A client that falls this far behind (it does not read) loses its stream, and its place.
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(STREAM_BACKLOG);
    let last = sent.last().cloned().unwrap_or_else(|| task.clone());
    tx.send(Ok(event(&rpc_id, &last, &json!({ "task": first }))))
        .await
        .map_err(|_| RpcError::internal("the stream closed"))?;
    tokio::spawn(async move {
        let _permit = permit;
        let mut state = request.state;
        let mut seen: HashSet<String> = sent.drain(..).collect();
        while !(state.is_terminal() || proto::is_interrupted(state)) {
            tokio::select! {
                () = tx.closed() => return,
                gone = changes.changed() => if gone.is_err() { return },
            }
            let Ok((request, conversation)) = conversation(&who, &task, seen.clone()).await else {
                return;
            };
            for message in &conversation {
                if !seen.insert(message.row.id.clone()) {
                    continue;
                }
                if let Some(artifact) = proto::artifact_json(message, &request) {
                    let update = json!({ "artifactUpdate": {
                        "taskId": request.id,
                        "contextId": request.context_id,
                        "artifact": artifact,
                        "lastChunk": true,
                    }});
                    if tx
                        .try_send(Ok(event(&rpc_id, &message.row.id, &update)))
                        .is_err()
                    {
                        return;
                    }
                }
                if message.row.kind == Kind::Response {
                    state = message.row.state.unwrap_or(state);
                }
                let at = chrono::DateTime::from_timestamp_millis(message.row.seen_at)
                    .unwrap_or_default();
                let update = json!({ "statusUpdate": {
                    "taskId": request.id,
                    "contextId": request.context_id,
                    "status": {
                        "state": proto::state_name(state),
                        "message": proto::message_json(message, &request),
                        "timestamp": proto::timestamp(at),
                    },
                }});
                if tx
                    .try_send(Ok(event(&rpc_id, &message.row.id, &update)))
                    .is_err()
                {
                    return;
                }
            }
            state = request.state;
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The task and the ids of its messages so far.
async fn load(who: &Who, task: &str) -> Result<(Request, Value, Vec<String>), RpcError> {
    let (request, conversation) = conversation(who, task, HashSet::new()).await?;
    let ids = conversation.iter().map(|m| m.row.id.clone()).collect();
    let first = proto::task_json(&request, &conversation, Shape::FULL);
    Ok((request, first, ids))
}

/// The task and the lines of its conversation not in `seen`.
async fn conversation(
    who: &Who,
    task: &str,
    seen: HashSet<String>,
) -> Result<(Request, Vec<doorbell_store::view::Message>), RpcError> {
    let who = who.clone();
    let task = task.to_owned();
    blocking(move || {
        let view = View::open(&who.gateway.bridge)?;
        let request = visible(&view, &who, &task)?;
        let conversation = between_past(&view, &request, &seen)?;
        Ok((request, conversation))
    })
    .await
}
