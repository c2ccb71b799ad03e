//! The fixture corpus `tests/fixtures/check/web-inbox.jsonl` judged by the stateless rules:
//! every line's reason must be the one written beside it in `web-inbox.expected`. The same
//! corpus drives `doorbell check` end to end.

use doorbell_core::{judge_stateless, Limits};

const CORPUS: &[u8] = include_bytes!("../../../tests/fixtures/check/web-inbox.jsonl");
const EXPECTED: &str = include_str!("../../../tests/fixtures/check/web-inbox.expected");

#[test]
fn every_corpus_line_gets_its_expected_verdict() {
    let limits = Limits {
        max_line_bytes: 4096,
    };
    let lines: Vec<&[u8]> = CORPUS
        .strip_suffix(b"\n")
        .unwrap()
        .split(|&b| b == b'\n')
        .collect();
    let expected: Vec<&str> = EXPECTED.lines().collect();
    assert_eq!(
        lines.len(),
        expected.len(),
        "one expectation per corpus line"
    );
    let mut wrong = Vec::new();
    for (number, (line, want)) in lines.iter().zip(&expected).enumerate() {
        let (code, comment) = want.split_once(" # ").unwrap_or((want, ""));
        let got = match judge_stateless(line, Some("web"), &limits) {
            Ok(_) => "ok".to_owned(),
            Err(refusal) => refusal.reason.code().to_owned(),
        };
        if got != code.trim() {
            wrong.push(format!(
                "line {}: expected {code}, got {got} ({comment})",
                number + 1
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
