//! trace.dat reading and writing.
