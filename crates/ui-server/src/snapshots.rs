//! `deepspan ui DIR` over a folder of the live agent's snapshots: each
//! `DIR/<id>/` is an ordinary run folder (manifest, kernel trace, spans,
//! analysis) with a `snapshot.json` saying when it was taken, over which
//! window, what triggered it and whether its analysis succeeded.
//!
//! - `/api/run`: `{"kind": "snapshots", …}` (the app then shows the list);
//! - `/api/snapshots`: every snapshot, newest first, read again on each call
//!   (the agent adds and removes snapshots while the UI runs);
//! - `/s/<id>/api/…`: the run API of that snapshot, loaded on first use
//!   (a folder may hold hundreds) and kept for the [`LOADED`] most recently
//!   used;
//! - `/s/<id>/`: the app, which sends its API calls under that prefix.
//!
//! An id is a folder name of DIR's own ([`valid_id`]: letters, digits,
//! `.`, `_`, `-`, not starting with `.`); its folder is canonicalized and
//! must be a direct child of DIR, so no id reaches outside DIR. Bad ids are
//! 400, unknown or unanalysed ones 404, with a JSON `{"error"}`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{json, Value};
use tower::ServiceExt;

use deepspan_run::{Run, SnapshotInfo, SnapshotStatus, SnapshotTrigger};

use crate::api::ApiError;
use crate::data::DataError;

/// Snapshots whose data stay loaded (least recently used dropped first).
pub const LOADED: usize = 8;

/// Longest id accepted.
const MAX_ID: usize = 128;

/// Whether `dir` is a folder of snapshots rather than a run: no
/// `manifest.json` or `analysis/` of its own, and at least one sub-folder
/// holding a `snapshot.json` or a `manifest.json`.
pub fn is_snapshot_folder(dir: &Path) -> bool {
    if Run::new(dir).manifest().exists() || Run::new(dir).analysis_dir().exists() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|e| {
        let p = e.path();
        p.is_dir() && (Run::new(&p).snapshot().is_file() || Run::new(&p).manifest().is_file())
    })
}

/// Whether `id` can name a snapshot folder: a plain file name.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A snapshot's data, loaded once: its run router, or why it cannot be
/// served.
type Loaded = Arc<OnceLock<Result<Router, ApiErrorText>>>;

/// A clonable [`ApiError`].
#[derive(Clone, Debug)]
struct ApiErrorText {
    status: StatusCode,
    message: String,
}

impl From<ApiErrorText> for ApiError {
    fn from(e: ApiErrorText) -> ApiError {
        ApiError {
            status: e.status,
            message: e.message,
        }
    }
}

/// The snapshot folder being served.
pub struct SnapshotIndex {
    root: PathBuf,
    /// Most recently used last.
    loaded: Mutex<Vec<(String, Loaded)>>,
}

impl SnapshotIndex {
    /// Opens `dir` (canonicalized once).
    pub fn open(dir: &Path) -> Result<SnapshotIndex, DataError> {
        let root = dir.canonicalize().map_err(|e| {
            DataError::Missing(format!(
                "cannot open snapshot folder {}: {e}",
                dir.display()
            ))
        })?;
        if !root.is_dir() {
            return Err(DataError::Missing(format!(
                "{} is not a folder",
                dir.display()
            )));
        }
        Ok(SnapshotIndex {
            root,
            loaded: Mutex::new(Vec::new()),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder of snapshot `id`: a direct child of the root after
    /// following symlinks.
    fn folder(&self, id: &str) -> Result<PathBuf, ApiError> {
        if !valid_id(id) {
            return Err(ApiError::bad(format!(
                "{id:?} is not a snapshot id (letters, digits, '.', '_', '-')"
            )));
        }
        let unknown = || ApiError::not_found(format!("no snapshot {id:?}"));
        let resolved = self.root.join(id).canonicalize().map_err(|_| unknown())?;
        if resolved.parent() != Some(self.root.as_path()) || !resolved.is_dir() {
            return Err(unknown());
        }
        Ok(resolved)
    }

    /// Every snapshot, newest first (by `taken_unix_ns`, then id).
    pub fn list(&self) -> Vec<SnapshotRow> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut list: Vec<SnapshotRow> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let id = e.file_name().to_str()?.to_string();
                let folder = self.folder(&id).ok()?;
                summary(&id, &folder)
            })
            .collect();
        list.sort_by(|a, b| (b.taken_unix_ns, &b.id).cmp(&(a.taken_unix_ns, &a.id)));
        list
    }

