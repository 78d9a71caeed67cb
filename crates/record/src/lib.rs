//! Recording.
