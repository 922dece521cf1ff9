use std::path::Path;

use kube_watcher::crd::crd_yaml;

#[test]
fn deploy_crd_yaml_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crd/crd.yaml");
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = crd_yaml().unwrap();
    assert!(
        on_disk == generated,
        "{} is stale or missing: run `cargo xtask crd`",
        path.display()
    );
}
