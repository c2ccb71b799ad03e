//! `doorbell setup claude|codex|gemini --agent NAME [--project DIR] [--write]`: the hook and
//! MCP configuration that arms an agent in its harness (DESIGN §10). Printed by default; with
//! `--write` merged into the harness's own files: every hook and server already there is kept,
//! ours is added once (running it again changes nothing), new hook groups go last (Codex
//! trusts hooks by their position), and each file changed is first copied to
//! `<file>.doorbell-backup`. A file that is not what the harness reads (bad JSON) is never
//! overwritten. (A JSON file is written back with its keys in sorted order.)

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde_json::{json, Map, Value};

use crate::args::{Harness, SetupArgs};
use crate::exit::OK;
use crate::session::{shell_word, Session};

/// The harness's events for the four moments, and the matcher a tool event takes.
fn events(harness: Harness) -> [(&'static str, Option<&'static str>); 4] {
    match harness {
        Harness::Claude | Harness::Codex => [
            ("SessionStart", None),
            ("UserPromptSubmit", None),
            ("PostToolUse", Some("*")),
            ("Stop", None),
        ],
        Harness::Gemini => [
            ("SessionStart", None),
            ("BeforeAgent", None),
            ("AfterTool", Some("*")),
            ("AfterAgent", None),
        ],
    }
}

/// What runs doorbell: this very binary, by its full path (a harness's PATH may not hold it).
fn program() -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("finding the doorbell binary")?;
    Ok(exe.to_string_lossy().into_owned())
}

struct Plan {
    harness: Harness,
    agent: String,
    program: String,
    /// The config file given to `setup`, when not the default: the hooks and the server
    /// are given it too.
    config: Option<PathBuf>,
    dir: PathBuf,
}

impl Plan {
    fn hook_command(&self, event: &str) -> String {
        let harness = match self.harness {
            Harness::Claude => "claude",
            Harness::Codex => "codex",
            Harness::Gemini => "gemini",
        };
        let words: Vec<String> = std::iter::once(self.program.clone())
            .chain(self.bridge_args())
            .map(|word| shell_word(&word))
            .collect();
        format!(
            "{} hook {event} --agent {} --harness {harness}",
            words.join(" "),
            self.agent
        )
    }

    /// `[--config FILE] --dir DIR`: the bridge and the settings this setup was run with.
    fn bridge_args(&self) -> Vec<String> {
        let config = self
            .config
            .iter()
            .flat_map(|file| ["--config".into(), file.to_string_lossy().into_owned()]);
        config
            .chain(["--dir".into(), self.dir.to_string_lossy().into_owned()])
            .collect()
    }

    fn mcp_args(&self) -> Vec<String> {
        let mut args = self.bridge_args();
        args.extend(["mcp".into(), "--agent".into(), self.agent.clone()]);
        args
    }

    /// Refuse to arm a settings document that arms another agent already: one session is
    /// one agent, and two would show it both agents' mail and block it for both's debts.
    fn refuse_another_agent(&self, others: impl IntoIterator<Item = String>) -> anyhow::Result<()> {
        if let Some(other) = others.into_iter().find(|other| *other != self.agent) {
            bail!(
                "it arms the agent '{other}' already: a session is one agent. Remove doorbell's entries for '{other}' first, or arm '{}' in another project",
                self.agent
            );
        }
        Ok(())
    }

    /// Add our hooks to a settings document's `hooks`; whether anything changed.
    fn merge_hooks(&self, doc: &mut Value) -> anyhow::Result<bool> {
        let armed: Vec<String> = doc["hooks"]
            .as_object()
            .into_iter()
            .flat_map(|events| events.values())
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(|group| group["hooks"].as_array())
            .flatten()
            .filter_map(|handler| handler["command"].as_str())
            .filter_map(hooked_agent)
            .collect();
        self.refuse_another_agent(armed)?;
        let hooks = object_at(doc, "hooks")?;
        let mut changed = false;
        for (event, matcher) in events(self.harness) {
            let command = self.hook_command(event);
            let groups = hooks.entry(event).or_insert_with(|| json!([]));
            let Some(groups) = groups.as_array_mut() else {
                bail!("its \"hooks\".\"{event}\" is not a list");
            };
            let present = groups.iter().any(|g| {
                g["hooks"]
                    .as_array()
                    .is_some_and(|hs| hs.iter().any(|h| h["command"] == command.as_str()))
            });
            if present {
                continue;
            }
            let mut handler = Map::new();
            handler.insert("type".into(), json!("command"));
            handler.insert("command".into(), json!(command));
            match self.harness {
                Harness::Gemini => {
                    handler.insert("name".into(), json!(format!("doorbell-{event}")));
                    handler.insert("timeout".into(), json!(10_000)); // milliseconds
                }
                Harness::Claude | Harness::Codex => {
                    handler.insert("timeout".into(), json!(10)); // seconds
                }
            }
            let mut group = Map::new();
            if let Some(matcher) = matcher {
                group.insert("matcher".into(), json!(matcher));
            }
            group.insert("hooks".into(), json!([handler]));
            groups.push(Value::Object(group));
            changed = true;
        }
        Ok(changed)
    }

