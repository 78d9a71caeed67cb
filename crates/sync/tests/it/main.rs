//! Integration tests of deepspan-sync, one binary: clock synchronisation
//! (the convex hull estimate and the host graph) on synthetic messages from
//! known clock transforms. No root, tracefs or service: all run in
//! `make check`.

mod convex_hull;
