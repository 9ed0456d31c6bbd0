//! Every relative link of the README and of docs/ leads somewhere: the file exists and, for a
//! link with `#section`, that file has a heading whose anchor (as GitHub spells it) is that.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md"), root().join("deploy/README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|extension| extension == "md") {
            files.push(path);
        }
    }
    files
}

/// GitHub's anchor of a heading: lower case, punctuation dropped (but `-` and `_`), spaces
/// as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks), repeated ones numbered.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = anchor(heading);
        let mut name = base.clone();
        let mut count = 0;
        while found.contains(&name) {
            count += 1;
            name = format!("{base}-{count}");
        }
        found.insert(name);
    }
    found
}

/// The targets of `[text](target)` links outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    targets
}

fn check(file: &Path, target: &str) -> Result<(), String> {
    if target.starts_with("http://") || target.starts_with("https://") {
        return Ok(());
    }
    let (path, section) = match target.split_once('#') {
        Some((path, section)) => (path, Some(section)),
        None => (target, None),
    };
    let linked = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().unwrap().join(path)
    };
    if !linked.exists() {
        return Err(format!("{target}: no such file"));
    }
    if let Some(section) = section {
        let text = std::fs::read_to_string(&linked).unwrap();
        if !anchors(&text).contains(section) {
            return Err(format!("{target}: no such heading"));
        }
    }
    Ok(())
}

#[test]
fn every_relative_link_leads_to_a_file_and_a_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let text = std::fs::read_to_string(&file).unwrap();
        for target in links(&text) {
            checked += 1;
            if let Err(problem) = check(&file, &target) {
                broken.push(format!(
                    "{}: {problem}",
                    file.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked > 20, "only {checked} links found");
}

#[test]
fn anchors_are_spelled_as_github_spells_them() {
    assert_eq!(anchor(" `[upstreams.NAME]`"), "upstreamsname");
    assert_eq!(
        anchor(" Several replicas: the Redis store"),
        "several-replicas-the-redis-store"
    );
    let found = anchors("# A\n## A\n```\n# not a heading\n```\n");
    assert_eq!(found, BTreeSet::from(["a".to_owned(), "a-1".to_owned()]));
    assert_eq!(links("see [x](a.md#b) and [y](c.md)"), ["a.md#b", "c.md"]);
    assert!(check(&root().join("README.md"), "docs/metrics.md#no-such-heading").is_err());
    assert!(check(&root().join("README.md"), "docs/no-such-file.md").is_err());
}

#[test]
fn the_readme_stays_the_front_door() {
    let lines = std::fs::read_to_string(root().join("README.md"))
        .unwrap()
        .lines()
        .count();
    assert!(
        lines <= 450,
        "README.md has {lines} lines: the manual belongs in docs/"
    );
}
