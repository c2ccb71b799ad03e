//! `doorbell mcp` driven by the official Python MCP SDK (`mcp` from `PyPI`, in the tests'
//! virtual environment): list the tools, send a request as one agent, read and answer it as
//! another, wait for the answer; in the SDK's default mode and in its legacy mode.

use serde_json::Value;

use crate::util::{python, run, Bridge};

fn client(bridge: &Bridge, mode: &str) -> Value {
    let mut command = std::process::Command::new(python());
    bridge.env(&mut command);
    command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/mcp_client.py"
        ))
        .arg(env!("CARGO_BIN_EXE_doorbell"))
        .arg(mode);
    let ran = run(command, None);
    assert_eq!(ran.code, 0, "{mode}: {}{}", ran.stdout, ran.stderr);
    serde_json::from_str(ran.stdout.trim()).unwrap()
}

#[test]
fn the_python_sdk_sends_reads_answers_and_waits_through_doorbell_mcp() {
    for (mode, protocol) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let bridge = Bridge::with_agents(&["web", "design"]);
        let seen = client(&bridge, mode);
        assert_eq!(seen["protocol"], protocol, "{seen}");
        assert!(seen["connect_secs"].as_f64().unwrap() < 1.0, "{seen}");
        let tools: Vec<&str> = seen["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(
            tools,
            ["debts", "read", "reply", "send", "show", "status", "wait"]
        );
        assert!(seen["tools_list_chars"].as_u64().unwrap() < 6000, "{seen}");
        assert_eq!(seen["unknown_tool_code"], -32602, "{seen}");
        assert!(seen["oversized"].as_str().unwrap().contains("shorten it"));
        let request = seen["request"].as_str().unwrap();
        assert_eq!(seen["waited"][0]["id"], request);
        assert_eq!(seen["waited"][0]["state"], "completed");
        assert_eq!(
            seen["thread"],
            serde_json::json!(["ETA for the footer?", "on it", "Friday"])
        );
        // The bridge agrees: one request, answered; nothing from the bad calls.
        assert_eq!(bridge.lines("web").len(), 1, "only the request reached web");
        assert!(!bridge.doorbell(&["debts"]).ok().contains(request));
        assert!(bridge
            .doorbell(&["show", request])
            .ok()
            .contains("read through mcp"));
    }
}
