//! The README states the restart guarantee of every profile this build accepts, in the
//! words the code uses (`check-config` prints the same sentences). A profile enabled in
//! code but not documented — or documented but refused — fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap()
}

#[test]
fn readme_states_every_implemented_profile_and_its_guarantee() {
    let readme = readme();
    for p in sendium_profiles::implemented_profiles() {
        let g = sendium_profiles::check_supported(&p).unwrap();
        let row = format!("| {} | {} |", p.outbound(), g.outbound);
        assert!(readme.contains(&row), "README lacks the row {row:?}");
        assert!(readme.contains(g.dlr), "README lacks the DLR guarantee {:?}", g.dlr);
    }
}

#[test]
fn the_binary_runs_and_its_embedded_configuration_is_valid() {
    let out = Command::new(env!("CARGO_BIN_EXE_sendium"))
        .arg("version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("sendium "));
    let cfg = sendium_profiles::load_str(sendium_profiles::QUICKSTART).unwrap();
    assert!(readme().contains(&format!("account `{}`", cfg.smpp.unwrap().accounts[0].system_id)));
}

#[test]
fn unknown_commands_are_usage_errors() {
    let out = Command::new(env!("CARGO_BIN_EXE_sendium"))
        .arg("frobnicate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"));
}

/// The README's configuration reference, as printed (its commented lines stay comments),
/// loads and passes validation: a key renamed or a default changed in code, and not in
/// the README, fails here.
#[test]
fn the_configuration_reference_in_the_readme_loads_as_written() {
    let readme = readme();
    let section = readme
        .split("## Configuration reference")
        .nth(1)
        .expect("a Configuration reference section");
    let toml = section
        .split("```toml\n")
        .nth(1)
        .and_then(|block| block.split("\n```").next())
        .expect("a toml block in the Configuration reference");
    let env = [
        ("PROVIDER_API_KEY".to_string(), "k".to_string()),
        ("PROVIDER_RECEIPT_SECRET".to_string(), "s".to_string()),
    ];
    if let Err(e) = sendium_profiles::load_str_with_env(toml, env) {
        panic!("the README's configuration reference does not load: {e}");
    }
}
