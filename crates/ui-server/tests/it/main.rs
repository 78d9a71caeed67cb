//! The UI server's integration tests, one binary: the API (`/api/run`, a
//! request's queue) on runs built in temporary directories, served
//! in-process. Nothing here needs root, tracefs or an external service.

mod hosts;
mod queue;
