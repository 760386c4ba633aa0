//! Certificates for TLS tests, made with the `openssl` command: a CA, a server
//! certificate for 127.0.0.1 and localhost, and a client certificate, all
//! signed by the CA and valid for a day.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA with a server and a client certificate in a temporary directory,
/// removed when dropped.
pub struct TestCertificates {
    dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl on PATH (scripts/lib/deps.sh ensure_openssl)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A key and a certificate `name`.pem for `subject`, signed by the CA in `dir`
/// with the extensions `extensions`.
fn signed(dir: &Path, name: &str, subject: &str, extensions: &str) {
    let (key, csr, pem, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}.ext"),
    );
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key, "-out", &csr,
        ],
    );
    std::fs::write(dir.join(&ext), extensions).expect("write extensions");
    openssl(
        dir,
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
            "1",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    );
}

impl TestCertificates {
    /// Makes a new CA (`CN=<ca_name>`) and its server and client certificates.
    pub fn generate(ca_name: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for certificates");
        openssl(
            dir.path(),
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                &format!("/CN={ca_name}"),
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        );
        signed(
            dir.path(),
            "server",
            "/CN=localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        signed(
            dir.path(),
            "client",
            "/CN=trainyard-client",
            "extendedKeyUsage=clientAuth\n",
        );
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.path("server.pem")
    }

    pub fn server_key(&self) -> PathBuf {
        self.path("server.key")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.path("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }

    /// A nats-server `tls { ... }` block serving the server certificate; with
    /// `verify_clients`, clients must present a certificate signed by the CA.
    pub fn nats_tls_block(&self, verify_clients: bool) -> String {
        let verify = if verify_clients {
            format!(
                "  ca_file: {:?}\n  verify: true\n",
                self.ca().display().to_string()
            )
        } else {
            String::new()
        };
        format!(
            "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n{verify}}}\n",
            self.server_cert().display().to_string(),
            self.server_key().display().to_string()
        )
    }
}
