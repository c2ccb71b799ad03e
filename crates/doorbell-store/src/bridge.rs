//! The bridge folder: where it is, which inboxes it holds, and who is known there.
//!
//! Only names that pass `is_agent_name` ever become paths, so nothing outside the folder can
//! be named; the folder itself is canonicalised once, and nothing inside it is followed
//! through a symlink.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use doorbell_core::{is_agent_name, Registry};

use crate::{Config, Error, Result};

/// The suffix that makes a file an inbox.
pub const INBOX_SUFFIX: &str = "-inbox.jsonl";
/// The suffix of an agent's own cursor, beside its inbox.
pub const CURSOR_SUFFIX: &str = "-inbox.cursor";
/// The judge's own folder inside the bridge.
pub const STATE_DIR: &str = ".doorbell";

/// The judge's names for `scripts/doorbell-send`, in `.doorbell/`: see [`names_file`].
pub const NAMES_FILE: &str = "names";

/// The names file's text: the judge's stations that have no inbox (config `[[agent]]`
/// entries) and its loops, one per line as `station NAME`, `loop NAME` or `loop NAME OWNER`.
/// A station with an inbox is known by its file.
#[must_use]
pub fn names_file(
    registry: &Registry,
    inboxes: &std::collections::BTreeSet<String>,
    max_line_bytes: usize,
) -> String {
    let mut text = String::from(
        "# The judge's names, kept by the daemon for scripts/doorbell-send (which cannot read the config).\n",
    );
    text.extend(["limit max_line_bytes ", &max_line_bytes.to_string(), "\n"]);
    for station in registry.stations.difference(inboxes) {
        text.extend(["station ", station, "\n"]);
    }
    for name in &registry.loops {
        text.extend(["loop ", name]);
        if let Some(owner) = registry.owners.get(name) {
            text.extend([" ", owner]);
        }
        text.push('\n');
    }
    text
}

/// An open bridge folder and the config that applies to it.
#[derive(Debug, Clone)]
pub struct Bridge {
    dir: PathBuf,
    pub config: Config,
}

/// The folder to use: `--dir`, else `$DOORBELL_DIR`, else the config's `dir`, else the
/// platform data folder.
#[must_use]
pub fn resolve_dir(cli: Option<&Path>, config: &Config) -> PathBuf {
    if let Some(dir) = cli {
        return dir.to_path_buf();
    }
    if let Some(dir) = std::env::var_os("DOORBELL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = &config.dir {
        return dir.clone();
    }
    directories::BaseDirs::new().map_or_else(
        || PathBuf::from(".doorbell-bridge"),
        |dirs| dirs.data_dir().join("doorbell"),
    )
}

fn make_private_dir(path: &Path) -> Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(Error::io("create folder", path))
}

/// Make the private folder `path` (0700) inside a folder that exists; one already there is
/// fine. Never its parents: a bridge folder removed under a running process (being restored
/// from a backup) is never made again around it.
pub(crate) fn make_dir_in(path: &Path) -> Result<()> {
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io("create folder", path)(e)),
    }
}

impl Bridge {
    /// Open an existing bridge folder.
    pub fn open(dir: &Path, config: Config) -> Result<Bridge> {
        let dir = fs::canonicalize(dir).map_err(|e| match e.kind() {
            ErrorKind::NotFound => Error::NoBridge {
                path: dir.to_path_buf(),
            },
            _ => Error::io("open bridge folder", dir)(e),
        })?;
        if !dir.is_dir() {
            return Err(Error::NoBridge { path: dir });
        }
        Ok(Bridge { dir, config })
    }

