//! `doorbell check` over the fixture corpus: every line gets the reason written beside it,
//! the exit code is 2, and nothing panics.

use crate::util::Bridge;

const EXPECTED: &str = include_str!("fixtures/check/web-inbox.expected");

#[test]
fn check_names_the_right_reason_for_every_corpus_line() {
    let bridge = Bridge::new();
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/check/web-inbox.jsonl");
    let run = bridge.doorbell(&[
        "check",
        "--json",
        "--max-line-bytes",
        "4096",
        corpus.to_str().unwrap(),
    ]);
    assert_eq!(
        run.code, 2,
        "check exits 2 when lines are refused: {}",
        run.stderr
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let got: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let expected: Vec<&str> = EXPECTED.lines().collect();
    assert_eq!(got.len(), expected.len());
    for (record, want) in got.iter().zip(&expected) {
        let code = want.split(" # ").next().unwrap().trim();
        let verdict = match record["verdict"].as_str().unwrap() {
            "pass" => "ok",
            _ => record["reason"].as_str().unwrap(),
        };
        assert_eq!(verdict, code, "line {}: {want}", record["line"]);
    }
    assert!(
        run.stderr.contains("stateless rules only"),
        "{}",
        run.stderr
    );
}

#[test]
fn check_of_a_clean_inbox_exits_0_and_prints_refusals_readably() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.send("design", "web", "hello");
    let clean = bridge.doorbell(&["check"]);
    assert_eq!(clean.code, 0, "{}", clean.stderr);
    bridge.append_raw("web", b"{\"id\":\"x\"}\n[1,2]\n");
    let run = bridge.doorbell(&["check", bridge.inbox("web").to_str().unwrap()]);
    assert_eq!(run.code, 2);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    assert!(
        lines[0].contains(":2: ") && lines[0].contains("missing-field"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains(":3: ") && lines[1].contains("bad-json"),
        "{}",
        lines[1]
    );
}
