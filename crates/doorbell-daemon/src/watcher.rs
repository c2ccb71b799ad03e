//! The seam between the file system and the judge: one `notify` watch on the bridge folder,
//! whose events become hints. A hint only says "read this inbox to its end"; a lost event
//! costs nothing as long as a later hint or a sweep comes. An overflow (`Rescan`) or a
//! watcher error becomes a full sweep. The daemon's own reads (open/close events) are
//! ignored, or it would wake itself forever.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::mpsc::Sender;

use doorbell_store::bridge::inbox_name;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};

use crate::{Error, Input};

/// Start watching `dir`; the watch lasts as long as the returned watcher.
pub fn watch(dir: &Path, inputs: Sender<Input>) -> Result<RecommendedWatcher, Error> {
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        for input in hints(event) {
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

/// The hints one event gives.
pub fn hints(event: notify::Result<notify::Event>) -> Vec<Input> {
    let event = match event {
        Ok(event) => event,
        Err(error) => {
            tracing::warn!(%error, "file watcher error: sweeping every inbox");
            return vec![Input::Rescan];
        }
    };
    if event.need_rescan() {
        tracing::warn!("file events were lost (inotify overflow): sweeping every inbox");
        return vec![Input::Rescan];
    }
    if matches!(event.kind, EventKind::Access(_)) {
        return Vec::new();
    }
    event
        .paths
        .iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let in_reports = path
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|p| p == doorbell_store::reports::REPORTS_DIR);
            if in_reports {
                let report = Path::new(name).extension().is_some_and(|e| e == "md");
                return report.then_some(Input::Reports);
            }
            inbox_name(name).map(|name| Input::Inbox(name.to_owned()))
        })
        .collect()
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
        assert_eq!(names(&hints(Ok(event))), ["web"]);
        let create =
            Event::new(EventKind::Create(CreateKind::File)).add_path("/b/new-inbox.jsonl".into());
        assert_eq!(names(&hints(Ok(create))), ["new"]);
    }

    #[test]
    fn the_daemons_own_reads_wake_nobody() {
        let open =
            Event::new(EventKind::Access(AccessKind::Any)).add_path("/b/web-inbox.jsonl".into());
        assert!(hints(Ok(open)).is_empty());
    }

    #[test]
    fn overflow_and_errors_mean_a_full_sweep() {
        let overflow = Event::new(EventKind::Other).set_flag(Flag::Rescan);
        assert_eq!(names(&hints(Ok(overflow))), ["<rescan>"]);
        assert_eq!(
            names(&hints(Err(notify::Error::generic("boom")))),
            ["<rescan>"]
        );
    }
}