    /// The run router of snapshot `id`, loading it on first use.
    fn run_router(&self, id: &str) -> Result<Router, ApiError> {
        let folder = self.folder(id)?;
        let cell = {
            let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
            let cell = match loaded.iter().position(|(k, _)| k == id) {
                Some(i) => loaded.remove(i).1,
                None => Arc::new(OnceLock::new()),
            };
            loaded.push((id.to_string(), cell.clone()));
            if loaded.len() > LOADED {
                loaded.remove(0);
            }
            cell
        };
        // Other requests for the same snapshot wait here for this load.
        cell.get_or_init(|| load_snapshot(id, &folder))
            .clone()
            .map_err(ApiError::from)
    }
}

/// A snapshot's run data as a router, or a 404 saying why there is none.
fn load_snapshot(id: &str, folder: &Path) -> Result<Router, ApiErrorText> {
    match crate::load(folder) {
        Ok(state) => Ok(crate::router(state)),
        Err(e) => {
            let failed = SnapshotInfo::load(folder)
                .ok()
                .filter(|s| s.status == SnapshotStatus::Failed)
                .map(|s| s.error.unwrap_or_default());
            let message = match failed {
                Some(error) => format!("snapshot {id} failed to be analysed: {error}"),
                None => format!("snapshot {id} cannot be served: {e}"),
            };
            Err(ApiErrorText {
                status: StatusCode::NOT_FOUND,
                message,
            })
        }
    }
}

/// One line of the list (`/api/snapshots`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotRow {
    /// The folder's name.
    pub id: String,
    /// The id in `snapshot.json`, when it is not the folder's (a folder
    /// renamed by hand).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub named_id: Option<String>,
    pub taken_unix_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_mono_ns: Option<[u64; 2]>,
    pub window_ns: Option<u64>,
    /// `analysed` or `failed` as the agent wrote it; `unreadable` when
    /// `snapshot.json` is not an agent snapshot's; `analysed` or `not
    /// analysed` for a plain run folder among the snapshots.
    pub status: &'static str,
    pub error: Option<String>,
    /// The folder holds an analysis the UI can open.
    pub analysed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spans_left_out: Option<u64>,
    pub triggers: Option<Vec<SnapshotTrigger>>,
}

/// One line of the list: `snapshot.json` as the agent wrote it, with the
/// folder's id, the window's length and whether an analysis is there.
/// Folders with neither `snapshot.json` nor `manifest.json` are not
/// snapshots.
fn summary(id: &str, folder: &Path) -> Option<SnapshotRow> {
    let run = Run::new(folder);
    let has_snapshot = run.snapshot().is_file();
    if !has_snapshot && !run.manifest().is_file() {
        return None;
    }
    let analysed = run.requests_json().is_file();
    let row = |status, error| SnapshotRow {
        id: id.to_string(),
        named_id: None,
        taken_unix_ns: None,
        window_mono_ns: None,
        window_ns: None,
        status,
        error,
        analysed,
        spans_left_out: None,
        triggers: None,
    };
    Some(match SnapshotInfo::load(folder) {
        Ok(info) => SnapshotRow {
            named_id: (info.id != id).then(|| info.id.clone()),
            taken_unix_ns: Some(info.taken_unix_ns),
            window_mono_ns: Some(info.window_mono_ns),
            window_ns: Some(info.window_ns()),
            spans_left_out: Some(info.spans_left_out),
            triggers: Some(info.triggers),
            ..row(info.status.as_str(), info.error)
        },
        Err(e) if has_snapshot => row("unreadable", Some(e.reason)),
        // A plain run folder among the snapshots.
        Err(_) => row(if analysed { "analysed" } else { "not analysed" }, None),
    })
}

type Shared = Arc<SnapshotIndex>;

/// The routes over a snapshot folder: the list, each snapshot's API under
/// `/s/<id>/api/`, the app everywhere else.
pub fn router(index: SnapshotIndex) -> Router {
    Router::new()
        .route("/api/run", get(folder_info))
        .route("/api/snapshots", get(snapshots))
        .route("/api", get(crate::api::unknown_api))
        .route("/api/{*rest}", get(crate::api::unknown_api))
        .route("/s/{id}/api", get(snapshot_api_root))
        .route("/s/{id}/api/{*rest}", get(snapshot_api))
        .route("/s/{id}", get(snapshot_page))
        .route("/s/{id}/", get(snapshot_page))
        .fallback(get(crate::asset))
        .with_state(Arc::new(index))
}

async fn folder_info(State(index): State<Shared>) -> Json<Value> {
    let name = index
        .root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Json(json!({
        "kind": "snapshots",
        "run": name,
        "path": index.root.display().to_string(),
    }))
}

async fn snapshots(State(index): State<Shared>) -> Result<Json<Value>, ApiError> {
    let list = tokio::task::spawn_blocking(move || index.list())
        .await
        .map_err(|_| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "listing the snapshots failed".to_string(),
        })?;
    Ok(Json(json!({ "snapshots": list })))
}