    /// Open the bridge folder, creating it (mode 0700) when it does not exist yet.
    pub fn create(dir: &Path, config: Config) -> Result<Bridge> {
        make_private_dir(dir)?;
        Bridge::open(dir, config)
    }

    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The judge's folder, `.doorbell/`, created (0700) when missing.
    pub fn state_dir(&self) -> Result<PathBuf> {
        let path = self.dir.join(STATE_DIR);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(meta) => return Err(state_not_folder(path, &meta)),
            Err(e) if e.kind() == ErrorKind::NotFound => make_dir_in(&path)?,
            Err(e) => return Err(Error::io("stat", &path)(e)),
        }
        Ok(path)
    }

    #[must_use]
    pub fn max_line_bytes(&self) -> usize {
        self.config.max_line_bytes
    }

    /// The inbox of a valid agent name.
    pub fn inbox_path(&self, name: &str) -> Result<PathBuf> {
        check_name(name)?;
        Ok(self.dir.join(format!("{name}{INBOX_SUFFIX}")))
    }

    /// The agent's own cursor file, beside its inbox.
    pub fn cursor_path(&self, name: &str) -> Result<PathBuf> {
        check_name(name)?;
        Ok(self.dir.join(format!("{name}{CURSOR_SUFFIX}")))
    }

    /// The agents that have an inbox file in the folder, sorted. Files that are not regular
    /// (symlinks, FIFOs, devices) are left out: they are refused, never read. So is a file
    /// named for a `[[loop]]` of the config: the name is the loop's, which has no inbox.
    pub fn inboxes(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        let entries =
            fs::read_dir(&self.dir).map_err(Error::io("list bridge folder", &self.dir))?;
        for entry in entries {
            let entry = entry.map_err(Error::io("list bridge folder", &self.dir))?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(inbox_name) else {
                continue;
            };
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            if is_file && !self.is_config_loop(name) {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Inbox-named entries that are not regular files: refused, reported by `status`.
    pub fn refused_inboxes(&self) -> Result<Vec<PathBuf>> {
        Ok(self
            .files_nothing_reads()?
            .into_iter()
            .filter_map(|file| match file {
                Stray::NotRegular(path) => Some(path),
                Stray::Reserved(_) | Stray::NearMiss { .. } => None,
            })
            .collect())
    }

    /// Entries of the bridge folder that look like inboxes and that nothing reads, in one
    /// listing, sorted by path: inbox-named entries that are not regular files (refused),
    /// and files with bytes in them whose names come close to an inbox's without being one
    /// (`Web-inbox.jsonl`, `web-inbox.json`, `web_inbox.jsonl`), where what a sender wrote
    /// would lie unseen.
    pub fn files_nothing_reads(&self) -> Result<Vec<Stray>> {
        let mut found = Vec::new();
        let entries =
            fs::read_dir(&self.dir).map_err(Error::io("list bridge folder", &self.dir))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let named = name.strip_suffix(INBOX_SUFFIX);
            if named.is_some_and(is_reserved_name) {
                found.push(Stray::Reserved(entry.path()));
                continue;
            }
            // Said by `config_warnings`, with the loop's name.
            if named.is_some_and(|name| self.is_config_loop(name)) {
                continue;
            }
            if inbox_name(&name).is_some() {
                if !entry.file_type().is_ok_and(|t| t.is_file()) {
                    found.push(Stray::NotRegular(entry.path()));
                }
                continue;
            }
            let Some(meant) = near_miss(&name) else {
                continue;
            };
            let holds_bytes = entry
                .metadata()
                .is_ok_and(|meta| meta.is_file() && meta.len() > 0);
            if holds_bytes {
                let meant = is_agent_name(&meant).then(|| format!("{meant}{INBOX_SUFFIX}"));
                found.push(Stray::NearMiss {
                    path: entry.path(),
                    meant,
                });
            }
        }
        found.sort_by(|a, b| a.path().cmp(b.path()));
        Ok(found)
    }

    /// What `.doorbell/names` holds now, if anything.
    #[must_use]
    pub fn published_names(&self) -> Option<String> {
        let path = self.dir.join(STATE_DIR).join(NAMES_FILE);
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .ok()?;
        std::io::read_to_string(file).ok()
    }

    /// What the judge that wrote `.doorbell/names` goes by: its registry (its stations
    /// without an inbox and its loops, with `inboxes`, the folder's as listed now) and its
    /// line limit; `None` when no judge published them.
    #[must_use]
    pub fn published_registry(&self, inboxes: Vec<String>) -> Option<(Registry, Option<usize>)> {
        let text = self.published_names()?;
        let mut registry = Registry::default();
        registry.stations.extend(inboxes);
        let mut limit = None;
        for line in text.lines() {
            match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["station", name] => {
                    registry.stations.insert((*name).to_owned());
                }
                ["loop", name, owner @ ..] => {
                    registry.loops.insert((*name).to_owned());
                    if let [owner] = owner {
                        registry
                            .owners
                            .insert((*name).to_owned(), (*owner).to_owned());
                    }
                }
                ["limit", "max_line_bytes", n] => limit = n.parse().ok(),
                _ => {}
            }
        }
        Some((registry, limit))
    }

    /// Replace `.doorbell/names` with `text` (see [`names_file`]).
    pub fn publish_names(&self, text: &str) -> Result<()> {
        let path = self.state_dir()?.join(NAMES_FILE);
        crate::atomic::write_atomic(&path, text.as_bytes())
    }

    /// Stations (inboxes and `[[agent]]` entries) and config loops.
    pub fn registry(&self) -> Result<Registry> {
        self.registry_of(self.inboxes()?)
    }

    /// Whether `name` is a `[[loop]]` of the config.
    #[must_use]
    pub fn is_config_loop(&self, name: &str) -> bool {
        self.config.loops.iter().any(|l| l == name)
    }

    /// [`Bridge::registry`] with `inboxes` as [`Bridge::inboxes`] listed them just now. What
    /// the folder and the config say of a name never stops the bridge: a file named for a
    /// loop is no inbox (the listing leaves it out), and a loop whose owner is no station is
    /// `unowned` (its requests are refused, saying why); [`Bridge::config_warnings`] says both.
    pub fn registry_of(&self, inboxes: Vec<String>) -> Result<Registry> {
        let mut registry = Registry::default();
        registry.stations.extend(inboxes);
        registry
            .stations
            .extend(self.config.agents.iter().map(|a| a.name.clone()));
        registry
            .stations
            .extend(self.config.remotes.iter().map(|r| r.name.clone()));
        registry.loops.extend(self.config.loops.iter().cloned());
        for (name, owner) in &self.config.loop_owners {
            let owners = if registry.stations.contains(owner) {
                &mut registry.owners
            } else {
                &mut registry.unowned
            };
            owners.insert(name.clone(), owner.clone());
        }
        Ok(registry)
    }

    /// What the config names that the folder does not have, each said as a warning (at the
    /// daemon's start, at each reload, and by `status`): the human station or a loop's owner
    /// without an inbox, and a file named for a loop, which nothing reads.
    pub fn config_warnings(&self) -> Result<Vec<String>> {
        let inboxes = self.inboxes()?;
        let registry = self.registry_of(inboxes.clone())?;
        let human = &self.config.human;
        let mut warnings = Vec::new();
        if !inboxes.contains(human) {
            warnings.push(format!(
                "the human station '{human}' has no inbox: escalations and reports have nowhere to go (doorbell agent add {human})"
            ));
        }
        for (name, owner) in &registry.unowned {
            warnings.push(format!(
                "the [[loop]] '{name}' names '{owner}' as its owner, which is no station: its requests are refused until it is one (doorbell agent add {owner})"
            ));
        }
        for name in &self.config.loops {
            let path = self.dir.join(format!("{name}{INBOX_SUFFIX}"));
            if fs::symlink_metadata(&path).is_ok() {
                warnings.push(format!(
                    "{} is no inbox and nothing reads it: '{name}' is a [[loop]] of the config, which sends and has no inbox",
                    path.display()
                ));
            }
        }
        Ok(warnings)
    }

    /// Where what lands in `name`'s inbox is forwarded, when `name` is a `[[remote]]` station
    /// on another bridge: the forwarder is then that inbox's only reader.
    #[must_use]
    pub fn forwarded_to(&self, name: &str) -> Option<&str> {
        let remote = self.config.remotes.iter().find(|r| r.name == name)?;
        remote.url.as_deref()
    }

    /// The inbox of an agent that must exist: sending never creates one.
    pub fn require_inbox(&self, name: &str) -> Result<PathBuf> {
        let path = self.inbox_path(name)?;
        if self.is_config_loop(name) {
            return Err(Error::NameTaken {
                name: name.to_owned(),
                why: "it is a [[loop]] in the config, which sends and has no inbox; send to an agent instead".to_owned(),
            });
        }
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_file() => Ok(path),
            Ok(_) => Err(Error::NotRegularFile { path }),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(Error::NoSuchAgent {
                name: name.to_owned(),
                known: self.inboxes()?,
            }),
            Err(e) => Err(Error::io("open inbox", &path)(e)),
        }
    }

    /// Create an agent's inbox (mode 0600). An existing one is an error, and so is a name
    /// another sender already has: a built-in loop, `all`, or a `[[loop]]` of the config.
    pub fn add_agent(&self, name: &str) -> Result<PathBuf> {
        let taken = |why: String| Error::NameTaken {
            name: name.to_owned(),
            why,
        };
        if doorbell_core::BUILTIN_LOOPS.contains(&name) {
            return Err(taken(
                "it is a built-in loop of the bridge; pick another name".into(),
            ));
        }
        if name == "all" {
            return Err(taken(
                "'all' means every station (a broadcast); pick another name".into(),
            ));
        }
        if self.config.loops.iter().any(|l| l == name) {
            return Err(taken(
                "it is a [[loop]] in the config: a station and a loop cannot share a name".into(),
            ));
        }
        let path = self.inbox_path(name)?;
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(file) => {
                // The umask may have narrowed the mode; never widen it past 0600.
                file.set_permissions(fs::Permissions::from_mode(0o600))
                    .map_err(Error::io("set mode of", &path))?;
                Ok(path)
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(Error::AgentExists {
                name: name.to_owned(),
                path,
            }),
            Err(e) => Err(Error::io("create inbox", &path)(e)),
        }
    }
}

