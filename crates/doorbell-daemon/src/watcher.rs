//! The seam between the file system and the judge: one `notify` watch on the bridge folder,
//! whose events become hints. A hint only says "read this inbox to its end"; a lost event
//! costs nothing as long as a later hint or a sweep comes. An overflow (`Rescan`) or a
//! watcher error becomes a full sweep. Once the judge is seated (after the start-up
//! catch-up) an inbox's hint is judged on the watch's own thread, as it arrives. The daemon's own reads (open/close events) are
//! ignored, or it would wake itself forever.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::mpsc::Sender;

use doorbell_store::bridge::inbox_name;
use doorbell_store::journal::JOURNAL_FILE;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};

use crate::judging::Seat;
use crate::{Error, Input};

/// Start watching `dir`; the watch lasts as long as the returned watcher.
pub fn watch(dir: &Path, inputs: Sender<Input>, seat: Seat) -> Result<RecommendedWatcher, Error> {
    let folder = dir.to_path_buf();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // No event comes from the folder once it is gone: the judge stops (a folder
        // restored in its place is a daemon started afresh's to watch).
        if folder_gone(&event, &folder) {
            let _ = inputs.send(Input::Gone);
            return;
        }
        for input in hints(&event) {
            // An inbox is judged here and now when the judge is seated; anything else (and
            // an inbox while it is not) goes to the judging thread.
            if let Input::Inbox(name) = &input {
                if seat.judge_now(name, &inputs) {
                    continue;
                }
            }
            // The judge is gone when sending fails; nothing left to tell.
            let _ = inputs.send(input);
        }
    })
    .map_err(|source| Error::Watch {
        dir: dir.to_path_buf(),
        source,
    })?;
    // The bridge folder for inboxes, and `reports/` for daily reports to announce.
    let reports = dir.join(doorbell_store::reports::REPORTS_DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&reports)
        .map_err(|e| Error::Watch {
            dir: reports.clone(),
            source: notify::Error::io(e),
        })?;
    for folder in [dir, reports.as_path()] {
        watcher
            .watch(folder, RecursiveMode::NonRecursive)
            .map_err(|source| Error::Watch {
                dir: folder.to_path_buf(),
                source,
            })?;
    }
    Ok(watcher)
}

/// Whether `event` says the watched folder `dir`, or its state folder, was removed or moved
/// away. The folder's own removal is said only once the files open in it are closed (an
/// open file holds its folder), which the daemon's are not: the state folder's removal,
/// said to the folder around it, comes at once.
fn folder_gone(event: &notify::Result<notify::Event>, dir: &Path) -> bool {
    let Ok(event) = event else {
        return false;
    };
    matches!(
        event.kind,
        EventKind::Remove(_) | EventKind::Modify(notify::event::ModifyKind::Name(_))
    ) && event.paths.iter().any(|p| {
        p == dir
            || (p.parent() == Some(dir)
                && p.file_name() == Some(doorbell_store::bridge::STATE_DIR.as_ref()))
    })
}

/// What one file event says, for the daemon and for waiters alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Nothing,
    /// Inboxes changed (by name).
    Inbox(Vec<String>),
    /// The journal grew, or a new live journal took its place.
    Journal,
    /// A daily report was written.
    Reports,
    /// A reader moved its cursor (the board's unread counts change).
    Cursor,
    /// Events were lost, or the watcher failed: look at everything.
    Rescan,
}

