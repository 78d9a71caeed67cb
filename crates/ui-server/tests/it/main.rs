//! The UI server's integration tests, one binary: the API (`/api/run`, a
//! request's queue) on runs built in temporary directories, served
//! in-process. Nothing here needs root, tracefs or an external service.

mod hosts;
mod queue;

use std::path::Path;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

/// `GET uri` on the run at `run`: its JSON, which must come with 200 OK.
pub fn get(run: &Path, uri: &str) -> Value {
    let (status, body) = get_status(run, uri);
    assert_eq!(status, StatusCode::OK, "{uri}: {body}");
    body
}

/// `GET uri` on the run at `run`: the status and the JSON body.
pub fn get_status(run: &Path, uri: &str) -> (StatusCode, Value) {
    let state = deepspan_ui_server::load(run).expect("the run loads");
    let app = deepspan_ui_server::router(state);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let res = app
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    })
}
