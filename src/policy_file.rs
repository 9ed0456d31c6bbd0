//! Reading a policy file: its text compiled, then the certificate, key and CA files it names
//! read, so that a broken file is a configuration error rather than a failure at the first
//! connection.

use std::path::Path;

use crate::config::{compile_file, ConfigError, ConfigErrors, Policy};

impl Policy {
    /// Reads and compiles a policy file.
    pub fn load(path: &Path) -> Result<Policy, ConfigErrors> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| {
            ConfigErrors(vec![ConfigError {
                file: name.clone(),
                position: None,
                key: String::new(),
                message: format!("cannot read the policy file: {error}"),
                excerpt: None,
            }])
        })?;
        let mut policy = compile_file(&name, &text, path.parent())?;
        policy.check_files(&name)?;
        Ok(policy)
    }

    /// Reads the certificate, key and CA files the policy names, so that a broken file is a
    /// configuration error rather than a failure at the first connection.
    pub fn check_files(&mut self, file: &str) -> Result<(), ConfigErrors> {
        let mut errors = Vec::new();
        let mut problem = |key: String, message: String| {
            errors.push(ConfigError {
                file: file.to_owned(),
                position: None,
                key,
                message,
                excerpt: None,
            })
        };
        if let Some(settings) = &self.server.tls {
            match crate::tls::TlsListener::new(settings, None) {
                Ok(tls) => {
                    let now = crate::limit::clock::unix_seconds() as i64;
                    for warning in tls.certificates.problems(now) {
                        self.warnings.push(format!("server.tls: {warning}"));
                    }
                }
                Err(message) => problem("server.tls".to_owned(), message.to_string()),
            }
        }
        if let Some(ca_file) = self
            .store
            .redis
            .as_ref()
            .and_then(|redis| redis.ca_file.as_ref())
        {
            if let Err(message) = crate::tls::client_config(Some(ca_file)) {
                problem("store.ca_file".to_owned(), message.to_string());
            }
        }
        for upstream in &self.upstreams {
            if let Some(ca_file) = &upstream.ca_file {
                if let Err(message) = crate::tls::client_config(Some(ca_file)) {
                    problem(
                        format!("upstreams.{}.ca_file", upstream.name),
                        message.to_string(),
                    );
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }
}
