//! The fuzz target's body (`doorbell_store::fuzzing::read_and_judge`) in the stable test run:
//! arbitrary bytes, near-valid inboxes made of mutated envelopes so the ledger rules are
//! reached, and every seed of the fuzz target and the check fixtures.

use std::path::{Path, PathBuf};

use doorbell_core::RefusalReason;
use doorbell_store::fuzzing::{read_and_judge, Reached};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};

const IDS: [&str; 12] = [
    "01JF3W8Q2M6V4Z9K7T1R5B0C8D",
    "01JF3W8Q2M6V4Z9K7T1R5B0C8E",
    "01JF3W8Q2M6V4Z9K7T1R5B0C8F",
    "01JF3W8Q2M6V4Z9K7T1R5B0C8G",
    "01JF3W8Q2M6V4Z9K7T1R5B0C8H",
    "01JF3W8Q2M6V4Z9K7T1R5B0C8J",
    "01JF3W8Q2M6V4Z9K7T1R5B0C8K",
    "01JF3W8Q2M6V4Z9K7T1R5B0C8M",
    "01JF3W8Q2M6V4Z9K7T1R5B0C8N",
    "01JF3W8Q2M6V4Z9K7T1R5B0C8P",
    "bridge:1",
    "x:1",
];
/// Stations, a config loop, a built-in loop, a stranger and a name that is not one.
const NAMES: [&str; 7] = [
    "web",
    "design",
    "marketing",
    "cron",
    "bridge",
    "stranger",
    "Web",
];
const KINDS: [&str; 4] = ["request", "response", "note", "ping"];
const STATES: [&str; 8] = [
    "submitted",
    "working",
    "input-required",
    "completed",
    "failed",
    "canceled",
    "rejected",
    "done",
];
const FIELDS: [&str; 8] = [
    "id",
    "from",
    "to",
    "kind",
    "createdAt",
    "message",
    "state",
    "correlatesTo",
];

/// One envelope, most fields drawn from small pools so ids, threads and parties meet again.
#[derive(Debug, Clone)]
struct Spec {
    kind: usize,
    id: usize,
    from: usize,
    to: usize,
    correlates_to: Option<usize>,
    state: Option<usize>,
    context_id: Option<usize>,
    text: String,
    drop: Option<usize>,
    wrong_type: Option<usize>,
    /// For a response: answer an earlier line (by index, wrapped), as its addressee or not.
    answer: Option<(usize, bool)>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::sample::select(vec![0usize, 0, 1, 1, 1, 2, 3]),
        0..IDS.len(),
        prop::sample::select(vec![0usize, 0, 1, 1, 2, 3, 4, 5, 6]),
        prop::sample::select(vec![0usize, 0, 0, 1, 1, 2, 6]),
        prop::option::weighted(0.8, 0..IDS.len()),
        prop::option::weighted(0.8, 0..STATES.len()),
        prop::option::weighted(0.2, 0..IDS.len()),
        "[a-z \u{e9}]{0,12}",
        prop::option::weighted(0.1, 0..FIELDS.len()),
        prop::option::weighted(0.05, 0..FIELDS.len()),
        prop::option::weighted(0.7, (any::<usize>(), prop::bool::weighted(0.8))),
    )
        .prop_map(
            |(
                kind,
                id,
                from,
                to,
                correlates_to,
                state,
                context_id,
                text,
                drop,
                wrong_type,
                answer,
            )| {
                Spec {
                    kind,
                    id,
                    from,
                    to,
                    correlates_to,
                    state,
                    context_id,
                    text,
                    drop,
                    wrong_type,
                    answer,
                }
            },
        )
}

impl Spec {
    fn line(&self) -> String {
        let kind = KINDS[self.kind];
        let mut fields = Map::new();
        fields.insert("id".into(), IDS[self.id].into());
        fields.insert("from".into(), NAMES[self.from].into());
        fields.insert("to".into(), NAMES[self.to].into());
        fields.insert("kind".into(), kind.into());
        fields.insert("createdAt".into(), "2026-09-03T01:26:51Z".into());
        fields.insert(
            "message".into(),
            json!({"role": "agent", "parts": [{"type": "text", "text": self.text}]}),
        );
        // Mostly what the kind allows, sometimes not.
        let fitting = match kind {
            "request" => self.correlates_to.is_some() && self.state.is_some(),
            "note" => self.state.is_some() && self.correlates_to.is_some(),
            _ => true,
        };
        if kind != "request" || !fitting {
            if let Some(re) = self.correlates_to {
                fields.insert("correlatesTo".into(), IDS[re].into());
            }
        }
        if kind == "response" || !fitting {
            if let Some(state) = self.state {
                fields.insert("state".into(), STATES[state].into());
            }
        }
        if let Some(context) = self.context_id {
            fields.insert("contextId".into(), IDS[context].into());
        }
        if let Some(drop) = self.drop {
            fields.remove(FIELDS[drop]);
        }
        if let Some(wrong) = self.wrong_type {
            fields.insert(FIELDS[wrong].into(), json!([1]));
        }
        Value::Object(fields).to_string()
    }
}

