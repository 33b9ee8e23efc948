//! The commands the secure deployments in `deploy/` rest on: `runnev cert create-admin-token`
//! (the admin token of `deploy/secrets.sh`) and `runnev probe --ca-file` (the image's health
//! check over TLS), against a real secure `runnev serve`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::BIN;

fn runnev(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUNNEV_CA_FILE")
        .env_remove("RUNNEV_TOKEN")
        .output()
        .expect("running runnev")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn create_admin_token_writes_a_private_token_once() {
    let dir = tempfile::Builder::new().prefix("runnev-test-admin-token-").tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8 path");
    let made = runnev(&["cert", "create-admin-token", "--dir", d]);
    assert!(made.status.success(), "create-admin-token failed: {}", stderr(&made));
    let path = dir.path().join("admin.token");
    let text = std::fs::read_to_string(&path).expect("admin.token");
    let token = runnev::auth::Token::parse(text.trim()).expect("a token");
    assert!(token.expose().starts_with("rnv_admin_"), "the admin token is named admin");
    let mode = std::fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is private");
    let stdout = String::from_utf8_lossy(&made.stdout);
    assert!(!stdout.contains(token.expose()) && !stderr(&made).contains(token.expose()), "the secret is not printed");

    let again = runnev(&["cert", "create-admin-token", "--dir", d]);
    assert_eq!(again.status.code(), Some(1), "a second run refuses: {}", stderr(&again));
    assert!(stderr(&again).contains("never overwritten"), "{}", stderr(&again));
    assert_eq!(std::fs::read_to_string(&path).expect("admin.token"), text, "the first token is kept");
}

/// The DNS names and IP addresses a PEM certificate names.
fn hosts_of(pem_file: &std::path::Path) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let pem = std::fs::read(pem_file).expect("a certificate");
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).expect("PEM");
    let cert = pem.parse_x509().expect("a certificate");
    let san = cert.subject_alternative_name().expect("SAN").expect("a SAN");
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some(d.to_string()),
            GeneralName::IPAddress(ip) => Some(ip.iter().map(u8::to_string).collect::<Vec<_>>().join(".")),
            _ => None,
        })
        .collect()
}

/// `deploy/secrets.sh` puts `$RUNNEV_EXTRA_HOSTS` on every node's certificate and
/// `$RUNNEV_NODE_N_HOSTS` on node N's only (it had only the first, so one node's own names went
/// on every certificate; found by a fresh user's trial).
#[test]
fn secrets_sh_names_each_node_s_own_hosts_on_its_certificate_only() {
    let dir = tempfile::Builder::new().prefix("runnev-test-secrets-").tempdir().expect("tempdir");
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/secrets.sh"))
        .arg(dir.path())
        .env("RUNNEV_BIN", BIN)
        .env("RUNNEV_NODE_COUNT", "2")
        .env("RUNNEV_EXTRA_HOSTS", "lb.example.com")
        .env("RUNNEV_NODE_1_HOSTS", "db1.example.com 10.0.0.11")
        .env_remove("RUNNEV_NODE_2_HOSTS")
        .output()
        .expect("running secrets.sh");
    assert!(out.status.success(), "secrets.sh failed: {}", stderr(&out));
    let one = hosts_of(&dir.path().join("node-1.pem"));
    let two = hosts_of(&dir.path().join("node-2.pem"));
    for h in ["lb.example.com", "db1.example.com", "10.0.0.11", "runnev1", "127.0.0.1"] {
        assert!(one.contains(&h.to_string()), "node 1 lacks {h}: {one:?}");
    }
    assert!(two.contains(&"lb.example.com".to_string()) && two.contains(&"runnev2".to_string()), "{two:?}");
    for h in ["db1.example.com", "10.0.0.11", "runnev1"] {
        assert!(!two.contains(&h.to_string()), "node 2's certificate names node 1's {h}: {two:?}");
    }
}

/// Kills the node when the test ends, however it ends.
struct Node(std::process::Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn probe_checks_a_tls_node_against_the_cluster_ca() {
    let dir = tempfile::Builder::new().prefix("runnev-test-probe-tls-").tempdir().expect("tempdir");
    let files = runnev::local::prepare_secure(&dir.path().join("pki"), 1).expect("certificates");
    let port = runnev::launcher::free_ports(1).expect("a free port")[0];
    let listen = format!("127.0.0.1:{port}");
    let data = dir.path().join("node-1");
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--id".into(),
        "1".into(),
        "--data-dir".into(),
        data.display().to_string(),
        "--listen".into(),
        listen.clone(),
        "--peers".into(),
        format!("1={listen}"),
    ];
    args.extend(files.serve_args.iter().map(|a| a.replace("{id}", "1")));
    let log = std::fs::File::create(dir.path().join("node-1.log")).expect("log file");
    let _node =
        Node(Command::new(BIN).args(&args).stdout(log.try_clone().expect("log")).stderr(log).spawn().expect("serve"));

    let ca = files.ca.display().to_string();
    let url = format!("https://{listen}/readyz");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let probed = runnev(&["probe", &url, "--ca-file", &ca]);
        if probed.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node never answered the probe over TLS: {}\nnode log:\n{}",
            stderr(&probed),
            std::fs::read_to_string(dir.path().join("node-1.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let without_ca = runnev(&["probe", &url]);
    assert_eq!(without_ca.status.code(), Some(1), "https without a CA: {}", stderr(&without_ca));
    assert!(stderr(&without_ca).contains("--ca-file"), "the error names --ca-file: {}", stderr(&without_ca));

    let other = dir.path().join("other");
    let made = runnev(&["cert", "create-ca", "--dir", other.to_str().expect("utf-8 path")]);
    assert!(made.status.success(), "{}", stderr(&made));
    let other_ca = other.join("ca.pem").display().to_string();
    let wrong_ca = runnev(&["probe", &url, "--ca-file", &other_ca]);
    assert_eq!(wrong_ca.status.code(), Some(1), "a node whose certificate another CA signed fails the probe");

    let plain = runnev(&["probe", &format!("http://{listen}/readyz"), "--timeout-ms", "1000"]);
    assert_eq!(plain.status.code(), Some(1), "the TLS node answers no plain HTTP probe");
}
