//! The OTLP receiver's integration tests, one binary: real gRPC (tonic)
//! and OTLP/HTTP clients against a receiver on loopback, each test reading
//! the run back. Nothing here needs root, tracefs or an external service.

mod receiver;
