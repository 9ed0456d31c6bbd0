//! A private CA and its leaf certificates, made by the `openssl` command as operators make
//! them: EC P-256 keys, names in the subjectAltName.

use std::path::{Path, PathBuf};
use std::process::Command;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// A new EC P-256 key, unencrypted.
const NEW_EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
];

pub struct Pki {
    dir: PathBuf,
    pub ca: CertificateDer<'static>,
    pub ca_file: PathBuf,
}

/// A leaf's files and its DER, to compare with what a server presents.
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: CertificateDer<'static>,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        let subject = ["-subj", "/CN=tollgate test CA"];
        let files = ["-keyout", "ca.key", "-out", "ca.pem", "-days", "30"];
        openssl(
            dir,
            &[&["req", "-x509"][..], &NEW_EC_KEY, &files, &subject].concat(),
        );
        let ca_file = dir.join("ca.pem");
        Pki {
            ca: CertificateDer::from_pem_file(&ca_file).unwrap(),
            ca_file,
            dir: dir.to_owned(),
        }
    }

    /// A leaf `NAME.pem`/`NAME.key` for `names`, valid for `days` from now (negative: ended).
    pub fn leaf(&self, name: &str, names: &[&str], days: i64) -> Leaf {
        let (key, csr, cert) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        let subject = format!("/CN={}", names[0]);
        let files = ["-keyout", &key, "-out", &csr, "-subj", &subject];
        openssl(&self.dir, &[&["req"][..], &NEW_EC_KEY, &files].concat());
        let alt_names: Vec<String> = names
            .iter()
            .map(|name| match name.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{name}"),
                Err(_) => format!("DNS:{name}"),
            })
            .collect();
        let extensions = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&extensions),
            format!("subjectAltName={}\n", alt_names.join(",")),
        )
        .unwrap();
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                &days.to_string(),
                "-extfile",
                &extensions,
                "-out",
                &cert,
            ],
        );
        let cert = self.dir.join(cert);
        Leaf {
            der: CertificateDer::from_pem_file(&cert).unwrap(),
            cert,
            key: self.dir.join(key),
        }
    }
}
