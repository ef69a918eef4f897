//! Production disk: the agent's redb database file in its data dir. Mirrored by
//! `drover-io-sim`'s `disk.rs`, whose backend loses unsynced writes on a simulated crash.

use std::path::{Path, PathBuf};

use drover_io_real::client::{CLIENT_STATE_FILE, ClientStore, ClientStoreError};

pub const DATABASE_FILE: &str = "drover.redb";

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot create data dir {path}: {source}")]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("data dir {path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("cannot open database {path}: {reason}")]
    Open { path: PathBuf, reason: String },
}

/// Opens (creating if needed) the agent database under `data_dir`. Errors name the path and
/// the cause; an existing database that cannot be read is never overwritten.
pub fn open_database(data_dir: &Path) -> Result<redb::Database, DiskError> {
    if data_dir.exists() && !data_dir.is_dir() {
        return Err(DiskError::NotADirectory {
            path: data_dir.to_path_buf(),
        });
    }
    std::fs::create_dir_all(data_dir).map_err(|source| DiskError::CreateDir {
        path: data_dir.to_path_buf(),
        source,
    })?;
    let path = data_dir.join(DATABASE_FILE);
    let db = redb::Database::create(&path).map_err(|error| DiskError::Open {
        path: path.clone(),
        reason: error.to_string(),
    })?;
    owner_only(&path).map_err(|error| DiskError::Open {
        path: path.clone(),
        reason: format!("cannot make it readable by its owner only: {error}"),
    })?;
    Ok(db)
}

/// Opens (or creates) the client's records at `<state_dir>/client.redb`, readable by its owner
/// only.
pub fn open_client_store(state_dir: &Path) -> Result<ClientStore, ClientStoreError> {
    let open = |reason: String| ClientStoreError::Open {
        path: state_dir.join(CLIENT_STATE_FILE).display().to_string(),
        reason,
    };
    std::fs::create_dir_all(state_dir).map_err(|error| open(error.to_string()))?;
    let file = state_dir.join(CLIENT_STATE_FILE);
    let db = redb::Database::create(&file).map_err(|error| open(error.to_string()))?;
    owner_only(&file).map_err(|error| open(format!("cannot make it readable by its owner only: {error}")))?;
    Ok(ClientStore::new(db))
}

/// Makes `file` readable and writable by its owner only: the agent's databases hold tokens'
/// secret IDs and jobs in plain text (variables and volume secrets are sealed; README, Security).
pub fn owner_only(file: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        drop(open_database(dir.path()).unwrap());
        let mode = std::fs::metadata(dir.path().join(DATABASE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn errors_name_the_path_and_the_cause() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        let error = open_database(&file).unwrap_err().to_string();
        assert_eq!(error, format!("data dir {} is not a directory", file.display()));

        let nested = file.join("below");
        let error = open_database(&nested).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("cannot create data dir {}: ", nested.display())),
            "{error}"
        );

        let garbage = dir.path().join("garbage");
        std::fs::create_dir(&garbage).unwrap();
        std::fs::write(garbage.join(DATABASE_FILE), vec![7u8; 4096]).unwrap();
        let error = open_database(&garbage).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!(
                "cannot open database {}: ",
                garbage.join(DATABASE_FILE).display()
            )),
            "{error}"
        );
        assert_eq!(
            std::fs::read(garbage.join(DATABASE_FILE)).unwrap(),
            vec![7u8; 4096],
            "nothing overwritten"
        );
    }
}
