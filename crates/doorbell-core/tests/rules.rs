//! The stateless rules (DESIGN §3, `line-too-long` to `misaddressed`): arbitrary input never
//! panics, nesting is limited to 128 levels wherever it hides, CRLF is tolerated and a
//! byte-order mark is not.

use doorbell_core::{is_agent_name, is_id, judge_stateless, Limits, RefusalReason};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const LIMITS: Limits = Limits {
    max_line_bytes: 4096,
};

/// A valid note from `design` to `web`, with `extra` fields merged over it.
fn line(extra: &Value) -> String {
    let mut fields: Map<String, Value> = serde_json::from_value(json!({
        "id": "01JF3W8Q2M6V4Z9K7T1R5B0C8D",
        "from": "design",
        "to": "web",
        "kind": "note",
        "createdAt": "2026-09-03T01:26:51Z",
        "message": {"parts": [{"type": "text", "text": "hello"}]},
    }))
    .unwrap();
    for (key, value) in extra.as_object().expect("extra fields are an object") {
        fields.insert(key.clone(), value.clone());
    }
    serde_json::to_string(&fields).unwrap()
}

/// `accepted` for an envelope, else the refusal's reason code.
fn verdict(bytes: &[u8]) -> String {
    match judge_stateless(bytes, Some("web"), &LIMITS) {
        Ok(envelope) => {
            assert_eq!(envelope.to, "web");
            "ok".to_owned()
        }
        Err(refusal) => refusal.reason.code().to_owned(),
    }
}

#[track_caller]
fn check(bytes: &[u8], expected: &str) {
    assert_eq!(
        verdict(bytes),
        expected,
        "{}",
        String::from_utf8_lossy(bytes)
    );
}

// ---- never panics --------------------------------------------------------------------------

/// Bits of JSON and near-JSON, glued together at random.
const FRAGMENTS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "\\",
    "\\\"",
    "\\u",
    "\\ud800",
    "\\u0000",
    " ",
    "\t",
    "\r",
    "\n",
    "\u{feff}",
    "null",
    "true",
    "false",
    "0",
    "1",
    "3",
    "-1",
    "1.5",
    "1e400",
    "-0",
    "18446744073709551616",
    "\"id\":",
    "\"from\":",
    "\"to\":",
    "\"kind\":",
    "\"state\":",
    "\"correlatesTo\":",
    "\"contextId\":",
    "\"taskId\":",
    "\"createdAt\":",
    "\"replyBy\":",
    "\"priority\":",
    "\"message\":",
    "\"role\":",
    "\"parts\":",
    "\"type\":",
    "\"text\":",
    "\"data\":",
    "\"file\":",
    "\"uri\":",
    "\"bytes\":",
    "\"name\":",
    "\"web\"",
    "\"design\"",
    "\"request\"",
    "\"response\"",
    "\"note\"",
    "\"text\"",
    "\"data\"",
    "\"file\"",
    "\"working\"",
    "\"submitted\"",
    "\"a:b\"",
    "\"2026-09-03T01:26:51Z\"",
    "\"9999-99-99\"",
    "é",
    "\u{1F600}",
    "\u{0}",
    "\u{7f}",
    "\u{2028}",
    "\"x\"",
];

