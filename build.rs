//! Build metadata for `waitroom --version`: the commit (`WAITROOM_COMMIT`
//! if the packaging sets it, else `git rev-parse`, else `unknown`: a build
//! from a source tarball must not fail) and the enabled Cargo features.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=WAITROOM_COMMIT");
    let commit = match std::env::var("WAITROOM_COMMIT") {
        Ok(commit) if !commit.is_empty() => commit,
        _ => {
            // Rebuild when HEAD moves: HEAD itself, the branch it names, packed refs.
            for path in ["HEAD", "packed-refs"]
                .into_iter()
                .map(str::to_owned)
                .chain(git(&["symbolic-ref", "-q", "HEAD"]))
                .filter_map(|name| git(&["rev-parse", "--git-path", &name]))
                .filter(|path| Path::new(path).exists())
            {
                println!("cargo:rerun-if-changed={path}");
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(key, _)| key.strip_prefix("CARGO_FEATURE_").map(str::to_owned))
        .map(|name| name.to_lowercase().replace('_', "-"))
        .collect();
    features.sort();
    let features = if features.is_empty() {
        "none".into()
    } else {
        features.join(",")
    };
    println!("cargo:rustc-env=WAITROOM_COMMIT={commit}");
    println!("cargo:rustc-env=WAITROOM_FEATURES={features}");
}