/// Classify one event. Reads (the daemon's own, a waiter's) say nothing.
pub fn change(event: &notify::Result<notify::Event>) -> Change {
    let Ok(event) = event else {
        return Change::Rescan;
    };
    if event.need_rescan() {
        return Change::Rescan;
    }
    if matches!(event.kind, EventKind::Access(_)) {
        return Change::Nothing;
    }
    let mut inboxes = Vec::new();
    let mut journal = false;
    let mut reports = false;
    let mut cursor = false;
    for path in &event.paths {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let in_reports = path
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|p| p == doorbell_store::reports::REPORTS_DIR);
        if in_reports {
            reports |= Path::new(name).extension().is_some_and(|e| e == "md");
        } else if let Some(inbox) = inbox_name(name) {
            inboxes.push(inbox.to_owned());
        } else if name == JOURNAL_FILE
            && path
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|p| p == doorbell_store::bridge::STATE_DIR)
        {
            journal = true;
        } else {
            cursor |= name.ends_with(doorbell_store::bridge::CURSOR_SUFFIX);
        }
    }
    if !inboxes.is_empty() {
        Change::Inbox(inboxes)
    } else if journal {
        Change::Journal
    } else if reports {
        Change::Reports
    } else if cursor {
        Change::Cursor
    } else {
        Change::Nothing
    }
}

/// The hints one event gives the judge.
pub fn hints(event: &notify::Result<notify::Event>) -> Vec<Input> {
    match change(event) {
        Change::Rescan => {
            if let Err(error) = event {
                tracing::warn!(%error, "file watcher error: sweeping every inbox");
            } else {
                tracing::warn!("file events were lost (inotify overflow): sweeping every inbox");
            }
            vec![Input::Rescan]
        }
        Change::Inbox(names) => names.into_iter().map(Input::Inbox).collect(),
        Change::Reports => vec![Input::Reports],
        Change::Cursor => vec![Input::Read],
        Change::Nothing | Change::Journal => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, Flag, ModifyKind};
    use notify::Event;

    fn names(inputs: &[Input]) -> Vec<String> {
        inputs
            .iter()
            .map(|i| match i {
                Input::Inbox(name) => name.clone(),
                Input::Rescan => "<rescan>".into(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn inbox_events_become_hints_and_others_are_ignored() {
        let event = Event::new(EventKind::Modify(ModifyKind::Any))
            .add_path("/b/web-inbox.jsonl".into())
            .add_path("/b/web-inbox.cursor".into())
            .add_path("/b/notes.txt".into());
        assert_eq!(names(&hints(&Ok(event))), ["web"]);
        let read = Event::new(EventKind::Modify(ModifyKind::Name(
            notify::event::RenameMode::To,
        )))
        .add_path("/b/web-inbox.cursor".into());
        assert_eq!(names(&hints(&Ok(read))), ["Read"]);
        let create =
            Event::new(EventKind::Create(CreateKind::File)).add_path("/b/new-inbox.jsonl".into());
        assert_eq!(names(&hints(&Ok(create))), ["new"]);
    }

    #[test]
    fn the_daemons_own_reads_wake_nobody() {
        let open =
            Event::new(EventKind::Access(AccessKind::Any)).add_path("/b/web-inbox.jsonl".into());
        assert!(hints(&Ok(open)).is_empty());
    }

    #[test]
    fn the_folder_itself_removed_or_moved_is_gone_and_nothing_else_is() {
        use notify::event::{RemoveKind, RenameMode};
        let dir = Path::new("/b");
        let gone = |kind, path: &str| folder_gone(&Ok(Event::new(kind).add_path(path.into())), dir);
        assert!(gone(EventKind::Remove(RemoveKind::Folder), "/b"));
        assert!(gone(
            EventKind::Modify(ModifyKind::Name(RenameMode::From)),
            "/b"
        ));
        assert!(!gone(
            EventKind::Remove(RemoveKind::File),
            "/b/web-inbox.jsonl"
        ));
        assert!(!gone(EventKind::Remove(RemoveKind::Folder), "/b/reports"));
        assert!(!gone(EventKind::Modify(ModifyKind::Any), "/b"));
    }

    #[test]
    fn overflow_and_errors_mean_a_full_sweep() {
        let overflow = Event::new(EventKind::Other).set_flag(Flag::Rescan);
        assert_eq!(names(&hints(&Ok(overflow))), ["<rescan>"]);
        assert_eq!(
            names(&hints(&Err(notify::Error::generic("boom")))),
            ["<rescan>"]
        );
    }
}