/// The agent name of an inbox file name, when it is one.
#[must_use]
pub fn inbox_name(file_name: &str) -> Option<&str> {
    file_name
        .strip_suffix(INBOX_SUFFIX)
        .filter(|name| is_agent_name(name) && !is_reserved_name(name))
}

/// A name no station may have: a built-in loop's, or `all` (every station).
fn is_reserved_name(name: &str) -> bool {
    name == "all" || doorbell_core::name::is_builtin_loop(name)
}

/// An entry of the bridge folder that looks like an inbox and that nothing reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stray {
    /// Named like an inbox, not a regular file (a symlink, FIFO, device): refused.
    NotRegular(PathBuf),
    /// Named like the inbox of a name no station may have (a built-in loop, `all`).
    Reserved(PathBuf),
    /// A file with bytes, named close to an inbox; `meant` is the inbox it was likely meant
    /// to be, when that name is a valid one.
    NearMiss {
        path: PathBuf,
        meant: Option<String>,
    },
}

impl Stray {
    pub fn path(&self) -> &Path {
        match self {
            Stray::NotRegular(path) | Stray::Reserved(path) | Stray::NearMiss { path, .. } => path,
        }
    }
}

/// The agent a file named `file_name` was likely meant to be the inbox of, when the name
/// comes close to an inbox's without being one: the suffix in another case, `.json` for
/// `.jsonl`, `_` for `-`, or an agent name in capitals or with other characters. A name with
/// more after the suffix (`web-inbox.jsonl.bak`) is a copy, not a near miss.
fn near_miss(file_name: &str) -> Option<String> {
    if inbox_name(file_name).is_some() || file_name.starts_with('.') {
        return None;
    }
    let lower = file_name.to_ascii_lowercase();
    let stem = [INBOX_SUFFIX, "-inbox.json", "_inbox.jsonl", "_inbox.json"]
        .iter()
        .find_map(|suffix| lower.strip_suffix(suffix))?;
    (!stem.is_empty()).then(|| stem.to_owned())
}