/// A byte-level change to an inbox of valid-looking lines.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Delete(usize),
    Insert(usize, &'static [u8]),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let token = prop::sample::select(vec![
        &b"\n"[..],
        b"\r",
        b"\"",
        b"{",
        b"}",
        b"\xff",
        b"\xef\xbb\xbf",
        b"\\u0000",
        b",\"x\":[[[]]]",
        b"\0",
    ]);
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Flip(at, b)),
        any::<usize>().prop_map(Mutation::Delete),
        (any::<usize>(), token).prop_map(|(at, t)| Mutation::Insert(at, t)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn near_valid_inbox() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec((spec(), any::<bool>()), 1..24),
        prop::collection::vec(mutation(), 0..3),
    )
        .prop_map(|(specs, mutations)| {
            let mut bytes = Vec::new();
            let mut specs = specs;
            // Responses mostly answer an earlier line, from one of its parties to the other,
            // so transitions and closed requests are reached.
            for i in 1..specs.len() {
                let (before, rest) = specs.split_at_mut(i);
                let spec = &mut rest[0].0;
                if let (1, Some((to, by_addressee))) = (spec.kind, spec.answer) {
                    let requests: Vec<&Spec> = before
                        .iter()
                        .map(|(s, _)| s)
                        .filter(|s| s.kind == 0)
                        .collect();
                    let earlier = match requests.len() {
                        0 => &before[to % i].0,
                        n => requests[to % n],
                    };
                    spec.correlates_to = Some(earlier.id);
                    (spec.from, spec.to) = if by_addressee {
                        (earlier.to, earlier.from)
                    } else {
                        (earlier.from, earlier.to)
                    };
                }
            }
            for (spec, crlf) in &specs {
                bytes.extend(spec.line().as_bytes());
                bytes.extend(if *crlf { &b"\r\n"[..] } else { b"\n" });
                // A retry of the same line now and then: a duplicate.
                if spec.text.len() % 5 == 0 {
                    bytes.extend(spec.line().as_bytes());
                    bytes.push(b'\n');
                }
            }
            for m in mutations {
                let len = bytes.len().max(1);
                match m {
                    Mutation::Flip(at, b) => {
                        if let Some(x) = bytes.get_mut(at % len) {
                            *x ^= b;
                        }
                    }
                    Mutation::Delete(at) => {
                        if at % len < bytes.len() {
                            bytes.remove(at % len);
                        }
                    }
                    Mutation::Insert(at, token) => {
                        let at = at % (bytes.len() + 1);
                        bytes.splice(at..at, token.iter().copied());
                    }
                    Mutation::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
                }
            }
            bytes
        })
}

proptest! {
    #![proptest_config(Config { cases: 256, ..Config::default() })]

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        read_and_judge(&bytes);
    }

    #[test]
    fn arbitrary_lines(lines in prop::collection::vec("[ -~\t\r\u{e9}\u{feff}]{0,80}", 0..12)) {
        read_and_judge(lines.join("\n").as_bytes());
    }

    #[test]
    fn near_valid_inboxes(bytes in near_valid_inbox()) {
        read_and_judge(&bytes);
    }
}

/// The near-valid inboxes go deep: together they reach acceptance, duplicates and every
/// refusal reason, so the stateful rules are exercised and not just the JSON parser.
#[test]
fn near_valid_inboxes_reach_every_verdict() {
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 300,
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let reached = std::cell::RefCell::new(Reached::default());
    runner
        .run(&near_valid_inbox(), |bytes| {
            reached.borrow_mut().add(&read_and_judge(&bytes));
            Ok(())
        })
        .unwrap();
    let reached = reached.into_inner();
    assert!(reached.accepted > 0 && reached.duplicate > 0, "{reached:?}");
    assert_eq!(
        reached.missing_reasons(),
        Vec::<RefusalReason>::new(),
        "{reached:?}"
    );
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// Every seed of the fuzz target (crashes it once found are kept there) and the check
/// fixtures, replayed.
#[test]
fn fuzz_seeds_replay() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/read_and_judge");
    let mut files = files_in(&seeds);
    assert!(files.len() > 100, "the seeds are missing: {files:?}");
    files.push(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/check/web-inbox.jsonl"),
    );
    let mut reached = Reached::default();
    for file in &files {
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        reached.add(&read_and_judge(&bytes));
    }
    // The seeds hold a whole conversation: requests answered, retried and closed.
    assert!(
        reached.accepted >= 10 && reached.duplicate > 0,
        "{reached:?}"
    );
    assert!(
        reached.refused[RefusalReason::RequestClosed as usize] > 0,
        "{reached:?}"
    );
}
