//! The TOML config. Every setting has a default, so no file is needed; a file that exists is
//! read strictly: an unknown key or a bad value is an error naming the key and the file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use doorbell_core::duration::parse_duration;
use doorbell_core::{is_agent_name, BUILTIN_LOOPS};
use serde::Deserialize;

use crate::{Error, Result};

/// One `[[agent]]` entry: a station, with an optional hook run when messages arrive.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub name: String,
    #[serde(default)]
    pub hook: Option<Vec<String>>,
    /// What the station does, for its A2A Agent Card.
    #[serde(default)]
    pub description: Option<String>,
    /// What the station can be asked, for its A2A Agent Card (`[[agent.skill]]`).
    #[serde(default, rename = "skill")]
    pub skills: Vec<SkillConfig>,
}

/// One `[[agent.skill]]`: a skill on the station's Agent Card.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillConfig {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub examples: Vec<String>,
}

/// One `[[remote]]`: a caller of the A2A gateway, a station like any other. Its bearer token
/// (read from `token_file`) names it, so on that channel its name is authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    pub name: String,
    pub token_file: Option<PathBuf>,
    /// The remote's own bridge, when it has one: its A2A endpoint.
    pub url: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoteFile {
    name: String,
    token_file: Option<String>,
    url: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct A2aFile {
    listen: Option<String>,
}

/// The `[debts]` table: when the doorbell rings again and when a debt counts as stalled.
#[derive(Debug, Clone, PartialEq)]
pub struct Debts {
    pub ring_after: Duration,
    pub backoff: f64,
    pub max_rings: u32,
    pub stalled_after: Duration,
}

impl Default for Debts {
    fn default() -> Self {
        Self {
            ring_after: Duration::from_secs(30 * 60),
            backoff: 2.0,
            max_rings: 4,
            stalled_after: Duration::from_secs(4 * 3600),
        }
    }
}

/// The whole configuration, defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the file came from, when there was one.
    pub path: Option<PathBuf>,
    /// The bridge folder, when the config names one.
    pub dir: Option<PathBuf>,
    /// The station that gets escalations and the morning report.
    pub human: String,
    pub max_line_bytes: usize,
    pub agents: Vec<AgentConfig>,
    pub loops: Vec<String>,
    /// Each loop's owner, when it has one: the station that answers for its requests.
    pub loop_owners: BTreeMap<String, String>,
    pub debts: Debts,
    /// Whether the daemon keeps the board, `<bridge>/STATUS.md`.
    pub board: bool,
    /// After a tool call, a hook speaks at most this often (DESIGN §10).
    pub hook_every: Duration,
    /// A running daemon sends one sender at most one refusal notice this often (zero: as
    /// often as it refuses, 200 ms apart).
    pub notice_every: Duration,
    /// The most a hook puts in an agent's context at once, in characters.
    pub hook_max_chars: usize,
    /// Where the daemon serves the A2A gateway (`[a2a] listen`), when it does.
    pub a2a_listen: Option<std::net::SocketAddr>,
    pub remotes: Vec<RemoteConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            path: None,
            dir: None,
            human: "human".to_owned(),
            max_line_bytes: 1024 * 1024,
            agents: Vec::new(),
            loops: Vec::new(),
            loop_owners: BTreeMap::new(),
            debts: Debts::default(),
            board: false,
            hook_every: Duration::from_secs(30),
            notice_every: Duration::from_secs(5),
            hook_max_chars: 4000,
            a2a_listen: None,
            remotes: Vec::new(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    dir: Option<String>,
    human: Option<String>,
    max_line_bytes: Option<usize>,
    board: Option<bool>,
    hook_every: Option<String>,
    hook_max_chars: Option<usize>,
    notice_every: Option<String>,
    #[serde(default)]
    agent: Vec<AgentConfig>,
    #[serde(default, rename = "loop")]
    loops: Vec<LoopFile>,
    debts: Option<DebtsFile>,
    a2a: Option<A2aFile>,
    #[serde(default)]
    remote: Vec<RemoteFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoopFile {
    name: String,
    /// The station that answers for the loop's requests.
    owner: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DebtsFile {
    ring_after: Option<String>,
    backoff: Option<f64>,
    max_rings: Option<u32>,
    stalled_after: Option<String>,
}

/// The hook keys (DESIGN §10).
fn hooks(
    every: Option<&str>,
    max: Option<usize>,
    config: &mut Config,
) -> std::result::Result<(), String> {
    if let Some(every) = every {
        config.hook_every = parse_duration(every).map_err(|e| format!("key 'hook_every': {e}"))?;
    }
    if let Some(max) = max {
        // Claude Code swaps anything over 10,000 characters for a file path.
        if !(1_500..=9_000).contains(&max) {
            return Err(format!(
                "key 'hook_max_chars': {max} must be between 1500 and 9000 (room for a framed message; harnesses hide longer hook output)"
            ));
        }
        config.hook_max_chars = max;
    }
    Ok(())
}

/// The A2A keys (DESIGN §11): `[a2a] listen` and the `[[remote]]` callers.
fn a2a(
    a2a: Option<A2aFile>,
    remotes: &[RemoteFile],
    names: &mut BTreeSet<String>,
    config: &mut Config,
) -> std::result::Result<(), String> {
    for remote in remotes {
        check_name(&remote.name, "remote", names)?;
        if let Some(url) = &remote.url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "key 'remote.url' of '{}': '{url}' is not an http:// or https:// URL",
                    remote.name
                ));
            }
        }
        config.remotes.push(RemoteConfig {
            name: remote.name.clone(),
            token_file: remote.token_file.as_deref().map(expand_home),
            url: remote.url.clone(),
        });
    }
    if let Some(listen) = a2a.and_then(|a| a.listen) {
        let addr = listen.parse().map_err(|_| {
            format!("key 'a2a.listen': '{listen}' is not an address and port (e.g. 127.0.0.1:7717)")
        })?;
        config.a2a_listen = Some(addr);
    }
    Ok(())
}

