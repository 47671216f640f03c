//! The cluster's certificates, as kubeadm lays them out: one CA that signs the API server's
//! serving certificate and every client's (the admin in `system:masters`, the controller manager,
//! kube-proxy, each node as `system:node:<name>` in `system:nodes`), and the key that signs
//! service-account tokens. ECDSA P-256 throughout; written as PEM files in the cluster's directory.

use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// The CA, the service-account key, and where they are.
pub struct Pki {
    dir: PathBuf,
    ca_params: CertificateParams,
    ca_key: KeyPair,
    /// The CA certificate (every client's trust root, and the client CA of the API server).
    pub ca: CertFiles,
    /// The service-account signing key (PKCS#8).
    pub service_account_key: PathBuf,
    /// Its public half (the API server verifies tokens with it).
    pub service_account_public: PathBuf,
}

impl Pki {
    /// Makes a new CA and service-account key under `dir`.
    pub fn generate(dir: &Path) -> Self {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = name("topology-e2e-ca", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let ca = write_pair(dir, "ca", &ca_cert.pem(), &ca_key.serialize_pem());
        let (service_account_key, service_account_public) =
            (dir.join("service-account.key"), dir.join("service-account.pub"));
        let signing = KeyPair::generate().expect("service-account key");
        write(&service_account_key, &signing.serialize_pem());
        write(&service_account_public, &signing.public_key_pem());
        Self { dir: dir.to_path_buf(), ca_params, ca_key, ca, service_account_key, service_account_public }
    }

    /// The API server's serving certificate, for these addresses and the Service's DNS names.
    pub fn serving(&self, file: &str, addresses: &[IpAddr], names: &[&str]) -> CertFiles {
        let mut params = CertificateParams::default();
        params.distinguished_name = name("kube-apiserver", None);
        params.subject_alt_names = addresses.iter().map(|address| SanType::IpAddress(*address)).collect();
        params
            .subject_alt_names
            .extend(names.iter().map(|name| SanType::DnsName((*name).try_into().expect("DNS name"))));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(file, &params)
    }

    /// A client certificate: the API server reads the user from CN and the group from O.
    pub fn client(&self, file: &str, user: &str, group: Option<&str>) -> CertFiles {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(user, group);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(file, &params)
    }

    fn sign(&self, file: &str, params: &CertificateParams) -> CertFiles {
        let key = KeyPair::generate().expect("key");
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer).unwrap_or_else(|e| panic!("signing {file}: {e}"));
        write_pair(&self.dir, file, &cert.pem(), &key.serialize_pem())
    }
}

/// A subject of one organization at most: rcgen keeps one value per attribute type, and no client
/// here needs two groups.
fn name(common: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name.push(DnType::CommonName, common);
    name
}

fn write_pair(dir: &Path, file: &str, cert: &str, key: &str) -> CertFiles {
    let files = CertFiles { cert: dir.join(format!("{file}.crt")), key: dir.join(format!("{file}.key")) };
    write(&files.cert, cert);
    write(&files.key, key);
    files
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
