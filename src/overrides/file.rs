//! `[overrides] file`: where the memory store keeps overrides across restarts. Written whole
//! on every change, to a temporary file renamed over the old one, so that a crash leaves the
//! old file or the new one and never half of either.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Override;

/// What the file holds.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Kept {
    /// The secret request values are hashed with when the policy sets none (`[store]
    /// hash_key`): an override of a hashed key means nothing under another secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) hash_secret: Option<String>,
    /// A digest of the hashing key the overrides' keys were hashed with, to tell whether the
    /// running gateway hashes the same way.
    #[serde(default)]
    pub(super) hashed_with: String,
    #[serde(default)]
    pub(super) overrides: Vec<Override>,
}

/// Why the overrides file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read the overrides file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("the overrides file {path} is malformed: {why} (fix it, or move it away to start without its overrides)")]
    Malformed { path: PathBuf, why: String },
    #[error("cannot write the overrides file {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// The file's content; `None` when there is no file yet.
pub(super) fn read(path: &Path) -> Result<Option<Kept>, FileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(FileError::Read {
                path: path.to_owned(),
                error,
            })
        }
    };
    let malformed = |why: String| FileError::Malformed {
        path: path.to_owned(),
        why,
    };
    let mut kept: Kept =
        serde_json::from_str(&text).map_err(|error| malformed(error.to_string()))?;
    for entry in &mut kept.overrides {
        entry.parts = crate::limit::parse_parts(&entry.key).ok_or_else(|| {
            malformed(format!(
                "the key {:?} of an override of {} is not a key as tollgate spells them",
                entry.key, entry.limit
            ))
        })?;
    }
    Ok(Some(kept))
}

/// Replaces the file with `kept`: written beside it, flushed to disk, then renamed over it.
pub(super) fn write(path: &Path, kept: &Kept) -> Result<(), FileError> {
    let failed = |error: std::io::Error| FileError::Write {
        path: path.to_owned(),
        error,
    };
    let mut text = serde_json::to_string_pretty(kept).map_err(|error| failed(error.into()))?;
    text.push('\n');
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        // It may hold the secret keys are hashed with.
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(&temporary).map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(failed)?;
    Ok(())
}
