//! `doorbell setup`: the harness's files gain doorbell's hooks and MCP server once, keep
//! everything else, are backed up first; and the hook commands written there work.

use serde_json::Value;

use crate::util::{run, Bridge};

fn json(path: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every hook command the settings give for `event`.
fn commands(settings: &Value, event: &str) -> Vec<String> {
    settings["hooks"][event]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["hooks"].as_array().unwrap().clone())
        .map(|h| h["command"].as_str().unwrap().to_owned())
        .collect()
}

fn fixture(harness: &str, name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/hooks/{harness}/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// `doorbell setup HARNESS --agent web --project DIR --write`, which must succeed.
fn write_setup(bridge: &Bridge, harness: &str, project: &str) {
    let args = [
        "setup",
        harness,
        "--agent",
        "web",
        "--project",
        project,
        "--write",
    ];
    bridge.doorbell(&args).ok();
}

/// Run a hook command as the harness does (`sh -c`), with a payload.
fn run_hook(bridge: &Bridge, command: &str, payload: &[u8]) -> crate::util::Run {
    let mut sh = std::process::Command::new("sh");
    bridge.env(&mut sh);
    sh.env_remove("DOORBELL_DIR").args(["-c", command]);
    run(sh, Some(payload))
}

#[test]
fn claude_project_settings_gain_doorbell_once_and_keep_the_rest() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let project = bridge.tmp.path().join("project");
    std::fs::create_dir_all(project.join(".claude")).unwrap();
    let mine = r#"{"model": "opus", "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "echo mine"}]}]}}"#;
    let settings = project.join(".claude/settings.json");
    std::fs::write(&settings, mine).unwrap();
    let project_arg = project.to_str().unwrap();
    for _ in 0..2 {
        write_setup(&bridge, "claude", project_arg);
    }
    let written = json(&settings);
    assert_eq!(written["model"], "opus");
    for event in ["SessionStart", "UserPromptSubmit", "PostToolUse", "Stop"] {
        let ours: Vec<String> = commands(&written, event)
            .into_iter()
            .filter(|c| c.contains(" hook "))
            .collect();
        assert_eq!(ours.len(), 1, "{event}: {written}");
    }
    assert_eq!(
        commands(&written, "Stop")[0],
        "echo mine",
        "theirs first, kept"
    );
    assert_eq!(written["hooks"]["PostToolUse"][0]["matcher"], "*");
    let backup = project.join(".claude/settings.json.doorbell-backup");
    assert_eq!(std::fs::read_to_string(backup).unwrap(), mine);
    let mcp = json(&project.join(".mcp.json"));
    let args: Vec<&str> = mcp["mcpServers"]["doorbell"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&args[2..], ["mcp", "--agent", "web"]);
    // The commands work as written, even without DOORBELL_DIR in the harness's environment.
    let id = bridge
        .doorbell(&[
            "send", "--from", "design", "--to", "web", "--kind", "request", "ETA?",
        ])
        .ok()
        .trim()
        .to_owned();
    let prompt = commands(&written, "UserPromptSubmit").pop().unwrap();
    let shown = run_hook(
        &bridge,
        &prompt,
        &fixture("claude", "UserPromptSubmit.json"),
    );
    assert_eq!(shown.code, 0, "{shown:?}");
    assert!(shown.stdout.contains(&id), "{}", shown.stdout);
}

#[test]
fn codex_user_files_gain_hooks_at_the_end_and_one_mcp_table() {
    let bridge = Bridge::with_agents(&["web"]);
    let codex = bridge.tmp.path().join("home/.codex");
    std::fs::create_dir_all(&codex).unwrap();
    let config = "model = \"o4\"\n\n[mcp_servers.other]\ncommand = \"other\"\n";
    std::fs::write(codex.join("config.toml"), config).unwrap();
    let hooks = r#"{"hooks": {"PostToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "lint"}]}]}}"#;
    std::fs::write(codex.join("hooks.json"), hooks).unwrap();
    for _ in 0..2 {
        bridge
            .doorbell(&["setup", "codex", "--agent", "web", "--write"])
            .ok();
    }
    let toml = std::fs::read_to_string(codex.join("config.toml")).unwrap();
    assert!(toml.starts_with(config), "{toml}");
    assert_eq!(toml.matches("[mcp_servers.doorbell]").count(), 1, "{toml}");
    let written = json(&codex.join("hooks.json"));
    let post = commands(&written, "PostToolUse");
    assert_eq!(post.len(), 2);
    assert_eq!(
        post[0], "lint",
        "an existing group keeps its position (Codex trusts by it)"
    );
    assert!(
        post[1].ends_with("hook PostToolUse --agent web --harness codex"),
        "{post:?}"
    );
    let stop = commands(&written, "Stop").pop().unwrap();
    let bridge_ask = bridge.doorbell(&["agent", "add", "design"]);
    bridge_ask.ok();
    bridge
        .doorbell(&[
            "send", "--from", "design", "--to", "web", "--kind", "request", "?",
        ])
        .ok();
    let blocked = run_hook(&bridge, &stop, &fixture("codex", "Stop.json"));
    let answer: Value = serde_json::from_str(&blocked.stdout).unwrap();
    assert_eq!(answer["decision"], "block", "{blocked:?}");
}

