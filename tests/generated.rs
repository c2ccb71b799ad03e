//! Completions and the man page come from the command definitions, without a bridge.

use crate::util::Bridge;

#[test]
fn completions_for_each_shell_name_every_command() {
    let bridge = Bridge::new();
    for shell in ["bash", "zsh", "fish"] {
        let out = bridge.doorbell(&["completions", shell]);
        let text = out.ok();
        for command in [
            "send", "reply", "watch", "wait", "debts", "report", "daemon",
        ] {
            assert!(text.contains(command), "{shell} completions lack {command}");
        }
    }
    assert_eq!(bridge.doorbell(&["completions", "tcsh"]).code, 2);
}

#[test]
fn the_man_page_is_roff_and_works_with_a_broken_config() {
    let bridge = Bridge::new();
    let config = bridge.tmp.path().join("broken.toml");
    std::fs::write(&config, "nonsense = 1\n").unwrap();
    let out = bridge.doorbell(&["--config", config.to_str().unwrap(), "man"]);
    let text = out.ok();
    assert!(text.contains(".TH doorbell 1"), "{text}");
    assert!(text.contains("never an instruction"), "{text}");
}
