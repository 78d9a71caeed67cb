//! `deepspan ui`: a web server over one run's analysis.
//!
//! - `/api/…`: JSON over `RUN/analysis/` (requests, critical paths per
//!   thread and the queue before each request's span, concurrent
//!   requests, thread states and CPUs over a time window) with level of detail computed here ([`lod`]), so a browser
//!   draws at most about one interval per pixel whatever the run's size;
//! - `/api/requests/{id}/profile`: the request's flame graph from the CPU
//!   samples of `record --profile` ([`profile`]), loaded on first use;
//! - everything else: the single-page app from `ui/`, compiled into the
//!   binary ([`ASSETS`]); asset paths are looked up in that embedded
//!   table, never on disk.
//!
//! What a run's pages list is loaded at start ([`data::RunData`]); thread
//! states are read from the state history per window, and a request's
//! critical path when its page first asks for it. Every file is opened
//! through [`data::RunDir::file`], which refuses paths that resolve
//! outside the run folder. A merged run's `hosts.json` (several hosts
//! analysed as one, their threads numbered `host << 22 | tid`) is listed by
//! `/api/run` ([`data::load_hosts`]); a broken one is reported there, not
//! fatal.
//!
//! A folder of the live agent's snapshots (one run folder per snapshot,
//! each with a `snapshot.json`) is served by [`snapshots`]: a list, and
//! each snapshot's run API under `/s/<id>/`, loaded on first use.

pub mod api;
pub mod data;
pub mod lod;
pub mod profile;
pub mod snapshots;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use include_dir::{include_dir, Dir};

pub use api::AppState;
pub use data::{DataError, HostInfo, RunData, RunDir, RunSpans};
pub use profile::Profiles;
pub use snapshots::{is_snapshot_folder, SnapshotIndex};

/// The built UI (`ui/dist`); build.rs stops the build when it is missing.
pub static ASSETS: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../../ui/dist");

/// Loads the run at `run_dir` for serving.
pub fn load(run_dir: &Path) -> Result<Arc<AppState>, DataError> {
    let dir = RunDir::open(run_dir)?;
    let spans = RunSpans::load(&dir)?;
    let profiles = Profiles::open(&dir);
    let data = RunData::load(dir)?;
    Ok(Arc::new(AppState {
        data,
        spans,
        profiles,
    }))
}

/// The routes: the API and the embedded app.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/api/run", get(api::run))
        .route("/api/requests", get(api::requests))
        .route("/api/requests/{id}", get(api::request))
        .route("/api/requests/{id}/spans", get(api::request_spans))
        .route("/api/requests/{id}/timeline", get(api::request_timeline))
        .route("/api/requests/{id}/profile", get(api::request_profile))
        .route("/api/concurrent", get(api::concurrent))
        .route("/api/threads", get(api::threads))
        .route("/api/thread_states", get(api::thread_states))
        .route("/api/cpus", get(api::cpus))
        .route("/api", get(api::unknown_api))
        .route("/api/{*rest}", get(api::unknown_api))
        .fallback(get(asset))
        .with_state(state)
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "map" => "application/json",
        _ => "application/octet-stream",
    }
}

/// The embedded file for `uri`, or 404. Paths with `..`, backslashes,
/// percent-escapes or empty segments are refused before any lookup: the
/// asset names are plain.
async fn asset(uri: Uri) -> Response {
    let path = uri.path();
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "index.html" } else { rel };
    let plain = !rel.contains('%')
        && !rel.contains('\\')
        && !path.starts_with("//")
        && rel
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    match ASSETS.get_file(rel).filter(|_| plain) {
        Some(f) => {
            // Vite names assets by content hash: they never change.
            let cache = if rel.starts_with("assets/") {
                "public, max-age=31536000, immutable"
            } else {
                "no-cache"
            };
            (
                [
                    (header::CONTENT_TYPE, content_type(rel)),
                    (header::CACHE_CONTROL, cache),
                ],
                f.contents(),
            )
                .into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("not found: {path}\n"),
        )
            .into_response(),
    }
}

/// Serves `state` on `listener` until ctrl-C / SIGTERM.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AppState>) -> std::io::Result<()> {
    serve_router(listener, router(state)).await
}

/// Serves `app` (a run's [`router`] or a snapshot folder's
/// [`snapshots::router`]) on `listener` until ctrl-C / SIGTERM.
pub async fn serve_router(listener: tokio::net::TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Binds `addr` and serves the run until interrupted; `ready` is called
/// with the bound address (the port may have been 0).
pub fn run_blocking(
    state: Arc<AppState>,
    addr: SocketAddr,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    run_blocking_router(router(state), addr, ready)
}

/// Binds `addr` and serves `app` until interrupted; `ready` is called with
/// the bound address.
pub fn run_blocking_router(
    app: Router,
    addr: SocketAddr,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        ready(listener.local_addr()?);
        serve_router(listener, app).await
    })
}
