use std::path::PathBuf;

/// Everything that can go wrong reading or writing spans. Messages say what
/// failed, where (file, record, span index or JSON path) and why.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The input is not valid for its format. `location` is a JSON path
    /// (`resourceSpans[0].scopeSpans[1].spans[3].spanId`), a span index or a
    /// record number.
    #[error("{source_name}: {format}: at {location}: {reason}")]
    Invalid {
        source_name: String,
        format: &'static str,
        location: String,
        reason: String,
    },
    /// The format of a file could not be recognised.
    #[error("{source_name}: not a span file deepspan reads: {reason}")]
    UnknownFormat { source_name: String, reason: String },
}

impl Error {
    pub(crate) fn invalid(
        source_name: &str,
        format: &'static str,
        location: impl Into<String>,
        reason: impl Into<String>,
    ) -> Error {
        Error::Invalid {
            source_name: source_name.to_string(),
            format,
            location: location.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(
        path: impl Into<PathBuf>,
        action: &'static str,
        source: std::io::Error,
    ) -> Error {
        Error::Io {
            path: path.into(),
            action,
            source,
        }
    }
}

/// Runs a serde deserialisation and turns its error into [`Error::Invalid`]
/// carrying the JSON path of the offending value.
pub(crate) fn from_json<'de, T: serde::Deserialize<'de>>(
    bytes: &'de [u8],
    source_name: &str,
    format: &'static str,
) -> Result<T, Error> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let location = if path == "." || path.is_empty() {
            format!("line {} column {}", inner.line(), inner.column())
        } else {
            format!("{path} (line {} column {})", inner.line(), inner.column())
        };
        Error::invalid(source_name, format, location, inner.to_string())
    })
}
