use std::path::{Path, PathBuf};

/// What went wrong, and with which file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: Parquet error while {what}: {source}", path.display())]
    Parquet {
        path: PathBuf,
        what: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// A writer was given values that do not fit its columns (a bug), or a
    /// table read back lacks a column it should have.
    #[error("{}: {what}", path.display())]
    Schema { path: PathBuf, what: String },
    /// Not JSON, or not of the expected shape: `at` is where (a JSON
    /// path, `requests[3].diagnosis.cause`), when known.
    #[error("{}: invalid JSON{}: {source}", path.display(), at.as_ref().map_or(String::new(), |at| format!(" at {at}")))]
    Json {
        path: PathBuf,
        at: Option<String>,
        #[source]
        source: serde_json::Error,
    },
    /// The analysis (or the request asked for) is not there.
    #[error("{what}")]
    NotFound { what: String },
}

impl Error {
    pub(crate) fn io(path: &Path, what: &str, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            what: what.to_string(),
            source,
        }
    }

    pub(crate) fn parquet(path: &Path, what: &str, source: parquet::errors::ParquetError) -> Error {
        Error::Parquet {
            path: path.to_path_buf(),
            what: what.to_string(),
            source,
        }
    }
}
