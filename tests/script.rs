//! The shell sender's own suite, `tests/doorbell-send.sh`: nasty texts byte for byte, every
//! refusal, torn-tail repair and concurrent writers, run under `sh` as agents would.

use crate::util::{run, script};
use std::path::Path;
use std::process::Command;

#[test]
fn the_shell_sender_passes_its_suite() {
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/doorbell-send.sh");
    let mut command = Command::new("sh");
    command.arg(&suite).arg(script());
    let result = run(command, None);
    assert_eq!(
        result.code, 0,
        "tests/doorbell-send.sh failed (it needs jq: scripts/test installs it)\n{}\n{}",
        result.stdout, result.stderr
    );
    assert!(result.stdout.contains("failed: 0"), "{}", result.stdout);
}