fn check_name(name: &str) -> Result<()> {
    if is_agent_name(name) {
        Ok(())
    } else {
        Err(Error::BadAgentName {
            name: name.to_owned(),
        })
    }
}

/// The error for a state folder that is something else. A symlink is most often the state
/// moved elsewhere: moved back, nothing is lost; an empty folder made in its place would
/// lose the read positions and the journal.
fn state_not_folder(path: PathBuf, meta: &fs::Metadata) -> Error {
    let keep = "an empty new folder in its place would lose the read positions and the journal";
    let (what, fix) = match fs::read_link(&path) {
        Ok(target) if meta.file_type().is_symlink() => (
            format!("a symlink to {}", target.display()),
            format!(
                "move the folder it points to back in its place (rm {0}; mv {1} {0}); {keep}",
                path.display(),
                target.display()
            ),
        ),
        _ => (
            "a file".to_owned(),
            format!("move it aside and put the judge's state folder back there; {keep}"),
        ),
    };
    Error::StateNotFolder { path, what, fix }
}

#[cfg(test)]
mod tests {
    use super::near_miss;

    #[test]
    fn a_name_close_to_an_inbox_is_a_near_miss_and_a_copy_or_an_inbox_is_not() {
        for (name, meant) in [
            ("Web-inbox.jsonl", "web"),
            ("web-inbox.json", "web"),
            ("web_inbox.jsonl", "web"),
            ("WEB-INBOX.JSONL", "web"),
            ("my agent-inbox.jsonl", "my agent"),
            ("design_inbox.json", "design"),
        ] {
            assert_eq!(near_miss(name).as_deref(), Some(meant), "{name}");
        }
        for name in [
            "web-inbox.jsonl",
            "web-inbox.jsonl.bak",
            ".web-inbox.jsonl.restore",
            "-inbox.jsonl",
            "notes.jsonl",
            "web.jsonl",
            "web-inbox.cursor",
            "STATUS.md",
        ] {
            assert_eq!(near_miss(name), None, "{name}");
        }
    }
}