/// The config file used when none is named: `$XDG_CONFIG_HOME/doorbell/doorbell.toml`.
#[must_use]
pub fn default_path() -> Option<PathBuf> {
    directories::BaseDirs::new()
        .map(|dirs| dirs.config_dir().join("doorbell").join("doorbell.toml"))
}

/// Expand a leading `~/` to the home folder.
#[must_use]
pub fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), path == "~") {
        (_, true) => home().unwrap_or_else(|| PathBuf::from(path)),
        (Some(rest), _) => home().map_or_else(|| PathBuf::from(path), |h| h.join(rest)),
        (None, _) => PathBuf::from(path),
    }
}

fn home() -> Option<PathBuf> {
    directories::BaseDirs::new().map(|d| d.home_dir().to_path_buf())
}

impl Config {
    /// Load `explicit` (which must exist), else the default path when it exists, else the
    /// defaults.
    pub fn load(explicit: Option<&Path>) -> Result<Config> {
        match explicit {
            Some(path) => Config::from_file(path),
            None => match default_path() {
                Some(path) if path.exists() => Config::from_file(&path),
                _ => Ok(Config::default()),
            },
        }
    }

    /// Read and validate one config file.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(Error::io("read config", path))?;
        Config::parse(&text, path)
    }

    /// Parse and validate config text; `path` names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config> {
        let bad = |message: String| Error::Config {
            path: path.to_path_buf(),
            message,
        };
        let file: ConfigFile = toml::from_str(text).map_err(|e| bad(one_line(&e, text)))?;
        let mut config = Config {
            path: Some(path.to_path_buf()),
            ..Config::default()
        };
        config.dir = file.dir.as_deref().map(expand_home);
        if let Some(human) = file.human {
            if !is_agent_name(&human) {
                return Err(bad(format!(
                    "key 'human': '{human}' is not a valid agent name"
                )));
            }
            config.human = human;
        }
        if let Some(max) = file.max_line_bytes {
            if max < 256 {
                return Err(bad(format!(
                    "key 'max_line_bytes': {max} is too small (at least 256)"
                )));
            }
            config.max_line_bytes = max;
        }
        let mut names = BTreeSet::new();
        for agent in &file.agent {
            check_name(&agent.name, "agent", &mut names).map_err(bad)?;
            if let Some(hook) = &agent.hook {
                if hook.is_empty() || hook[0].is_empty() {
                    return Err(bad(format!(
                        "key 'agent.hook' of '{}': the hook needs a program",
                        agent.name
                    )));
                }
            }
        }
        for entry in &file.loops {
            check_name(&entry.name, "loop", &mut names).map_err(bad)?;
        }
        a2a(file.a2a, &file.remote, &mut names, &mut config).map_err(bad)?;
        check_human(&config.human, file.loops.iter().map(|l| l.name.as_str())).map_err(bad)?;
        for entry in &file.loops {
            let Some(owner) = &entry.owner else { continue };
            let refused = if !is_agent_name(owner) {
                Some("is not a valid agent name")
            } else if BUILTIN_LOOPS.contains(&owner.as_str()) || owner == "all" {
                Some("is reserved")
            } else if file.loops.iter().any(|l| &l.name == owner) {
                Some("is a loop, and only a station can answer for a loop")
            } else {
                None
            };
            if let Some(why) = refused {
                return Err(bad(format!(
                    "key 'loop.owner' of '{}': '{owner}' {why}",
                    entry.name
                )));
            }
            config.loop_owners.insert(entry.name.clone(), owner.clone());
        }
        config.board = file.board.unwrap_or(false);
        hooks(file.hook_every.as_deref(), file.hook_max_chars, &mut config).map_err(bad)?;
        if let Some(every) = file.notice_every.as_deref() {
            config.notice_every =
                parse_duration(every).map_err(|e| bad(format!("key 'notice_every': {e}")))?;
        }
        config.agents = file.agent;
        config.loops = file.loops.into_iter().map(|l| l.name).collect();
        if let Some(debts) = file.debts {
            let duration =
                |key: &str, value: Option<String>, default: Duration| -> Result<Duration> {
                    value.map_or(Ok(default), |v| {
                        parse_duration(&v).map_err(|e| bad(format!("key 'debts.{key}': {e}")))
                    })
                };
            config.debts.ring_after =
                duration("ring_after", debts.ring_after, config.debts.ring_after)?;
            config.debts.stalled_after = duration(
                "stalled_after",
                debts.stalled_after,
                config.debts.stalled_after,
            )?;
            if config.debts.ring_after.is_zero() {
                return Err(bad("key 'debts.ring_after': must be more than zero".into()));
            }
            if let Some(backoff) = debts.backoff {
                if !(1.0..=100.0).contains(&backoff) {
                    return Err(bad(format!(
                        "key 'debts.backoff': {backoff} must be between 1 and 100"
                    )));
                }
                config.debts.backoff = backoff;
            }
            if let Some(max_rings) = debts.max_rings {
                config.debts.max_rings = max_rings;
            }
        }
        Ok(config)
    }

    /// The hook of `agent`, when the config gives one.
    #[must_use]
    pub fn hook(&self, agent: &str) -> Option<&[String]> {
        self.agents
            .iter()
            .find(|a| a.name == agent)
            .and_then(|a| a.hook.as_deref())
    }
}

