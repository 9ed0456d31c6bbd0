//! `state_dir`: the ACME account's credentials and the certificate obtained, as private files
//! (the directory 0700, the files 0600) written whole and renamed into place.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::TlsFiles;

const ACCOUNT: &str = "account.json";
const CERTIFICATE: &str = "certificate.pem";
const KEY: &str = "certificate.key";

/// The files of one `state_dir`.
#[derive(Debug, Clone)]
pub(crate) struct StateDir(PathBuf);

impl StateDir {
    /// The directory, created private when missing (and made private when it is not).
    pub(crate) fn open(path: &Path) -> io::Result<StateDir> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))?;
        Ok(StateDir(path.to_owned()))
    }

    /// The account's credentials, when an account was made before.
    pub(crate) fn account(&self) -> io::Result<Option<String>> {
        read_if_there(&self.0.join(ACCOUNT))
    }

    pub(crate) fn save_account(&self, credentials: &str) -> io::Result<()> {
        write_private(&self.0.join(ACCOUNT), credentials.as_bytes())
    }

    /// The certificate's files (which may not exist yet).
    pub(crate) fn certificate_files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.0.join(CERTIFICATE),
            key: self.0.join(KEY),
        }
    }

    /// Keeps a certificate chain and its key; the key first, so that a crash between the two
    /// leaves the old chain with a key that is not its own, which reading refuses (and orders
    /// again), never a chain served with a stale key.
    pub(crate) fn save_certificate(&self, chain_pem: &str, key_pem: &str) -> io::Result<()> {
        let files = self.certificate_files();
        write_private(&files.key, key_pem.as_bytes())?;
        write_private(&files.cert, chain_pem.as_bytes())
    }
}

fn read_if_there(path: &Path) -> io::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Writes `bytes` to a new file readable by the owner only, then renames it over `path`.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".new");
    let temporary = PathBuf::from(temporary);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_and_its_files_are_the_owners_alone() {
        let parent = tempfile::tempdir().unwrap();
        let path = parent.path().join("acme");
        let dir = StateDir::open(&path).unwrap();
        assert_eq!(dir.account().unwrap(), None);
        dir.save_account("{\"id\":1}").unwrap();
        dir.save_certificate("CHAIN", "KEY").unwrap();
        assert_eq!(dir.account().unwrap().as_deref(), Some("{\"id\":1}"));
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o700);
        for file in [ACCOUNT, CERTIFICATE, KEY] {
            assert_eq!(mode(&path.join(file)), 0o600, "{file}");
        }
        // A directory made open by someone else is closed again.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        StateDir::open(&path).unwrap();
        assert_eq!(mode(&path), 0o700);
    }
}