    /// Add the MCP server to a document's `mcpServers`, unless one named doorbell is there.
    fn merge_mcp_json(&self, doc: &mut Value) -> anyhow::Result<bool> {
        let servers = object_at(doc, "mcpServers")?;
        if let Some(server) = servers.get("doorbell") {
            self.refuse_another_agent(served_agent(server))?;
            return Ok(false);
        }
        servers.insert(
            "doorbell".into(),
            json!({ "command": self.program, "args": self.mcp_args() }),
        );
        Ok(true)
    }

    /// Refuse a Codex `config.toml` that, as it would be written, is no TOML, has no
    /// doorbell server where Codex looks for it, or has one for another agent: the file is
    /// left as it is.
    fn check_codex_toml(&self, path: &std::path::Path, text: &str) -> anyhow::Result<()> {
        let by_hand = || {
            format!(
                "{} is left as it is; add doorbell's server to it by hand:{}",
                path.display(),
                self.codex_mcp_toml()
            )
        };
        let doc: toml::Table = toml::from_str(text).map_err(|e| {
            anyhow::anyhow!(
                "{}: with doorbell's server added it would not be valid TOML ({}); {}",
                path.display(),
                e.message(),
                by_hand()
            )
        })?;
        let server = doc
            .get("mcp_servers")
            .and_then(|s| s.get("doorbell"))
            .and_then(toml::Value::as_table)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: its mcp_servers would not hold doorbell's server as a table; {}",
                    path.display(),
                    by_hand()
                )
            })?;
        let server = serde_json::to_value(server).unwrap_or_default();
        self.refuse_another_agent(served_agent(&server))
            .with_context(|| format!("merging into {}", path.display()))
    }

    fn codex_mcp_toml(&self) -> String {
        let quote = |s: &str| serde_json::to_string(s).expect("a string serialises");
        let args: Vec<String> = self.mcp_args().iter().map(|a| quote(a)).collect();
        format!(
            "\n[mcp_servers.doorbell]\ncommand = {}\nargs = [{}]\n",
            quote(&self.program),
            args.join(", ")
        )
    }
}

/// The agent a doorbell hook command (`… hook EVENT --agent NAME …`) is for.
fn hooked_agent(command: &str) -> Option<String> {
    let mut words = command.split_whitespace();
    words.by_ref().find(|w| *w == "hook")?;
    words.by_ref().find(|w| *w == "--agent")?;
    words.next().map(str::to_owned)
}

/// The agent a doorbell MCP server entry (`args: [… "mcp", "--agent", NAME]`) serves.
fn served_agent(server: &Value) -> Option<String> {
    let args: Vec<&str> = server["args"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let at = args.iter().position(|a| *a == "--agent")?;
    args.get(at + 1).map(|a| (*a).to_owned())
}

/// The object under `key` of a settings document (made when missing).
fn object_at<'a>(doc: &'a mut Value, key: &str) -> anyhow::Result<&'a mut Map<String, Value>> {
    let Some(root) = doc.as_object_mut() else {
        bail!("the file holds JSON that is not an object");
    };
    match root.entry(key).or_insert_with(|| json!({})).as_object_mut() {
        Some(object) => Ok(object),
        None => bail!("its \"{key}\" is not an object"),
    }
}

/// A JSON settings file as the harness has it: `{}` when missing.
fn load_json(path: &Path) -> anyhow::Result<Value> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(json!({})),
        Ok(text) => serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not valid JSON; fix it by hand first (doorbell leaves it as it is)",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(json!({})),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Replace `path` with `text`, keeping the old one as `<path>.doorbell-backup`.
fn write_with_backup(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    // The file keeps its mode; a new one gets a config file's usual 0644.
    let mode = std::fs::metadata(path).map_or(0o644, |m| m.permissions().mode() & 0o7777);
    if path.exists() {
        let backup = PathBuf::from(format!("{}.doorbell-backup", path.display()));
        std::fs::copy(path, &backup)
            .with_context(|| format!("backing up {} first", path.display()))?;
    }
    doorbell_store::atomic::write_atomic(path, text.as_bytes())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(())
}

/// One file's change: where, what it becomes, whether it changes.
struct Change {
    path: PathBuf,
    text: String,
    changed: bool,
}

