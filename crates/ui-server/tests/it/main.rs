//! The UI server's integration tests, one binary: `GET /api/run` on runs
//! built in temporary directories, served in-process. Nothing here needs
//! root, tracefs or an external service.

mod hosts;