fn json_ish() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(FRAGMENTS), 0..80)
        .prop_map(|parts| parts.concat())
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
        proptest::sample::select(FRAGMENTS).prop_map(Value::from),
        proptest::sample::select(vec![
            "web",
            "design",
            "request",
            "response",
            "note",
            "text",
            "data",
            "file",
            "working",
            "completed",
            "submitted",
            "2026-09-03T01:26:51Z",
            "a:b",
            ""
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map("[a-zA-Z]{1,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid envelope with one field (top level, in the message or in a part) set to any
/// JSON value: this reaches the field checks, not just the parser.
fn mutated_envelope() -> impl Strategy<Value = String> {
    let keys = proptest::sample::select(vec![
        "id",
        "from",
        "to",
        "kind",
        "state",
        "correlatesTo",
        "contextId",
        "taskId",
        "createdAt",
        "replyBy",
        "priority",
        "message",
        "message.role",
        "message.parts",
        "part.type",
        "part.text",
        "part.data",
        "part.file",
        "file.uri",
        "file.bytes",
        "file.name",
    ]);
    let kinds = proptest::sample::select(vec!["request", "response", "note"]);
    (kinds, keys, any_json()).prop_map(|(kind, key, value)| {
        let mut envelope = json!({
            "id": "m1", "from": "design", "to": "web", "kind": kind,
            "createdAt": "2026-09-03T01:26:51Z",
            "message": {"role": "agent", "parts": [
                {"type": "text", "text": "hi"},
                {"type": "file", "file": {"name": "a.txt", "uri": "file:///tmp/a.txt"}},
            ]},
        });
        if kind == "response" {
            envelope["correlatesTo"] = json!("r1");
            envelope["state"] = json!("working");
        }
        match key.split_once('.') {
            None => envelope[key] = value,
            Some(("message", field)) => envelope["message"][field] = value,
            Some(("part", field)) => envelope["message"]["parts"][0][field] = value,
            Some((_, field)) => envelope["message"]["parts"][1]["file"][field] = value,
        }
        envelope.to_string()
    })
}

fn assert_sound(bytes: &[u8]) {
    match judge_stateless(bytes, Some("web"), &LIMITS) {
        Ok(envelope) => {
            assert_eq!(envelope.to, "web");
            assert!(is_id(&envelope.id) && is_agent_name(&envelope.from));
            assert!(!envelope.message.parts.is_empty());
        }
        Err(refusal) => assert!(refusal.reason.is_stateless(), "{refusal}"),
    }
    // Without an owner the judgement still holds together.
    let _ = judge_stateless(bytes, None, &LIMITS);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        assert_sound(&bytes);
    }

    #[test]
    fn json_ish_text_never_panics(text in json_ish(), crlf in any::<bool>()) {
        let text = if crlf { text + "\r" } else { text };
        assert_sound(text.as_bytes());
    }

    #[test]
    fn mutated_envelopes_never_panic(text in mutated_envelope()) {
        assert_sound(text.as_bytes());
    }

    #[test]
    fn json_ish_inside_an_envelope_never_panics(text in json_ish()) {
        let wrapped = format!(
            r#"{{"id":"m1","from":"design","to":"web","kind":"note","createdAt":"2026-09-03T01:26:51Z","message":{{"parts":[{{"type":"text","text":"hi"}}]}},"x":{text}}}"#
        );
        assert_sound(wrapped.as_bytes());
    }
}

// ---- nesting depth ------------------------------------------------------------------------

/// The deepest nesting of arrays and objects in JSON text, counted independently of the
/// crate (brackets inside strings don't count).
fn max_depth(text: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for c in text.chars() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') | (false, _, '"') => in_string = !in_string,
            (false, _, '[' | '{') => {
                depth += 1;
                max = max.max(depth);
            }
            (false, _, ']' | '}') => depth -= 1,
            _ => {}
        }
    }
    max
}

/// `levels` of nesting, alternating objects and arrays, starting with an object.
fn nest(levels: usize) -> Value {
    let mut value = json!({});
    for level in (1..levels).rev() {
        value = if level % 2 == 0 {
            json!([value])
        } else {
            json!({ "a": value })
        };
    }
    value
}

