//! `runnev-statefulset ARGS…`: runs `runnev serve --id N ARGS…` where N is one more than the
//! ordinal at the end of the host name (`runnev-0` → 1, `runnev-2` → 3), the way a Kubernetes
//! StatefulSet names its pods. The Runnev image is `FROM scratch`, so there is no shell to do this
//! arithmetic in the pod spec; this launcher (std only, built by `deploy/build-image.sh` with plain
//! `rustc`) does it and then replaces itself with runnev (exec), so signals reach runnev directly.
//!
//! The host name is read from $HOSTNAME, else /proc/sys/kernel/hostname. $RUNNEV_ID_OFFSET (default
//! 0) is added to the id, so a second StatefulSet that replaces nodes gets ids that do not collide.
//! $RUNNEV_BIN overrides the path of runnev (default /usr/local/bin/runnev). `{id}` in any argument
//! is replaced by the node id.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

fn node_id(host: &str) -> Result<u64, String> {
    let host = host.trim();
    let short = host.split('.').next().unwrap_or(host);
    let ordinal = short
        .rsplit_once('-')
        .map(|(_, n)| n)
        .ok_or_else(|| format!("host name {host:?} does not end in -ORDINAL (a StatefulSet pod name)"))?;
    let ordinal: u64 =
        ordinal.parse().map_err(|_| format!("host name {host:?} does not end in -ORDINAL (a StatefulSet pod name)"))?;
    Ok(ordinal + 1)
}

fn main() -> ExitCode {
    let host = match std::env::var("HOSTNAME") {
        Ok(h) if !h.trim().is_empty() => h,
        _ => match std::fs::read_to_string("/proc/sys/kernel/hostname") {
            Ok(h) => h,
            Err(e) => {
                eprintln!("runnev-statefulset: no $HOSTNAME and /proc/sys/kernel/hostname: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let id = match node_id(&host) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("runnev-statefulset: {e}");
            return ExitCode::from(2);
        }
    };
    let offset: u64 = match std::env::var("RUNNEV_ID_OFFSET") {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse() {
            Ok(o) => o,
            Err(_) => {
                eprintln!("runnev-statefulset: RUNNEV_ID_OFFSET={v:?} is not a number");
                return ExitCode::from(2);
            }
        },
        _ => 0,
    };
    let id = id + offset;
    let bin = std::env::var("RUNNEV_BIN").unwrap_or_else(|_| "/usr/local/bin/runnev".to_string());
    // `{id}` in an argument is the node id: each pod finds its own certificate and key
    // (`--tls-cert=/etc/runnev/tls/node-{id}.pem`) in a Secret that holds every node's.
    let args: Vec<String> = std::env::args().skip(1).map(|a| a.replace("{id}", &id.to_string())).collect();
    eprintln!("runnev-statefulset: host {} -> node id {id}", host.trim());
    let err = Command::new(&bin).arg("serve").arg("--id").arg(id.to_string()).args(&args).exec();
    eprintln!("runnev-statefulset: running {bin}: {err}");
    ExitCode::from(1)
}
