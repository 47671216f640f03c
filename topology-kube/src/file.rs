//! The cluster from a YAML file, reloaded when it changes. The file's directory is watched
//! (inotify), so editors that replace the file and ConfigMap mounts that swap a symlink are seen;
//! any change in the directory re-reads the file and sends it only if its content changed. An
//! invalid edit keeps the last good state programmed and marks the source stale until fixed.

use std::{
    path::{Path, PathBuf},
    sync::mpsc,
    thread,
    time::Duration,
};

use notify::{RecursiveMode, Watcher as _};
use tokio_util::sync::CancellationToken;
use topology_model::yaml::{self, FileError};

use super::{EventSender, SourceEvent};

/// Name of this source in readiness reasons.
const SOURCE: &str = "cluster file";
/// Edits often come as several events (truncate, write, rename): wait this long for quiet.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// The file source could not start.
#[derive(Debug, thiserror::Error)]
pub enum FileSourceError {
    /// The file is unreadable or malformed.
    #[error(transparent)]
    File(#[from] FileError),
    /// Its directory cannot be watched.
    #[error("watching {path} for changes: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The notify error.
        source: notify::Error,
    },
}

/// A running file source; dropping it stops the watch.
pub struct FileSource {
    _watcher: notify::RecommendedWatcher,
    thread: Option<thread::JoinHandle<()>>,
}

impl FileSource {
    /// Loads `path` (an error here is fatal: there is no last good state yet), sends it, and
    /// watches for changes until `shutdown`.
    pub fn start(path: &Path, events: EventSender, shutdown: CancellationToken) -> Result<Self, FileSourceError> {
        let text = read(path)?;
        let state = yaml::parse(&text, &path.display().to_string())?;
        events.send(SourceEvent::Snapshot(Box::new(state)));

        let (changed_tx, changed_rx) = mpsc::channel::<()>();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok() {
                // The receiver only stops at shutdown, when nothing needs the signal.
                let _ = changed_tx.send(());
            }
        })
        .map_err(|source| FileSourceError::Watch { path: path.to_path_buf(), source })?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|source| FileSourceError::Watch { path: dir.to_path_buf(), source })?;

        let path = path.to_path_buf();
        let thread = thread::Builder::new()
            .name("cluster-file".into())
            .spawn(move || reload_loop(&path, text, &changed_rx, &events, &shutdown))
            .expect("spawning the file watch thread");
        Ok(Self { _watcher: watcher, thread: Some(thread) })
    }
}

impl Drop for FileSource {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            // The loop exits within its poll interval once shutdown is cancelled.
            let _ = thread.join();
        }
    }
}

fn reload_loop(
    path: &Path,
    mut last: String,
    changed: &mpsc::Receiver<()>,
    events: &EventSender,
    shutdown: &CancellationToken,
) {
    let mut stale = false;
    while !shutdown.is_cancelled() {
        match changed.recv_timeout(Duration::from_millis(200)) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        thread::sleep(DEBOUNCE);
        while changed.try_recv().is_ok() {}
        let outcome = read(path).and_then(|text| {
            if text == last && !stale {
                return Ok(None);
            }
            let state = yaml::parse(&text, &path.display().to_string())?;
            Ok(Some((text, state)))
        });
        let sent = match outcome {
            Ok(None) => true,
            Ok(Some((text, state))) => {
                last = text;
                tracing::info!(file = %path.display(), "cluster file reloaded");
                let sent = events.send(SourceEvent::Snapshot(Box::new(state)));
                if std::mem::take(&mut stale) {
                    events.send(SourceEvent::Fresh { source: SOURCE.into() });
                }
                sent
            }
            Err(error) => {
                tracing::warn!(file = %path.display(), %error, "cluster file not reloaded; keeping the last good state");
                stale = true;
                events.send(SourceEvent::Stale { source: SOURCE.into(), reason: error.to_string(), transient: false })
            }
        };
        if !sent {
            return;
        }
    }
}

fn read(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(|source| FileError::Read { path: path.to_path_buf(), source })
}