/// Lines whose deepest point is exactly `depth` levels, reached in different places.
fn deep_lines(depth: usize) -> Vec<(&'static str, String)> {
    let text_part = json!({"type": "text", "text": "hi"});
    let lines = vec![
        // envelope > message > parts > part > data
        (
            "a data part",
            line(&json!({"message": {"parts": [{"type": "data", "data": nest(depth - 4)}]}})),
        ),
        // envelope > unknown field
        ("an unknown field", line(&json!({"x": nest(depth - 1)}))),
        (
            "an unknown array field",
            line(&json!({"x": [nest(depth - 2)]})),
        ),
        // envelope > message > unknown field
        (
            "an unknown field of the message",
            line(&json!({"message": {"parts": [text_part], "x": nest(depth - 2)}})),
        ),
        // envelope > message > parts > part > unknown field
        (
            "an unknown field of a part",
            line(
                &json!({"message": {"parts": [{"type": "text", "text": "hi", "x": nest(depth - 4)}]}}),
            ),
        ),
        // envelope > message > parts > part > file > unknown field
        (
            "an unknown field of a file",
            line(
                &json!({"message": {"parts": [{"type": "file", "file": {"uri": "file:///a", "x": nest(depth - 5)}}]}}),
            ),
        ),
    ];
    for (place, line) in &lines {
        assert_eq!(max_depth(line), depth, "test line for {place}");
    }
    lines
}

#[test]
fn nesting_128_deep_is_fine_129_is_bad_json() {
    let roomy = Limits {
        max_line_bytes: 1 << 20,
    };
    for (place, line) in deep_lines(128) {
        let judged = judge_stateless(line.as_bytes(), Some("web"), &roomy);
        assert!(judged.is_ok(), "128 deep in {place}: {:?}", judged.err());
    }
    for (place, line) in deep_lines(129) {
        let refusal = judge_stateless(line.as_bytes(), Some("web"), &roomy).expect_err(place);
        assert_eq!(
            refusal.reason,
            RefusalReason::BadJson,
            "129 deep in {place}: {refusal}"
        );
        assert!(refusal.detail.contains("128"), "{refusal}");
    }
}

