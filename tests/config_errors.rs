//! Bad policy files, one per mistake: each is refused with a message that names the key and
//! says what would be valid (the expected text is the fixture's first line, `# expect: ...`).

use std::path::Path;
use std::process::Command;

use tollgate::config::Policy;

fn fixtures() -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad"))
            .expect("fixtures folder")
            .map(|entry| entry.expect("entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
            .collect();
    files.sort();
    files
}

#[test]
fn every_bad_fixture_is_refused_with_its_message() {
    let files = fixtures();
    assert!(files.len() >= 30, "fixtures found: {}", files.len());
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read fixture");
        let expected = text
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} has no '# expect:' line", file.display()));
        let errors = match Policy::load(&file) {
            Ok(_) => panic!("{} was accepted", file.display()),
            Err(errors) => errors.to_string(),
        };
        assert!(
            errors.contains(expected),
            "{}:\nexpected: {expected}\ngot:      {errors}",
            file.display()
        );
        let location = format!("{}:", file.display());
        assert!(
            errors.starts_with(&location),
            "errors name the file: {errors}"
        );
    }
}

/// One mistake is one error: a mistyped key gets a suggestion, and what follows from the
/// half-read table (its missing capacity, a route naming it) is not reported again; an
/// unrelated mistake elsewhere still is, and a key far from every valid one keeps the list.
#[test]
fn a_typo_is_one_error_with_a_suggestion() {
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad/one_letter_typo.toml");
    let errors = Policy::load(&file).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].key, "limits.per_account.capacty");
    assert!(
        errors.0[0].message.ends_with("did you mean `capacity`?"),
        "{errors}"
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let elsewhere = text.replace(
        "[[routes]]",
        "[limits.other]\nkey = \"global\"\ncapacity = 5\nrate = \"0/s\"\n\n[[routes]]",
    );
    let errors = Policy::parse("typo.toml", &elsewhere).unwrap_err();
    assert_eq!(errors.0.len(), 2, "{errors}");
    assert_eq!(errors.0[1].key, "limits.other.rate", "{errors}");
    let far = text.replace("capacty = 5", "capacity = 5\nburstiness = 5");
    let errors = Policy::parse("typo.toml", &far).unwrap_err();
    assert!(
        errors.0[0].message.contains("expected one of `key`"),
        "{errors}"
    );
}

#[test]
fn errors_carry_line_and_column() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad/unknown_limit.toml");
    let errors = Policy::load(&file).unwrap_err();
    assert_eq!(errors.0.len(), 1);
    assert_eq!(errors.0[0].position, Some((12, 11)));
    assert_eq!(
        errors.0[0].excerpt.as_deref(),
        Some("limits = [\"per_netwrk\"]")
    );
}

#[test]
fn check_exits_1_on_a_bad_file_and_0_on_the_shipped_examples() {
    let binary = env!("CARGO_BIN_EXE_tollgate");
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad/zero_rate.toml");
    let output = Command::new(binary)
        .args(["check", "--config"])
        .arg(&bad)
        .output()
        .expect("run check");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("zero_rate.toml:7:8: limits.per_network.rate"),
        "{stderr}"
    );

    let examples = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("config"))
        .expect("config folder");
    let mut checked = 0;
    for example in examples {
        let path = example.expect("entry").path();
        if path.extension().is_some_and(|ext| ext == "toml") {
            let output = Command::new(binary)
                .args(["check", "--config"])
                .arg(&path)
                .env("TOLLGATE_HASH_KEY", "an example secret for the check")
                .output()
                .expect("run check");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert_eq!(
                output.status.code(),
                Some(0),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(stdout.contains("routes (first match wins)"), "{stdout}");
            checked += 1;
        }
    }
    assert!(
        checked >= 2,
        "config/ holds the commented reference and small examples"
    );
}

#[test]
fn run_refuses_to_start_on_an_invalid_file() {
    let bad =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad/duplicate_route_name.toml");
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["run", "--config"])
        .arg(&bad)
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("duplicate route name"));
}

#[test]
fn suspicious_but_valid_policy_is_warned_about() {
    let policy = Policy::parse(
        "warn.toml",
        r#"
        [upstreams.app]
        url = "http://127.0.0.1:3000"
        [upstreams.unused]
        url = "http://127.0.0.1:3001"
        [limits.account]
        key = { json_field = "email" }
        capacity = 5
        rate = "1/min"
        [limits.spare]
        key = "global"
        capacity = 5
        rate = "1/s"
        [[routes]]
        name = "reads"
        methods = ["GET"]
        path = "/login"
        upstream = "app"
        limits = ["account"]
        [[routes]]
        name = "open"
        path_prefix = "/static"
        upstream = "app"
        "#,
    )
    .expect("valid");
    let warnings = policy.warnings.join("\n");
    for expected in [
        "limit \"spare\" is not used by any route",
        "upstream \"unused\" is not used by any route",
        "route \"open\" has no limits",
        "route \"reads\" only matches GET/HEAD but a limit reads the request body",
        "no catch-all route",
    ] {
        assert!(
            warnings.contains(expected),
            "missing warning {expected:?} in:\n{warnings}"
        );
    }
}
