//! Integration tests of deepspan-sync, one binary: clock synchronisation
//! (the convex hull estimate, its bounds and the host graph) on synthetic
//! messages from known clock transforms and on hand-made message sets. No
//! root, tracefs or service: all run in `make check`.

mod bounds;
mod convex_hull;