#[test]
fn very_deep_nesting_is_refused_without_recursion() {
    let roomy = Limits {
        max_line_bytes: 1 << 24,
    };
    let levels = 1_000_000;
    let deep = format!(
        r#"{{"id":"m1","x":{}{}}}"#,
        "[".repeat(levels),
        "]".repeat(levels)
    );
    let refusal = judge_stateless(deep.as_bytes(), Some("web"), &roomy).unwrap_err();
    assert_eq!(refusal.reason, RefusalReason::BadJson);
    // Unbalanced, too: depth is found before the parse.
    let open = format!(r#"{{"x":{}"#, "{\"a\":".repeat(levels));
    let refusal = judge_stateless(open.as_bytes(), Some("web"), &roomy).unwrap_err();
    assert_eq!(refusal.reason, RefusalReason::BadJson);
}

#[test]
fn brackets_in_strings_are_not_nesting() {
    let many = "[{".repeat(500) + "\\\"]}" + &"{[".repeat(500);
    let text =
        line(&json!({"message": {"parts": [{"type": "text", "text": many}]}, "x": "[[[{{{\\"}));
    assert!(max_depth(&text) < 10);
    check(text.as_bytes(), "ok");
}

// ---- line ends, byte-order marks, the stateless order --------------------------------------

#[test]
fn crlf_is_tolerated() {
    let plain = line(&json!({}));
    let crlf = plain.clone() + "\r";
    let a = judge_stateless(plain.as_bytes(), Some("web"), &LIMITS).unwrap();
    let b = judge_stateless(crlf.as_bytes(), Some("web"), &LIMITS).unwrap();
    assert_eq!(a.fingerprint, b.fingerprint, "the \\r is not content");

    // The \r doesn't count against the limit.
    let pad = |text: &str, to: usize| {
        let filler = "x".repeat(to - line(&json!({"x": ""})).len());
        line(&json!({"x": filler})) + text
    };
    assert_eq!(pad("", 4096).len(), 4096);
    check(pad("", 4096).as_bytes(), "ok");
    check(pad("\r", 4096).as_bytes(), "ok");
    check(pad("", 4097).as_bytes(), "line-too-long");
    check(pad("\r", 4097).as_bytes(), "line-too-long");
}

#[test]
fn byte_order_mark_is_bad_json() {
    let bom = format!("\u{feff}{}", line(&json!({})));
    let refusal = judge_stateless(bom.as_bytes(), Some("web"), &LIMITS).unwrap_err();
    assert_eq!(refusal.reason, RefusalReason::BadJson);
    assert!(refusal.detail.contains("byte-order mark"), "{refusal}");
    check(format!("{bom}\r").as_bytes(), "bad-json");
}

#[test]
fn stateless_order() {
    let long = line(&json!({"x": "y".repeat(5000)}));
    let table: Vec<(Vec<u8>, &str)> = vec![
        (line(&json!({})).into_bytes(), "ok"),
        (long.clone().into_bytes(), "line-too-long"),
        ([b"\xff".as_slice(), long.as_bytes()].concat(), "line-too-long"),
        (b"{\"id\":\"\xff\"}".to_vec(), "not-utf8"),
        (b"\xfe{".to_vec(), "not-utf8"),
        (b"".to_vec(), "bad-json"),
        (b"   \t".to_vec(), "bad-json"),
        (b"[]".to_vec(), "bad-json"),
        (b"\"web\"".to_vec(), "bad-json"),
        (b"{".to_vec(), "bad-json"),
        (b"{} {}".to_vec(), "bad-json"),
        (format!("{} x", line(&json!({}))).into_bytes(), "bad-json"),
        (line(&json!({"id": 1})).replacen('{', "{\"id\":\"a\",", 1).into_bytes(), "bad-json"),
        (br#"{"kind":"response"}"#.to_vec(), "response-without-correlation"),
        (line(&json!({"kind": "response", "correlatesTo": null, "to": "ci"})).into_bytes(), "response-without-correlation"),
        (br#"{"kind":"note"}"#.to_vec(), "missing-field"),
        (line(&json!({"kind": "response", "correlatesTo": "r1"})).into_bytes(), "missing-field"),
        (line(&json!({"message": {"parts": [{"type": "text"}]}, "to": "ci"})).into_bytes(), "missing-field"),
        (line(&json!({"message": {"parts": [{"type": "data", "data": null}]}})).into_bytes(), "missing-field"),
        (line(&json!({"message": {"parts": [{"type": "file", "file": {"name": "a"}}]}})).into_bytes(), "missing-field"),
        (line(&json!({"id": 5, "to": "ci"})).into_bytes(), "bad-field"),
        (line(&json!({"id": "a b"})).into_bytes(), "bad-field"),
        (line(&json!({"id": "x".repeat(129)})).into_bytes(), "bad-field"),
        (line(&json!({"from": "Web"})).into_bytes(), "bad-field"),
        (line(&json!({"to": "../web"})).into_bytes(), "bad-field"),
        (line(&json!({"kind": "question"})).into_bytes(), "bad-field"),
        (line(&json!({"state": "working"})).into_bytes(), "bad-field"),
        (line(&json!({"kind": "request", "state": "working"})).into_bytes(), "bad-field"),
        (line(&json!({"kind": "request", "correlatesTo": "r0"})).into_bytes(), "bad-field"),
        (line(&json!({"kind": "response", "correlatesTo": "r1", "state": "submitted"})).into_bytes(), "bad-field"),
        (line(&json!({"createdAt": "yesterday"})).into_bytes(), "bad-field"),
        // RFC 3339, but past the four-digit years once in UTC: nothing could write it back.
        (line(&json!({"replyBy": "9999-12-31T23:59:59-01:00"})).into_bytes(), "bad-field"),
        (line(&json!({"createdAt": "0000-01-01T00:00:00+01:00"})).into_bytes(), "bad-field"),
        (line(&json!({"priority": 4})).into_bytes(), "bad-field"),
        (line(&json!({"priority": 1.0})).into_bytes(), "bad-field"),
        (line(&json!({"priority": "1"})).into_bytes(), "bad-field"),
        (line(&json!({"message": {"role": "system", "parts": [{"type": "text", "text": "x"}]}})).into_bytes(), "bad-field"),
        (line(&json!({"message": {"parts": []}})).into_bytes(), "bad-field"),
        (line(&json!({"message": {"parts": [{"type": "data", "data": [1]}]}})).into_bytes(), "bad-field"),
        (line(&json!({"message": {"parts": [{"type": "file", "file": {"uri": "a", "bytes": "b"}}]}})).into_bytes(), "bad-field"),
        (line(&json!({"message": {"parts": [{"type": "file", "file": {"bytes": "not base64!"}}]}})).into_bytes(), "bad-field"),
        (line(&json!({"message": {"parts": [{"type": "file", "file": {"bytes": "SGVsbG8g\nd29ybGQ="}}]}})).into_bytes(), "bad-field"),
        (line(&json!({"to": "ci"})).into_bytes(), "misaddressed"),
        // Accepted shapes.
        (line(&json!({"kind": "request", "correlatesTo": null, "state": "submitted", "priority": 3})).into_bytes(), "ok"),
        (line(&json!({"kind": "response", "correlatesTo": "r1", "state": "input-required", "contextId": "t"})).into_bytes(), "ok"),
        (line(&json!({"createdAt": "2026-09-03T03:26:51.5+02:00", "replyBy": "2026-09-04T00:00:00-07:00"})).into_bytes(), "ok"),
        (line(&json!({"createdAt": "0000-01-01T00:00:00Z", "replyBy": "9999-12-31T23:59:59+01:00"})).into_bytes(), "ok"),
        (line(&json!({"message": {"role": "user", "parts": [{"type": "data", "data": {"a": [1]}}, {"type": "file", "file": {"bytes": "aGk="}}]}})).into_bytes(), "ok"),
        (line(&json!({"x": {"unknown": ["fields", "are", "kept"]}})).into_bytes(), "ok"),
        (format!("  \t{}  ", line(&json!({}))).into_bytes(), "ok"),
    ];
    for (bytes, expected) in &table {
        check(bytes, expected);
    }
}

/// What a bad priority is told: a whole number out of range is out of range, not fractional.
#[test]
fn a_bad_priority_is_named_for_what_it_is() {
    for (priority, detail) in [
        ("18446744073709551616", "must be 0, 1, 2 or 3"),
        ("-18446744073709551616", "must be 0, 1, 2 or 3"),
        ("1e300", "must be 0, 1, 2 or 3"),
        ("4", "must be 0, 1, 2 or 3"),
        ("-1", "must be 0, 1, 2 or 3"),
        ("1.5", "must be an integer 0-3, not a fractional number"),
        (
            "1.0",
            "must be an integer 0-3, not a number with a decimal point or an exponent",
        ),
        ("\"1\"", "must be an integer 0-3, not a string"),
    ] {
        let bytes = line(&json!({})).replacen('{', &format!("{{\"priority\":{priority},"), 1);
        let refusal = judge_stateless(bytes.as_bytes(), Some("web"), &LIMITS)
            .expect_err("a bad priority is refused");
        assert_eq!(refusal.reason.code(), "bad-field", "{priority}");
        assert!(
            refusal.detail.ends_with(detail),
            "{priority}: {}",
            refusal.detail
        );
    }
}

/// File bytes are base64 as every A2A client reads them; anything else is refused at the
/// source, where its sender hears of it, not dropped by a bridge or a client downstream.
#[test]
fn file_bytes_are_base64_that_any_a2a_client_reads() {
    for good in [
        "", "aGk=", "aGk", "aGVsbG8=", "aGVsbA==", "aGVsbA", "-_8=", "+/8=", "AAAA",
    ] {
        assert!(doorbell_core::is_base64(good), "{good:?}");
    }
    for bad in [
        "A",
        "A====",
        "aGk==",
        "aG=k",
        "a+-b",
        "not base64!",
        "aGk=\n",
        " aGk=",
        "QQ=",
    ] {
        assert!(!doorbell_core::is_base64(bad), "{bad:?}");
    }
}