fn json_change(
    path: PathBuf,
    merge: impl FnOnce(&mut Value) -> anyhow::Result<bool>,
) -> anyhow::Result<Change> {
    let mut doc = load_json(&path)?;
    let changed = merge(&mut doc).with_context(|| format!("merging into {}", path.display()))?;
    let mut text = serde_json::to_string_pretty(&doc).expect("JSON serialises");
    text.push('\n');
    Ok(Change {
        path,
        text,
        changed,
    })
}

fn home() -> anyhow::Result<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .context("HOME is not set: give --project DIR")
}

pub fn run(session: &Session, args: &SetupArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    bridge.require_inbox(&args.agent)?;
    let plan = Plan {
        harness: args.harness,
        agent: args.agent.clone(),
        program: program()?,
        config: session.config_file(),
        dir: bridge.dir().to_path_buf(),
    };
    let project = match &args.project {
        Some(dir) => Some(
            std::fs::canonicalize(dir)
                .with_context(|| format!("project folder {}", dir.display()))?,
        ),
        None => None,
    };
    let (changes, notes) = changes(&plan, project.as_deref())?;
    for change in &changes {
        if args.write {
            if change.changed {
                write_with_backup(&change.path, &change.text)?;
                out!("updated {}", change.path.display())?;
            } else {
                out!(
                    "unchanged {} (doorbell is already there)",
                    change.path.display()
                )?;
            }
        } else {
            out!(
                "# {}{}",
                change.path.display(),
                if change.changed {
                    ""
                } else {
                    " (already set up)"
                }
            )?;
            out_text!("{}", change.text)?;
        }
    }
    for note in &notes {
        out!("note: {note}")?;
    }
    if !args.write {
        out!("(nothing written: run again with --write to merge this into the files above)")?;
    }
    Ok(OK)
}

/// The files to change for `plan` (in `project`, else the user's), and what to tell the user.
fn changes(plan: &Plan, project: Option<&Path>) -> anyhow::Result<(Vec<Change>, Vec<String>)> {
    let mut changes = Vec::new();
    let mut notes = Vec::new();
    match (plan.harness, project) {
        (Harness::Claude, Some(dir)) => {
            changes.push(json_change(dir.join(".claude/settings.json"), |d| {
                plan.merge_hooks(d)
            })?);
            changes.push(json_change(dir.join(".mcp.json"), |d| {
                plan.merge_mcp_json(d)
            })?);
            notes.push(
                "Claude Code asks once before it starts a project's .mcp.json server.".to_owned(),
            );
        }
        (Harness::Claude, None) => {
            changes.push(json_change(home()?.join(".claude/settings.json"), |d| {
                plan.merge_hooks(d)
            })?);
            // ~/.claude.json is Claude Code's own file: its command adds the server there.
            let words: Vec<String> = plan.mcp_args().iter().map(|a| shell_word(a)).collect();
            notes.push(format!(
                "add the MCP server with: claude mcp add --scope user doorbell -- {} {}",
                shell_word(&plan.program),
                words.join(" ")
            ));
        }
        (Harness::Codex, scope) => {
            let base = match scope {
                Some(dir) => dir.join(".codex"),
                None => std::env::var_os("CODEX_HOME").map_or_else(
                    || home().map(|h| h.join(".codex")),
                    |h| Ok(PathBuf::from(h)),
                )?,
            };
            changes.push(json_change(base.join("hooks.json"), |d| {
                plan.merge_hooks(d)
            })?);
            let path = base.join("config.toml");
            let current = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            };
            let has = current
                .lines()
                .any(|l| l.trim() == "[mcp_servers.doorbell]");
            let text = if has {
                current.clone()
            } else {
                current.clone() + &plan.codex_mcp_toml()
            };
            plan.check_codex_toml(&path, &text)?;
            changes.push(Change {
                path,
                text,
                changed: !has,
            });
            notes.push(
                "Codex runs new hooks only once they are trusted: review them in /hooks."
                    .to_owned(),
            );
            if scope.is_some() {
                notes.push("A project's .codex/ is read only in a trusted project ([projects.\"DIR\"] trust_level = \"trusted\").".to_owned());
            }
        }
        (Harness::Gemini, scope) => {
            let path = match scope {
                Some(dir) => dir.join(".gemini/settings.json"),
                None => home()?.join(".gemini/settings.json"),
            };
            changes.push(json_change(path, |d| {
                let hooks = plan.merge_hooks(d)?;
                Ok(plan.merge_mcp_json(d)? || hooks)
            })?);
            notes
                .push("Gemini CLI runs hooks and MCP servers only in a trusted folder.".to_owned());
        }
    }
    Ok((changes, notes))
}