/// The app's page for a snapshot: the same `index.html`, which reads its
/// prefix from the address. The id is checked first, so a bad one is an
/// error page, not an app that fails later.
async fn snapshot_page(State(index): State<Shared>, UrlPath(id): UrlPath<String>) -> Response {
    if let Err(e) = index.folder(&id) {
        return e.into_response();
    }
    crate::asset(Uri::from_static("/index.html")).await
}

async fn snapshot_api_root(UrlPath(id): UrlPath<String>) -> ApiError {
    ApiError::not_found(format!("no such endpoint: /s/{id}/api"))
}

/// `/s/<id>/api/…`: the snapshot's own run API (loaded on a blocking
/// thread the first time), with the prefix taken off the path.
async fn snapshot_api(
    State(index): State<Shared>,
    UrlPath((id, _)): UrlPath<(String, String)>,
    request: Request,
) -> Response {
    let loading = {
        let id = id.clone();
        tokio::task::spawn_blocking(move || index.run_router(&id))
    };
    let router = match loading.await {
        Ok(Ok(router)) => router,
        Ok(Err(e)) => return e.into_response(),
        Err(_) => {
            return ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: format!("loading snapshot {id} failed"),
            }
            .into_response()
        }
    };
    // The rest of the path as sent (still percent-encoded), so the
    // snapshot's router sees what a run's router would.
    let raw = request.uri().path();
    let rest = raw
        .strip_prefix("/s/")
        .and_then(|r| r.find('/').map(|i| &r[i..]))
        .unwrap_or("/api");
    let path_and_query = match request.uri().query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    };
    let Ok(uri) = path_and_query.parse::<Uri>() else {
        return ApiError::bad("the address is not valid").into_response();
    };
    let (mut parts, body) = request.into_parts();
    parts.uri = uri;
    // The outer route's path parameters live in the extensions; the
    // snapshot's router must see only its own.
    parts.extensions = Default::default();
    match router.oneshot(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepspan_run::layout::SNAPSHOT;

    #[test]
    fn ids_are_plain_names() {
        assert!(valid_id("20261125T071500.123Z-0007"));
        assert!(valid_id("run_1"));
        for bad in [
            "", ".", "..", ".hidden", "a/b", "a\\b", "%2e%2e", "a b", "é",
        ] {
            assert!(!valid_id(bad), "{bad:?}");
        }
        assert!(!valid_id(&"a".repeat(MAX_ID + 1)));
    }

    #[test]
    fn a_folder_of_snapshots_is_told_from_a_run() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_snapshot_folder(dir.path()));
        let snap = dir.path().join("s1");
        std::fs::create_dir(&snap).unwrap();
        std::fs::write(snap.join(SNAPSHOT), "{}").unwrap();
        assert!(is_snapshot_folder(dir.path()));
        std::fs::write(Run::new(dir.path()).manifest(), "{}").unwrap();
        assert!(!is_snapshot_folder(dir.path()));
    }

    #[test]
    fn the_list_is_newest_first_and_says_what_is_broken() {
        let dir = tempfile::tempdir().unwrap();
        let write = |id: &str, text: &str| {
            let d = dir.path().join(id);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join(SNAPSHOT), text).unwrap();
        };
        write(
            "old",
            r#"{"id": "old", "taken_unix_ns": 100, "window_mono_ns": [10, 40], "status": "analysed", "triggers": []}"#,
        );
        write(
            "new",
            r#"{"id": "new", "taken_unix_ns": 200, "window_mono_ns": [50, 60], "status": "failed", "error": "boom"}"#,
        );
        write("broken", "{not json");
        std::fs::create_dir(dir.path().join("not-a-snapshot")).unwrap();
        let index = SnapshotIndex::open(dir.path()).unwrap();
        let list = index.list();
        let ids: Vec<&str> = list.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["new", "old", "broken"]);
        assert_eq!(list[0].window_ns, Some(10));
        assert_eq!(list[0].error.as_deref(), Some("boom"));
        assert_eq!(list[1].window_ns, Some(30));
        assert!(!list[1].analysed);
        assert_eq!(list[2].status, "unreadable");
        let why = list[2].error.as_deref().unwrap();
        assert!(
            why.starts_with("not an agent snapshot's description"),
            "{why}"
        );
        // A failed snapshot is a 404 that says why.
        let e = index.run_router("new").unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert!(e.message.contains("boom"), "{}", e.message);
        assert_eq!(
            index.run_router("..").unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            index.run_router("nope").unwrap_err().status,
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn a_symlink_out_of_the_folder_is_no_snapshot() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join(SNAPSHOT), "{}").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("escape")).unwrap();
        let index = SnapshotIndex::open(dir.path()).unwrap();
        assert!(index.list().is_empty());
        assert_eq!(
            index.run_router("escape").unwrap_err().status,
            StatusCode::NOT_FOUND
        );
    }
}