/// A TOML error on one line, since logs (journald) keep lines apart: where, the line itself
/// (which names the key, also for a bad value), and what is wrong.
fn one_line(error: &toml::de::Error, text: &str) -> String {
    let message = error.message().trim_end().replace('\n', " ");
    let Some(before) = error.span().and_then(|span| text.get(..span.start)) else {
        return message;
    };
    let number = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |at| at + 1);
    let end = text[before.len()..]
        .find('\n')
        .map_or(text.len(), |at| before.len() + at);
    format!("line {number} `{}`: {message}", text[start..end].trim())
}

fn check_name(
    name: &str,
    what: &str,
    seen: &mut BTreeSet<String>,
) -> std::result::Result<(), String> {
    if !is_agent_name(name) {
        return Err(format!(
            "key '{what}.name': '{name}' is not a valid agent name"
        ));
    }
    if BUILTIN_LOOPS.contains(&name) {
        return Err(format!(
            "key '{what}.name': '{name}' is a built-in loop of the bridge"
        ));
    }
    if name == "all" {
        return Err(format!(
            "key '{what}.name': 'all' is reserved: it means every station"
        ));
    }
    if !seen.insert(name.to_owned()) {
        return Err(format!("key '{what}.name': '{name}' is named twice"));
    }
    Ok(())
}

/// The station that gets escalations and the report: never a name no station may have, nor a
/// loop's (a loop has no inbox).
fn check_human<'a>(
    human: &str,
    mut loops: impl Iterator<Item = &'a str>,
) -> std::result::Result<(), String> {
    let why = if BUILTIN_LOOPS.contains(&human) || human == "all" {
        "is reserved: no station may have it"
    } else if loops.any(|name| name == human) {
        "is a [[loop]], which has no inbox to receive escalations and the report"
    } else {
        return Ok(());
    };
    Err(format!("key 'human': '{human}' {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config> {
        Config::parse(text, Path::new("/etc/doorbell.toml"))
    }

    #[test]
    fn empty_file_is_all_defaults() {
        let config = parse("").unwrap();
        assert_eq!(config.human, "human");
        assert_eq!(config.max_line_bytes, 1 << 20);
        assert_eq!(config.debts, Debts::default());
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let err = parse("dri = \"/tmp\"\n").unwrap_err().to_string();
        assert!(err.contains("/etc/doorbell.toml"), "{err}");
        assert!(err.contains("dri"), "{err}");
        let err = parse("[debts]\nring_afterr = \"1h\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("ring_afterr"), "{err}");
    }

    #[test]
    fn toml_errors_are_one_line_that_names_the_key() {
        let err = parse("human = \"human\"\ncolour = \"blue\"\n")
            .unwrap_err()
            .to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains("line 2 `colour = \"blue\"`"), "{err}");
        assert!(err.contains("unknown field `colour`"), "{err}");
        let err = parse("max_line_bytes = \"big\"\n").unwrap_err().to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains("max_line_bytes"), "{err}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let err = parse("[debts]\nring_after = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("debts.ring_after"), "{err}");
        let err = parse("[[agent]]\nname = \"Web\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("agent.name"), "{err}");
        let err = parse("[[loop]]\nname = \"bridge\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("built-in"), "{err}");
        let err = parse("[[agent]]\nname = \"a\"\n[[loop]]\nname = \"a\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("twice"), "{err}");
    }

    #[test]
    fn home_is_expanded() {
        let config = parse("dir = \"~/bridge\"\n").unwrap();
        assert!(!config.dir.unwrap().starts_with("~"));
    }

    #[test]
    fn a_human_no_station_may_be_is_an_error_naming_the_key() {
        for (text, says) in [
            ("human = \"debt-loop\"\n", "is reserved"),
            ("human = \"all\"\n", "is reserved"),
            (
                "human = \"cron\"\n[[loop]]\nname = \"cron\"\n",
                "is a [[loop]]",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(
                err.contains("key 'human'") && err.contains(says),
                "{text}: {err}"
            );
        }
    }
}
