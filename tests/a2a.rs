//! The A2A gateway (DESIGN §11) against the real binary: the official Python SDK as a remote
//! caller of `doorbell a2a serve`, bad requests over raw HTTP, and the gateway's refusals to
//! start unsafely.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::{json, Value};

use crate::util::{python, run, Bridge, Daemon};

const TOKEN: &str = "design-token-0123456789";

/// The config of a bridge whose station `web` is called by the remote `design`.
fn config(bridge: &Bridge, extra: &str) {
    let token = bridge.tmp.path().join("design.token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    bridge.config(&format!(
        r#"
[[agent]]
name = "web"
description = "Builds the web site"
[[agent.skill]]
id = "eta"
name = "ETA"
description = "When a page ships"
tags = ["planning"]

[[remote]]
name = "design"
token_file = "{}"
{extra}
"#,
        token.display()
    ));
}

/// The address in the line `serving A2A on http://ADDR/a2a/<station>`.
fn address(line: &str) -> String {
    let url = line.split("http://").nth(1).unwrap();
    url.split('/').next().unwrap().to_owned()
}

/// `doorbell a2a serve` on a free loopback port, and its address.
fn serve(bridge: &Bridge) -> (Daemon, String) {
    let mut gateway = Daemon::spawn_saying(
        bridge.command(&["a2a", "serve", "--listen", "127.0.0.1:0"]),
        "serving A2A on",
        Duration::from_secs(30),
    );
    let line = gateway.expect_stderr("serving A2A on", Duration::from_secs(1));
    (gateway, address(&line))
}

#[test]
fn the_python_sdk_sends_streams_lists_and_cancels_through_the_gateway() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    config(&bridge, "");
    let (_gateway, addr) = serve(&bridge);
    let mut command = std::process::Command::new(python());
    bridge.env(&mut command);
    command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/a2a_client.py"
        ))
        .arg(env!("CARGO_BIN_EXE_doorbell"))
        .arg(format!("http://{addr}/a2a/web"))
        .arg(TOKEN);
    let ran = run(command, None);
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    let seen: Value = serde_json::from_str(ran.stdout.trim()).unwrap();

    assert_eq!(
        seen["card"],
        json!({"name": "web", "streaming": true, "skills": ["eta"],
               "url": format!("http://{addr}/a2a/web"), "version": "1.0"})
    );
    // The message is a request from design in web's inbox, and web's debt.
    let first = seen["sent"]["id"].as_str().unwrap();
    assert_eq!(seen["sent"]["state"], "TASK_STATE_SUBMITTED");
    let request: Value = serde_json::from_slice(&bridge.lines("web")[0]).unwrap();
    assert_eq!(
        (&request["id"], &request["from"], &request["kind"]),
        (&json!(first), &json!("design"), &json!("request"))
    );
    let debts = seen["debts"]["debts"].as_array().unwrap();
    assert_eq!(debts.len(), 1, "{debts:?}");
    assert_eq!(
        (
            &debts[0]["request"],
            &debts[0]["debtor"],
            &debts[0]["creditor"]
        ),
        (&json!(first), &json!("web"), &json!("design"))
    );
    assert_eq!(
        seen["got"],
        json!({"id": first, "context": first, "state": "TASK_STATE_SUBMITTED"})
    );
    // The stream: the task, web's working, its data as an artifact, then completed.
    assert_eq!(
        seen["streamed"],
        json!([
            {"kind": "task", "state": "TASK_STATE_SUBMITTED", "history": ["And the header?"]},
            {"kind": "status", "state": "TASK_STATE_WORKING", "text": ["on it"]},
            {"kind": "artifact", "data": [{"eta": "Friday"}]},
            {"kind": "status", "state": "TASK_STATE_COMPLETED", "text": ["Friday"]},
        ])
    );
    // Resumed after leaving: the first Task holds what was said meanwhile.
    assert_eq!(
        seen["resumed"],
        json!([
            {"kind": "task", "state": "TASK_STATE_WORKING", "history": ["Which font?", "looking"]},
            {"kind": "status", "state": "TASK_STATE_INPUT_REQUIRED", "text": ["serif or sans?"]},
        ])
    );
    assert_eq!(seen["input"], "TASK_STATE_WORKING");
    assert_eq!(seen["total"], 3);
    assert_eq!(seen["listed"].as_array().unwrap().len(), 3);
    assert_eq!(seen["completed"].as_array().unwrap().len(), 2);
    assert_eq!(seen["pages"], json!([2, 1, ""]));
    assert_eq!(seen["canceled"], "TASK_STATE_CANCELED");
    assert_eq!(seen["cancel_again"], "TaskNotCancelableError");
    assert_eq!(seen["unknown"], "TaskNotFoundError");
    assert_eq!(seen["raw_state"], "TASK_STATE_COMPLETED");
    assert_eq!(
        seen["raw_roles"],
        json!(["ROLE_USER", "ROLE_AGENT", "ROLE_AGENT"])
    );
    // The bridge agrees: the first request canceled by design, nothing owed.
    let shown = bridge.doorbell(&["show", first]).ok().to_owned();
    assert!(shown.contains("canceled"), "{shown}");
    assert!(!bridge.doorbell(&["debts"]).ok().contains(first));
    assert!(bridge.doorbell(&["debts"]).ok().trim().lines().count() <= 1);
}

