//! Certificates for the TLS tests, made at test time with `rcgen`: a test
//! CA, certificates it signs for `localhost` and 127.0.0.1 (a good one, an
//! expired one, one for another name, a client one), and an unrelated CA.
//! Written as PEM files in a temporary directory, for the servers
//! (redis-server's `tls-port`, stunnel) and for kvwasm's `ca_file`.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, date_time_ymd,
};

/// A PEM certificate and its key, as files.
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The test PKI (see the module documentation).
pub struct Pki {
    pub dir: tempfile::TempDir,
    /// The CA that signs every certificate below.
    pub ca: PathBuf,
    /// A CA that signs nothing here: trusting it alone must fail.
    pub other_ca: PathBuf,
    /// Valid now, for `localhost` and 127.0.0.1.
    pub server: CertFiles,
    /// For `localhost` and 127.0.0.1, expired in 2021.
    pub expired: CertFiles,
    /// Valid now, for `elsewhere.invalid` only.
    pub wrong_name: CertFiles,
    /// A client certificate (mutual TLS).
    pub client: CertFiles,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA")
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, text: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write a PEM file");
            path
        };
        let test_ca = ca("kvwasm test CA");
        let ca_path = write("ca.pem", &test_ca.pem());
        let other_ca = write("other-ca.pem", &ca("kvwasm unrelated CA").pem());
        let leaf = |name: &str, sans: &[&str], usage, expired: bool| {
            let mut params =
                CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                    .expect("leaf params");
            params.distinguished_name.push(DnType::CommonName, sans[0]);
            params.extended_key_usages = vec![usage];
            if expired {
                params.not_before = date_time_ymd(2020, 1, 1);
                params.not_after = date_time_ymd(2021, 1, 1);
            }
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &test_ca).expect("sign a leaf");
            CertFiles {
                cert: write(&format!("{name}.pem"), &cert.pem()),
                key: write(&format!("{name}.key"), &key.serialize_pem()),
            }
        };
        let local = ["localhost", "127.0.0.1"];
        let server_auth = ExtendedKeyUsagePurpose::ServerAuth;
        Pki {
            ca: ca_path,
            other_ca,
            server: leaf("server", &local, server_auth.clone(), false),
            expired: leaf("expired", &local, server_auth.clone(), true),
            wrong_name: leaf("wrong-name", &["elsewhere.invalid"], server_auth, false),
            client: leaf(
                "client",
                &["kvwasm-client"],
                ExtendedKeyUsagePurpose::ClientAuth,
                false,
            ),
            dir,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for Pki {
    fn default() -> Pki {
        Pki::new()
    }
}
