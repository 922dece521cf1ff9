//! deploy/: the default kustomization leaves MetalLB's CRD alone, the CRD
//! has its own, the image is set in one place, and the Docker build context
//! and layers are what the README says.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every YAML document of `text`.
fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).unwrap())
        .filter(|document| !document.is_null())
        .collect()
}

/// (kind, name) of every object the kustomization in `dir` lists.
fn objects(dir: &Path) -> (Value, Vec<(String, String)>) {
    let kustomization = documents(&read(&dir.join("kustomization.yaml"))).remove(0);
    let mut found = Vec::new();
    for resource in kustomization["resources"].as_array().unwrap() {
        for object in documents(&read(&dir.join(resource.as_str().unwrap()))) {
            found.push((
                object["kind"].as_str().unwrap().to_owned(),
                object["metadata"]["name"].as_str().unwrap().to_owned(),
            ));
        }
    }
    (kustomization, found)
}

#[test]
fn the_default_kustomization_has_no_crd_and_the_crd_one_has_it() {
    let (kustomization, default) = objects(&deploy());
    assert!(
        default
            .iter()
            .all(|(kind, _)| kind != "CustomResourceDefinition"),
        "{default:?}"
    );
    for kind in ["Deployment", "PodDisruptionBudget", "Role", "ClusterRole"] {
        assert!(default.iter().any(|(k, _)| k == kind), "{kind} missing");
    }
    // The image is set by the images: entry, which names the Deployment's.
    let deployment = documents(&read(&deploy().join("deployment.yaml"))).remove(0);
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap();
    let name = kustomization["images"][0]["name"].as_str().unwrap();
    assert_eq!(image.split(':').next(), Some(name));

    let (_, crd) = objects(&deploy().join("crd"));
    assert_eq!(
        crd,
        [(
            "CustomResourceDefinition".to_owned(),
            "ipaddresspools.metallb.io".to_owned()
        )]
    );
    let (_, monitoring) = objects(&deploy().join("monitoring"));
    assert!(monitoring.iter().any(|(k, _)| k == "ServiceMonitor"));
}

/// With kubectl on the PATH, its kustomize builds each directory the same
/// way (skipped, saying so, without it).
#[test]
fn kubectl_kustomize_builds_each_directory() {
    let kinds = |dir: &str| -> Option<Vec<String>> {
        let output = std::process::Command::new("kubectl")
            .args(["kustomize", &deploy().join(dir).to_string_lossy()])
            .output()
            .ok()?;
        assert!(
            output.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Some(
            documents(&String::from_utf8_lossy(&output.stdout))
                .iter()
                .map(|o| o["kind"].as_str().unwrap().to_owned())
                .collect(),
        )
    };
    let Some(default) = kinds("") else {
        eprintln!("kubectl not found: kustomize builds not checked");
        return;
    };
    assert!(!default.iter().any(|k| k == "CustomResourceDefinition"));
    assert!(default.iter().any(|k| k == "PodDisruptionBudget"));
    assert_eq!(kinds("crd").unwrap(), ["CustomResourceDefinition"]);
}

#[test]
fn the_docker_build_skips_build_output_and_caches_dependencies() {
    let root = deploy().join("..");
    let ignored = read(&root.join(".dockerignore"));
    for entry in ["target/", ".git/", "fuzz/"] {
        assert!(ignored.lines().any(|l| l == entry), "{entry} not ignored");
    }
    let dockerfile = read(&deploy().join("Dockerfile"));
    let cook = dockerfile.find("cargo chef cook").unwrap();
    let build = dockerfile.find("FROM chef AS build").unwrap();
    let sources = dockerfile[build..].find("COPY . .").unwrap() + build;
    assert!(
        cook < sources,
        "dependencies must be built before the sources are copied"
    );
}