#[test]
fn gemini_settings_keep_their_servers_and_bad_json_is_left_alone() {
    let bridge = Bridge::with_agents(&["web"]);
    let project = bridge.tmp.path().join("project");
    std::fs::create_dir_all(project.join(".gemini")).unwrap();
    let settings = project.join(".gemini/settings.json");
    std::fs::write(&settings, r#"{"mcpServers": {"other": {"command": "x"}}}"#).unwrap();
    let project_arg = project.to_str().unwrap();
    write_setup(&bridge, "gemini", project_arg);
    let written = json(&settings);
    assert_eq!(written["mcpServers"]["other"]["command"], "x");
    assert!(written["mcpServers"]["doorbell"].is_object());
    let after = &written["hooks"]["AfterAgent"][0]["hooks"][0];
    assert_eq!(after["name"], "doorbell-AfterAgent");
    assert_eq!(after["timeout"], 10_000, "Gemini counts milliseconds");
    // Printing writes nothing; a file that is not JSON is refused and left as it is.
    std::fs::write(&settings, "{ not json").unwrap();
    let printed = bridge.doorbell(&[
        "setup",
        "gemini",
        "--agent",
        "web",
        "--project",
        project_arg,
    ]);
    assert_ne!(printed.code, 0, "{printed:?}");
    assert!(
        printed.stderr.contains("not valid JSON"),
        "{}",
        printed.stderr
    );
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), "{ not json");
}

/// A project armed for one agent is not armed for a second one on top: one session is one
/// agent. `setup` says so and writes nothing; the first agent's entries stay as they were.
#[test]
fn a_project_armed_for_one_agent_is_not_armed_for_another_on_top() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let project = bridge.tmp.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let project_arg = project.to_str().unwrap();
    for harness in ["claude", "codex", "gemini"] {
        let arm = |agent: &str| {
            bridge.doorbell(&[
                "setup",
                harness,
                "--agent",
                agent,
                "--project",
                project_arg,
                "--write",
            ])
        };
        let armed = arm("web");
        assert_eq!(armed.code, 0, "{harness}: {armed:?}");
        let files: Vec<(std::path::PathBuf, Vec<u8>)> = walk(&project)
            .into_iter()
            .map(|path| {
                let bytes = std::fs::read(&path).unwrap();
                (path, bytes)
            })
            .collect();
        let again = arm("design");
        assert_ne!(again.code, 0, "{harness}: {again:?}");
        assert!(
            again.stderr.contains("it arms the agent 'web' already"),
            "{harness}: {}",
            again.stderr
        );
        for (path, bytes) in files {
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "{}", path.display());
        }
        // The same agent again changes nothing and is no error.
        let same = arm("web");
        assert_eq!(same.code, 0, "{harness}: {same:?}");
    }
}

/// A Codex `config.toml` that doorbell's table cannot be appended to (its `mcp_servers` an
/// inline table or a number, or no TOML at all) is left as it is, with the table to add by
/// hand; nothing else is written either.
#[test]
fn a_codex_config_doorbell_cannot_extend_is_left_alone() {
    let bridge = Bridge::with_agents(&["web"]);
    for config in [
        "mcp_servers = { other = { command = \"x\" } }\n",
        "mcp_servers = 5\n",
        "x = \n",
    ] {
        let project = bridge.tmp.path().join(format!("p{}", config.len()));
        std::fs::create_dir_all(project.join(".codex")).unwrap();
        let path = project.join(".codex/config.toml");
        std::fs::write(&path, config).unwrap();
        let run = bridge.doorbell(&[
            "setup",
            "codex",
            "--agent",
            "web",
            "--project",
            project.to_str().unwrap(),
            "--write",
        ]);
        assert_ne!(run.code, 0, "{config}: {run:?}");
        assert!(
            run.stderr.contains("add doorbell's server to it by hand"),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("[mcp_servers.doorbell]"),
            "{}",
            run.stderr
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), config);
        assert!(!project.join(".codex/hooks.json").exists());
    }
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn setup_given_another_config_file_writes_commands_that_use_it() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let config = bridge.tmp.path().join("other.toml");
    std::fs::write(&config, "hook_max_chars = 1500\n").unwrap();
    let project = bridge.tmp.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let project_arg = project.to_str().unwrap();
    let config_arg = config.to_str().unwrap();
    bridge
        .doorbell(&[
            "setup",
            "claude",
            "--agent",
            "web",
            "--project",
            project_arg,
            "--config",
            config_arg,
            "--write",
        ])
        .ok();
    let mcp = json(&project.join(".mcp.json"));
    let args = &mcp["mcpServers"]["doorbell"]["args"];
    assert_eq!(args[0], "--config", "{mcp}");
    assert_eq!(args[1], config_arg, "{mcp}");
    for n in 0..30 {
        let text = format!("note {n}: {}", "the footer is grey ".repeat(8));
        bridge
            .doorbell(&["send", "--from", "design", "--to", "web", &text])
            .ok();
    }
    let settings = json(&project.join(".claude/settings.json"));
    let prompt = commands(&settings, "UserPromptSubmit").pop().unwrap();
    let shown = run_hook(
        &bridge,
        &prompt,
        &fixture("claude", "UserPromptSubmit.json"),
    );
    assert_eq!(shown.code, 0, "{shown:?}");
    let out: Value = serde_json::from_str(&shown.stdout).unwrap();
    let context = out["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    // The other file's cap, not the default 4,000.
    let units = context.encode_utf16().count();
    assert!((1..=1500).contains(&units), "{units}: {context}");
}