/// One HTTP/1.1 request over a fresh connection: the status and the body.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.extend([name, ": ", value, "\r\n"]);
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    // A server may answer (and close) before it reads a large body.
    let _ = stream.write_all(body);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

fn rpc(addr: &str, token: Option<&str>, body: &[u8]) -> (u16, Value) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("A2A-Version", "1.0")];
    if let Some(bearer) = &bearer {
        headers.push(("Authorization", bearer));
    }
    let (status, body) = http(addr, "POST", "/a2a/web", &headers, body);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn call(method: &str, params: &Value) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        .to_string()
        .into_bytes()
}

fn send(text: &str, extra: &Value) -> Value {
    let mut message = json!({"messageId": ulid(), "role": "ROLE_USER", "parts": [{"text": text}]});
    for (k, v) in extra.as_object().unwrap() {
        message[k] = v.clone();
    }
    json!({"message": message, "configuration": {"returnImmediately": true}})
}

fn ulid() -> String {
    ulid::Ulid::new().to_string()
}

/// A bad request and the answer it must get.
struct Bad {
    what: &'static str,
    token: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: i64,
}

/// Every kind of bad request, `task` being a task of the caller's.
#[allow(clippy::too_many_lines)] // a table: one row per bad request
fn bad_requests(task: &str) -> Vec<Bad> {
    let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    let huge = call(
        "SendMessage",
        &send(&"x".repeat(2 * 1024 * 1024 + 10), &json!({})),
    );
    let mut cases = vec![
        (
            "malformed JSON",
            Some(TOKEN),
            b"{\"jsonrpc\":".to_vec(),
            200,
            -32700,
        ),
        (
            "not a request object",
            Some(TOKEN),
            b"[1,2]".to_vec(),
            200,
            -32600,
        ),
        (
            "no method",
            Some(TOKEN),
            br#"{"jsonrpc":"2.0","id":1}"#.to_vec(),
            200,
            -32600,
        ),
        ("deep JSON", Some(TOKEN), deep.into_bytes(), 200, -32600),
        ("oversized body", Some(TOKEN), huge, 200, -32600),
        (
            "unknown method",
            Some(TOKEN),
            call("message/send", &send("hi", &json!({}))),
            200,
            -32601,
        ),
        (
            "no token",
            None,
            call("SendMessage", &send("hi", &json!({}))),
            401,
            -32600,
        ),
        (
            "wrong token",
            Some("not-the-token-at-all"),
            call("SendMessage", &send("hi", &json!({}))),
            401,
            -32600,
        ),
        (
            "another caller's name",
            Some(TOKEN),
            call(
                "SendMessage",
                &send("hi", &json!({"metadata": {"from": "human"}})),
            ),
            200,
            -32602,
        ),
        (
            "a reserved id",
            Some(TOKEN),
            call(
                "SendMessage",
                &json!({"message": {"messageId": "debt-loop:x", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}),
            ),
            200,
            -32602,
        ),
        (
            "no parts",
            Some(TOKEN),
            call(
                "SendMessage",
                &json!({"message": {"messageId": ulid(), "role": "ROLE_USER", "parts": []}}),
            ),
            200,
            -32602,
        ),
        // Base64's letters, but no base64 a strict client reads back.
        (
            "raw one letter past a multiple of four",
            Some(TOKEN),
            call(
                "SendMessage",
                &json!({"message": {"messageId": ulid(), "role": "ROLE_USER", "parts": [{"raw": "A"}]}}),
            ),
            200,
            -32602,
        ),
        (
            "raw over-padded",
            Some(TOKEN),
            call(
                "SendMessage",
                &json!({"message": {"messageId": ulid(), "role": "ROLE_USER", "parts": [{"raw": "A===="}]}}),
            ),
            200,
            -32602,
        ),
        (
            "unknown task",
            Some(TOKEN),
            call("GetTask", &json!({"id": "no-such-task"})),
            200,
            -32001,
        ),
        (
            "a message to an unknown task",
            Some(TOKEN),
            call(
                "SendMessage",
                &send("hi", &json!({"taskId": "no-such-task"})),
            ),
            200,
            -32001,
        ),
        (
            "another context",
            Some(TOKEN),
            call(
                "SendMessage",
                &send("hi", &json!({"taskId": task, "contextId": "elsewhere"})),
            ),
            200,
            -32602,
        ),
        (
            "push notifications",
            Some(TOKEN),
            call(
                "CreateTaskPushNotificationConfig",
                &json!({"taskId": task, "url": "http://x"}),
            ),
            200,
            -32003,
        ),
        (
            "a note about an unknown task",
            Some(TOKEN),
            call(
                "SendMessage",
                &send(
                    "hi",
                    &json!({"referenceTaskIds": ["no-such-task"], "metadata": {"kind": "note"}}),
                ),
            ),
            200,
            -32001,
        ),
        (
            "a note about two tasks",
            Some(TOKEN),
            call(
                "SendMessage",
                &send(
                    "hi",
                    &json!({"referenceTaskIds": [task, task], "metadata": {"kind": "note"}}),
                ),
            ),
            200,
            -32602,
        ),
        (
            "an unknown state",
            Some(TOKEN),
            call("ListTasks", &json!({"status": "completed"})),
            200,
            -32602,
        ),
    ];
    // A filter or token of the wrong type is refused, never taken for "none" (which would
    // list every task, or the first page again).
    for (what, params) in [
        ("a contextId that is no string", json!({"contextId": 7})),
        ("a pageToken that is no string", json!({"pageToken": 7})),
        // A token naming no task would give an empty last page: the list taken for whole.
        (
            "a pageToken naming no task",
            json!({"pageToken": "no-such-task"}),
        ),
        (
            "a timestamp that is no string",
            json!({"statusTimestampAfter": 7}),
        ),
        (
            "includeArtifacts that is no boolean",
            json!({"includeArtifacts": "yes"}),
        ),
    ] {
        cases.push((what, Some(TOKEN), call("ListTasks", &params), 200, -32602));
    }
    // A configuration or a part's name of the wrong type is refused, never dropped (a
    // dropped returnImmediately made the call block for a minute after appending).
    let message = |parts: Value| json!({"messageId": ulid(), "role": "ROLE_USER", "parts": parts});
    let text = || json!([{"text": "hi"}]);
    for (what, params) in [
        (
            "returnImmediately that is no boolean",
            json!({"message": message(text()), "configuration": {"returnImmediately": "true"}}),
        ),
        (
            "a configuration that is no object",
            json!({"message": message(text()), "configuration": "fast"}),
        ),
        (
            "a filename that is no string",
            json!({"message": message(json!([{"url": "http://x/y.pdf", "filename": 5}])),
                   "configuration": {"returnImmediately": true}}),
        ),
        (
            "a mediaType that is no string",
            json!({"message": message(json!([{"url": "http://x/y.pdf", "mediaType": ["a"]}])),
                   "configuration": {"returnImmediately": true}}),
        ),
        // On a text or data part too: the official client's parser refuses them there.
        (
            "a text part's mediaType that is no string",
            json!({"message": message(json!([{"text": "x", "mediaType": 3}])),
                   "configuration": {"returnImmediately": true}}),
        ),
        (
            "a data part's filename that is no string",
            json!({"message": message(json!([{"data": {"a": 1}, "filename": ["f"]}])),
                   "configuration": {"returnImmediately": true}}),
        ),
    ] {
        cases.push((what, Some(TOKEN), call("SendMessage", &params), 200, -32602));
    }
    // A send that asks for push notifications is refused as the push methods are, in either
    // version's name, before its message is sent.
    for (what, method, key) in [
        (
            "a send that asks for pushes",
            "SendMessage",
            "taskPushNotificationConfig",
        ),
        (
            "a stream that asks for pushes",
            "SendStreamingMessage",
            "taskPushNotificationConfig",
        ),
        (
            "a send that asks for pushes as 0.3 did",
            "SendMessage",
            "pushNotificationConfig",
        ),
    ] {
        let params = json!({"message": message(text()),
                            "configuration": {"returnImmediately": true, key: {"url": "http://x/hook"}}});
        cases.push((what, Some(TOKEN), call(method, &params), 200, -32003));
    }
    cases
        .into_iter()
        .map(|(what, token, body, status, code)| Bad {
            what,
            token,
            body,
            status,
            code,
        })
        .collect()
}

/// `ListTasks` a page at a time: each page's `nextPageToken` gives the next, and every task
/// is listed once; the last page has no token.
#[test]
fn list_tasks_pages_through_every_task_by_its_tokens() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    config(&bridge, "");
    let (_gateway, addr) = serve(&bridge);
    let mut sent: Vec<String> = (0..3)
        .map(|n| {
            let (status, ok) = rpc(
                &addr,
                Some(TOKEN),
                &call("SendMessage", &send(&format!("request {n}"), &json!({}))),
            );
            assert_eq!(status, 200, "{ok}");
            ok["result"]["task"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    sent.sort();
    let mut listed = Vec::new();
    let mut token = String::new();
    for _ in 0..sent.len() {
        let (status, page) = rpc(
            &addr,
            Some(TOKEN),
            &call("ListTasks", &json!({"pageSize": 2, "pageToken": token})),
        );
        assert_eq!(status, 200, "{page}");
        let result = &page["result"];
        assert!(result.is_object(), "{page}");
        listed.extend(
            result["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_str().unwrap().to_owned()),
        );
        token = result["nextPageToken"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if token.is_empty() {
            break;
        }
    }
    assert!(token.is_empty(), "more pages than tasks: {listed:?}");
    assert_eq!(listed, sent);
}

#[test]
fn bad_requests_get_the_specs_errors_and_append_nothing() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    config(&bridge, "[a2a]\nlisten = \"127.0.0.1:0\"\n");
    // The daemon runs the gateway, as the config asks.
    let mut daemon = Daemon::start(&bridge, &[]);
    let addr = address(&daemon.expect_stderr("serving A2A on", Duration::from_secs(5)));
    let (status, ok) = rpc(
        &addr,
        Some(TOKEN),
        &call("SendMessage", &send("a fine request", &json!({}))),
    );
    assert_eq!(status, 200, "{ok}");
    let task = ok["result"]["task"]["id"].as_str().unwrap().to_owned();
    let before: Vec<Vec<Vec<u8>>> = ["web", "design", "human"]
        .iter()
        .map(|n| bridge.lines(n))
        .collect();

    for Bad {
        what,
        token,
        body,
        status: want_status,
        code: want_code,
    } in bad_requests(&task)
    {
        let (status, answer) = rpc(&addr, token, &body);
        assert_eq!(status, want_status, "{what}: {answer}");
        assert_eq!(answer["error"]["code"], want_code, "{what}: {answer}");
        assert_eq!(answer["jsonrpc"], "2.0", "{what}: {answer}");
        assert!(answer.get("result").is_none(), "{what}: {answer}");
    }
    // A version this gateway does not speak; an empty one is 0.3, as the spec says.
    for version in ["0.3", ""] {
        let (status, body) = http(
            &addr,
            "POST",
            "/a2a/web",
            &[
                ("A2A-Version", version),
                ("Authorization", &format!("Bearer {TOKEN}")),
            ],
            &call("GetTask", &json!({"id": task})),
        );
        assert_eq!(status, 200);
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["error"]["code"],
            -32009,
            "A2A-Version {version:?}: {body}"
        );
    }
    // A station that does not exist has no endpoint and no card.
    let (status, _) = http(
        &addr,
        "GET",
        "/a2a/nobody/.well-known/agent-card.json",
        &[],
        b"",
    );
    assert_eq!(status, 404);

    // A cancel of a closed task is TaskNotCancelable, and appends nothing either.
    bridge.reply(&task, "web", "completed", &[], "done");
    bridge.doorbell(&["wait", &task, "--timeout", "10s"]).ok();
    let before: Vec<Vec<Vec<u8>>> = {
        let mut after_reply = before;
        after_reply[1] = bridge.lines("design");
        after_reply
    };
    let (_, answer) = rpc(&addr, Some(TOKEN), &call("GetTask", &json!({"id": task})));
    assert_eq!(answer["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    let (status, answer) = rpc(
        &addr,
        Some(TOKEN),
        &call("CancelTask", &json!({"id": task})),
    );
    assert_eq!(
        (status, &answer["error"]["code"]),
        (200, &json!(-32002)),
        "{answer}"
    );
    let (_, answer) = rpc(
        &addr,
        Some(TOKEN),
        &call("SendMessage", &send("more", &json!({"taskId": task}))),
    );
    assert_eq!(answer["error"]["code"], -32004, "{answer}");
    let after: Vec<Vec<Vec<u8>>> = ["web", "design", "human"]
        .iter()
        .map(|n| bridge.lines(n))
        .collect();
    assert_eq!(after, before, "a bad request appended a line");
    // The token is never logged.
    assert!(!daemon.stderr_so_far().join("\n").contains(TOKEN));
}

#[test]
fn the_gateway_will_not_start_unsafely() {
    let bridge = Bridge::with_agents(&["web"]);
    bridge.config("");
    let open = bridge.doorbell(&["a2a", "serve", "--listen", "0.0.0.0:0"]);
    assert_ne!(open.code, 0);
    assert!(open.stderr.contains("not loopback"), "{}", open.stderr);
    config(&bridge, "");
    let token = bridge.tmp.path().join("design.token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let readable = bridge.doorbell(&["a2a", "serve", "--listen", "127.0.0.1:0"]);
    assert_ne!(readable.code, 0);
    assert!(readable.stderr.contains("chmod 600"), "{}", readable.stderr);
    assert!(!readable.stderr.contains(TOKEN));
}

#[test]
fn export_gives_the_ledgers_requests_as_a2a_tasks() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let ask = |text: &str| bridge.request("design", "web", text);
    let done = ask("ETA for the footer?");
    let open = ask("And the header?");
    bridge.reply(
        &done,
        "web",
        "completed",
        &["--data", r#"{"eta":"Friday"}"#],
        "Friday",
    );
    let export = |args: &[&str]| -> Vec<Value> {
        let mut all = vec!["export", "--a2a"];
        all.extend_from_slice(args);
        bridge
            .doorbell(&all)
            .ok()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let tasks = export(&[]);
    let mut ids = vec![done.clone(), open.clone()];
    ids.sort();
    assert_eq!(
        tasks
            .iter()
            .map(|t| t["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ids
    );
    let finished = tasks.iter().find(|t| t["id"] == done.as_str()).unwrap();
    assert_eq!(finished["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(finished["history"].as_array().unwrap().len(), 2);
    assert_eq!(
        finished["artifacts"][0]["parts"][0]["data"],
        json!({"eta": "Friday"})
    );
    // Every line parses strictly as the SDK's protobuf Task.
    let mut strict = std::process::Command::new(python());
    strict.arg("-c").arg(
        "import json, sys\nfrom google.protobuf import json_format\nfrom a2a.types import a2a_pb2 as pb\nfor line in sys.stdin:\n    json_format.ParseDict(json.loads(line), pb.Task())\nprint('parsed')",
    );
    let lines = bridge.doorbell(&["export", "--a2a"]).ok().to_owned();
    let parsed = run(strict, Some(lines.as_bytes()));
    assert_eq!(parsed.stdout.trim(), "parsed", "{}", parsed.stderr);
    // As A2A 0.3: kinds, lowercase states and roles, files nested.
    let old = export(&["--version", "0.3"]);
    let finished = old.iter().find(|t| t["id"] == done.as_str()).unwrap();
    assert_eq!(
        (&finished["kind"], &finished["status"]["state"]),
        (&json!("task"), &json!("completed"))
    );
    assert_eq!(finished["history"][0]["kind"], "message");
    assert_eq!(finished["history"][0]["role"], "user");
    assert_eq!(finished["history"][1]["role"], "agent");
    assert_eq!(finished["history"][1]["parts"][0]["kind"], "text");
    assert_eq!(finished["history"][1]["parts"][1]["kind"], "data");
    // --since: the requests open now or closed since then.
    assert_eq!(export(&["--since", "1h"]).len(), 2);
    assert_eq!(export(&["--since", "2999-01-01T00:00:00Z"]).len(), 1);
}

/// Read from `stream` until what was read so far satisfies `enough`.
fn read_until(stream: &mut std::net::TcpStream, enough: impl Fn(&str) -> bool) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !enough(&String::from_utf8_lossy(&seen)) {
        let n = match stream.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            read => read.unwrap(),
        };
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// A gateway over a fresh bridge, and a task design sent it with `text`: the bridge, the
/// gateway, its address and the task's id.
fn served_task(text: &str) -> (Bridge, Daemon, String, String) {
    let bridge = Bridge::with_agents(&["web", "human"]);
    config(&bridge, "");
    let (gateway, addr) = serve(&bridge);
    let (_, sent) = rpc(
        &addr,
        Some(TOKEN),
        &call("SendMessage", &send(text, &json!({}))),
    );
    let task = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    (bridge, gateway, addr, task)
}

#[test]
fn open_streams_are_bounded() {
    let (_bridge, _gateway, addr, task) = served_task("a long one");
    let subscribe = call("SubscribeToTask", &json!({"id": task}));
    let open = |n: usize| -> Vec<(std::net::TcpStream, String)> {
        (0..n)
            .map(|_| {
                let mut stream = std::net::TcpStream::connect(&addr).unwrap();
                stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let head = format!(
                    "POST /a2a/web HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    subscribe.len()
                );
                stream.write_all(head.as_bytes()).unwrap();
                stream.write_all(&subscribe).unwrap();
                // The head of the answer, then the first event (the task) or the error.
                let seen = read_until(&mut stream, |text| {
                    text.contains("\r\n\r\n")
                        && (text.contains("\"task\"") || text.contains("\"error\""))
                        && text.trim_end().ends_with(['}', '\n'])
                });
                (stream, seen)
            })
            .collect()
    };
    // One caller holds at most 16 streams (and all callers together 64).
    let streams = open(16);
    for (_, head) in &streams {
        assert!(
            head.contains("text/event-stream") && head.contains("\"task\""),
            "{head}"
        );
    }
    let over = open(1);
    assert!(over[0].1.contains("\"code\":-32603"), "{}", over[0].1);
    assert!(
        over[0].1.contains("you have 16 streams open"),
        "{}",
        over[0].1
    );
}

#[test]
fn a_send_is_answered_by_the_verdict_on_its_own_line() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    config(&bridge, "");
    // A line with the id "m-1" was refused before (from an unknown sender).
    bridge.append_raw(
        "web",
        format!(
            "{}\n",
            crate::util::line("m-1", "nobody", "web", "note", "")
        )
        .as_bytes(),
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    let (_gateway, addr) = serve(&bridge);
    // A new message with that id is judged on its own: accepted, not "refused".
    let message = json!({"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
                         "configuration": {"returnImmediately": true}});
    let (status, answer) = rpc(&addr, Some(TOKEN), &call("SendMessage", &message));
    assert_eq!(status, 200);
    assert_eq!(answer["result"]["task"]["id"], "m-1", "{answer}");
    assert_eq!(
        answer["result"]["task"]["status"]["state"],
        "TASK_STATE_SUBMITTED"
    );
}

#[test]
fn a_tasks_history_holds_only_what_passed_between_its_two_sides() {
    let (bridge, _gateway, addr, task) = served_task("ETA?");
    // web tells the human about it, then answers design.
    bridge
        .doorbell(&[
            "send",
            "--to",
            "human",
            "--from",
            "web",
            "--correlates-to",
            &task,
            "--kind",
            "note",
            "design wants an ETA",
        ])
        .ok();
    bridge.reply(&task, "web", "working", &[], "on it");
    let (_, got) = rpc(&addr, Some(TOKEN), &call("GetTask", &json!({"id": task})));
    let texts: Vec<&str> = got["result"]["history"]
        .as_array()
        .unwrap_or_else(|| panic!("{got}"))
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(texts, ["ETA?", "on it"], "{got}");
}

#[test]
fn connections_are_bounded_and_a_waiting_one_is_served_when_a_place_frees() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    config(&bridge, "");
    let (_gateway, addr) = serve(&bridge);
    // 256 clients connect and say nothing: every place is taken.
    let mut idle: Vec<std::net::TcpStream> = (0..256)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let mut waiting = std::net::TcpStream::connect(&addr).unwrap();
    let get = format!(
        "GET /a2a/web/.well-known/agent-card.json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    );
    waiting.write_all(get.as_bytes()).unwrap();
    // An observation window: with no place, the 257th is not served.
    waiting
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 64];
    let unserved = waiting.read(&mut buf);
    assert!(
        matches!(&unserved, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "{unserved:?}"
    );
    // One client leaves: the waiting one gets its place and its card.
    drop(idle.pop());
    waiting
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let card = read_until(&mut waiting, |text| text.contains("\"skills\""));
    assert!(card.starts_with("HTTP/1.1 200"), "{card}");
    drop(idle);
}

#[test]
fn only_a_bridge_with_remote_callers_keeps_the_index_list_tasks_needs() {
    let has_pair_index = |bridge: &Bridge| -> bool {
        bridge.doorbell(&["daemon", "--once"]).ok();
        let index = bridge.dir().join(".doorbell/index.db");
        let mut query = std::process::Command::new("python3");
        query.arg("-c").arg(format!(
            "import sqlite3; c = sqlite3.connect({:?}); print(c.execute(\"SELECT count(*) FROM sqlite_master WHERE name = 'requests_by_pair'\").fetchone()[0])",
            index.display().to_string()
        ));
        run(query, None).stdout.trim() == "1"
    };
    let plain = Bridge::with_agents(&["web", "human"]);
    assert!(!has_pair_index(&plain));
    let served = Bridge::with_agents(&["web", "human"]);
    config(&served, "");
    assert!(has_pair_index(&served));
}

/// `CancelTask` cancels whatever the task's id: one as long as an id may be (its retry-safe
/// cancel id would be longer), and one whose retry-safe cancel id another message has
/// taken already. A retried cancel of a canceled task is "not cancelable", as before.
#[test]
fn a_task_can_be_canceled_whatever_its_id() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    config(&bridge, "");
    let (_gateway, addr) = serve(&bridge);
    let long = format!("01{}", "L".repeat(126));
    let taken = ulid();
    for task in [&long, &taken] {
        let (_, sent) = rpc(
            &addr,
            Some(TOKEN),
            &call(
                "SendMessage",
                &send("cancel me", &json!({"messageId": task})),
            ),
        );
        assert_eq!(sent["result"]["task"]["id"], json!(task), "{sent}");
    }
    // A message of the caller's own that holds the id a cancel of `taken` would take.
    let (_, note) = rpc(
        &addr,
        Some(TOKEN),
        &call(
            "SendMessage",
            &send(
                "an id of my own",
                &json!({"messageId": format!("{taken}.cancel")}),
            ),
        ),
    );
    assert!(note.get("result").is_some(), "{note}");
    for task in [&long, &taken] {
        let (status, canceled) = rpc(
            &addr,
            Some(TOKEN),
            &call("CancelTask", &json!({"id": task})),
        );
        assert_eq!(status, 200, "{canceled}");
        assert_eq!(
            canceled["result"]["status"]["state"], "TASK_STATE_CANCELED",
            "{task}: {canceled}"
        );
        let (_, again) = rpc(
            &addr,
            Some(TOKEN),
            &call("CancelTask", &json!({"id": task})),
        );
        assert_eq!(again["error"]["code"], -32002, "{again}");
    }
}

#[test]
fn a_blocking_send_nobody_answers_gets_its_task_when_the_wait_ends() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    config(&bridge, "");
    let (_gateway, addr) = serve(&bridge);
    let message = json!({"message": {"messageId": ulid(), "role": "ROLE_USER",
                                     "parts": [{"text": "a slow one"}]}});
    let body = call("SendMessage", &message);
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    // The gateway waits up to 60 s for the task to settle; nobody answers here.
    stream
        .set_read_timeout(Some(Duration::from_secs(100)))
        .unwrap();
    let head = format!(
        "POST /a2a/web HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nA2A-Version: 1.0\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200"), "no answer: {text:?}");
    assert!(text.contains("\"TASK_STATE_SUBMITTED\""), "{text}");
}

#[test]
fn a_note_about_a_task_is_in_its_thread_closed_or_not_and_says_which() {
    let (bridge, _gateway, addr, task) = served_task("the logo files?");
    bridge.reply(&task, "web", "completed", &[], "uploaded");
    bridge.doorbell(&["wait", &task, "--timeout", "10s"]).ok();
    let note = |id: &str, extra: &Value| {
        let mut message = json!({"messageId": id, "role": "ROLE_USER",
                                 "parts": [{"text": "thanks"}], "metadata": {"kind": "note"}});
        for (k, v) in extra.as_object().unwrap() {
            message[k] = v.clone();
        }
        rpc(
            &addr,
            Some(TOKEN),
            &call("SendMessage", &json!({"message": message})),
        )
        .1
    };
    // About the closed task: a note in its thread, answered with that thread.
    let about = note("n-about", &json!({"referenceTaskIds": [task]}));
    assert_eq!(
        about["result"]["message"]["contextId"],
        Value::from(task.clone()),
        "{about}"
    );
    // In a thread of the caller's own: that thread.
    let own = note("n-own", &json!({"contextId": "ctx-1"}));
    assert_eq!(own["result"]["message"]["contextId"], "ctx-1", "{own}");
    // About a task of others, or in another thread than the task's: refused.
    let others = bridge.request("human", "web", "lunch?");
    let theirs = note("n-theirs", &json!({"referenceTaskIds": [others]}));
    assert_eq!(theirs["error"]["code"], -32001, "{theirs}");
    let elsewhere = note(
        "n-else",
        &json!({"referenceTaskIds": [task], "contextId": "ctx-1"}),
    );
    assert_eq!(elsewhere["error"]["code"], -32602, "{elsewhere}");
    let read: Vec<Value> = bridge
        .doorbell(&["read", "web", "--json"])
        .ok()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["envelope"].clone())
        .filter(|m| m["kind"] == "note")
        .collect();
    let got: Vec<(&str, &str, &str)> = read
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or("-");
            (s("id"), s("correlatesTo"), s("contextId"))
        })
        .collect();
    assert_eq!(
        got,
        [
            ("n-about", task.as_str(), task.as_str()),
            ("n-own", "-", "ctx-1")
        ]
    );
}

/// A cancel that loses the race with the station's closing answer (both written while the
/// judge was busy: the answer first) is told what a closed task's cancel is told; so is the
/// input a task asked for, sent as the station closes it.
#[test]
fn a_line_that_loses_the_race_with_the_closing_answer_is_told_the_task_closed() {
    let (bridge, _gateway, addr, task) = served_task("the logo files?");
    let judge = Daemon::start(&bridge, &[]);
    judge.signal("STOP");
    bridge.reply(&task, "web", "completed", &[], "uploaded");
    let canceling = {
        let (addr, task) = (addr.clone(), task.clone());
        std::thread::spawn(move || {
            rpc(
                &addr,
                Some(TOKEN),
                &call("CancelTask", &json!({"id": task})),
            )
            .1
        })
    };
    crate::util::wait_for_text(
        &bridge.inbox("web"),
        &format!("{task}.cancel"),
        Duration::from_secs(20),
    );
    judge.signal("CONT");
    let answer = canceling.join().unwrap();
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    let (_, got) = rpc(&addr, Some(TOKEN), &call("GetTask", &json!({"id": task})));
    assert_eq!(
        got["result"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{got}"
    );
    // The input a task asked for, sent as the station closes it.
    let (_, sent) = rpc(
        &addr,
        Some(TOKEN),
        &call("SendMessage", &send("and this?", &json!({}))),
    );
    let asking = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    bridge.reply(&asking, "web", "input-required", &[], "which one?");
    bridge.doorbell(&["wait", &asking, "--timeout", "10s"]).ok();
    judge.signal("STOP");
    bridge.reply(&asking, "web", "completed", &[], "never mind");
    let input = ulid();
    let answering = {
        let body = call(
            "SendMessage",
            &send(
                "the blue one",
                &json!({"taskId": asking, "messageId": input}),
            ),
        );
        let addr = addr.clone();
        std::thread::spawn(move || rpc(&addr, Some(TOKEN), &body).1)
    };
    crate::util::wait_for_text(&bridge.inbox("web"), &input, Duration::from_secs(20));
    judge.signal("CONT");
    let answer = answering.join().unwrap();
    assert_eq!(answer["error"]["code"], -32004, "{answer}");
}

#[test]
fn a_state_no_request_is_ever_in_lists_no_task() {
    let (_bridge, _gateway, addr, _task) = served_task("ETA?");
    // TASK_STATE_AUTH_REQUIRED: a filter that matches nothing, not an error.
    for status in [json!("TASK_STATE_AUTH_REQUIRED"), json!(8)] {
        let (_, none) = rpc(
            &addr,
            Some(TOKEN),
            &call("ListTasks", &json!({"status": status})),
        );
        assert_eq!(none["result"]["totalSize"], 0, "{none}");
    }
    let (_, all) = rpc(&addr, Some(TOKEN), &call("ListTasks", &json!({})));
    assert_eq!(all["result"]["totalSize"], 1, "{all}");
}

/// `a2a serve` stops at SIGTERM though a client holds a stream open (streams never end of
/// themselves): it cuts it, and the client subscribes again to a gateway that runs.
#[test]
fn the_gateway_stops_at_sigterm_with_a_stream_open() {
    let (_bridge, mut gateway, addr, task) = served_task("a long one");
    let subscribe = call("SubscribeToTask", &json!({"id": task}));
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head = format!(
        "POST /a2a/web HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        subscribe.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&subscribe).unwrap();
    let seen = read_until(&mut stream, |text| text.contains("\"task\""));
    assert!(seen.contains("text/event-stream"), "{seen}");
    gateway.signal("TERM");
    assert_eq!(gateway.wait_exit(Duration::from_secs(20)), Some(0));
}

#[test]
fn a_retry_of_a_message_a_task_got_before_it_closed_is_delivered_not_refused() {
    let (bridge, _gateway, addr, task) = served_task("the logo files?");
    let more = send("more info", &json!({"messageId": "more-1", "taskId": task}));
    let (_, first) = rpc(&addr, Some(TOKEN), &call("SendMessage", &more));
    assert_eq!(first["result"]["task"]["id"], task.as_str(), "{first}");
    bridge.reply(&task, "web", "completed", &[], "uploaded");
    bridge.doorbell(&["wait", &task, "--timeout", "10s"]).ok();
    // The first answer was lost: the caller sends the same message again.
    let (_, again) = rpc(&addr, Some(TOKEN), &call("SendMessage", &more));
    assert_eq!(again["result"]["task"]["id"], task.as_str(), "{again}");
    assert_eq!(
        again["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{again}"
    );
    let copies = bridge
        .lines("web")
        .iter()
        .filter(|l| String::from_utf8_lossy(l).contains("\"more-1\""))
        .count();
    assert_eq!(copies, 1, "delivered once");
    // A new message to the closed task is still refused.
    let late = send("and this", &json!({"taskId": task}));
    let (_, late) = rpc(&addr, Some(TOKEN), &call("SendMessage", &late));
    assert_eq!(late["error"]["code"], -32004, "{late}");
}

/// A gateway started while the daemon is stopped cannot judge (the stopped daemon holds the
/// lock): the answer written meanwhile waits. When the daemon is then killed, the gateway
/// judges what it left, and a stream open on the task shows the answer. Without its waiter's
/// recheck at start it judged nothing until the next write, and the stream stayed at
/// `submitted`.
#[test]
fn a_stream_shows_the_answer_a_killed_daemon_left_unjudged() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    config(&bridge, "");
    let daemon = Daemon::start(&bridge, &[]);
    let patience = Duration::from_secs(20);
    let task = "01KILLEDTASK";
    bridge.append_raw(
        "web",
        format!(
            "{}\n",
            crate::util::line(task, "design", "web", "request", "")
        )
        .as_bytes(),
    );
    bridge.wait_for(patience, "the request judged", |b| b.verdicts().len() == 1);
    daemon.signal("STOP");
    let answer = format!(r#","correlatesTo":"{task}","contextId":"{task}","state":"completed""#);
    bridge.append_raw(
        "design",
        format!(
            "{}\n",
            crate::util::line("01KILLEDANSWER", "web", "design", "response", &answer)
        )
        .as_bytes(),
    );
    let (_gateway, addr) = serve(&bridge);
    let subscribe = call("SubscribeToTask", &json!({"id": task}));
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream.set_read_timeout(Some(patience)).unwrap();
    let head = format!(
        "POST /a2a/web HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        subscribe.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&subscribe).unwrap();
    let first = read_until(&mut stream, |text| text.contains("\"task\""));
    assert!(first.contains("TASK_STATE_SUBMITTED"), "{first}");
    assert!(!first.contains("TASK_STATE_COMPLETED"), "{first}");
    daemon.kill();
    // Keep-alives reset a read's timeout: the stream is given a deadline instead.
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = std::time::Instant::now() + patience;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("TASK_STATE_COMPLETED")
        && std::time::Instant::now() < deadline
    {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let seen = String::from_utf8_lossy(&seen);
    assert!(
        seen.contains("TASK_STATE_COMPLETED") && seen.contains("01KILLEDANSWER"),
        "the stream, {patience:?} after the daemon was killed: {seen}"
    );
}
