//! Records the git commit the binary is built from, for `sendium --version`: the
//! `SENDIUM_GIT_COMMIT` environment variable when set (a container build has no `.git`),
//! else `git rev-parse`, else "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SENDIUM_GIT_COMMIT");
    for path in ["../.git/HEAD", "../.git/refs", "../.git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = std::env::var("SENDIUM_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| String::from_utf8(o.stdout).ok())
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SENDIUM_GIT_COMMIT={commit}");
}
