use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_fake-watcher");

fn quickstart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/quickstart.jsonl")
}

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let written = input.write_all(stdin.unwrap_or_default().as_bytes());
    // A command that fails before reading its input (a bad --config) may
    // exit before the write: its output says what happened.
    if let Err(error) = written {
        assert_eq!(error.kind(), std::io::ErrorKind::BrokenPipe, "{error}");
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

const POOL: &str = r#"{"type":"ADDED","object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p"},"spec":{"addresses":["10.0.0.0/31"]}}}"#;

fn service(name: &str) -> String {
    format!(
        r#"{{"type":"ADDED","object":{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}"}},"spec":{{"type":"LoadBalancer"}}}}}}"#
    )
}

#[test]
fn quickstart_prints_a_kubectl_like_table() {
    let output = run(&["replay", quickstart().to_str().unwrap()], None);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "\
NAMESPACE   NAME      EXTERNAL-IP     POOL      WARNING   REASON
infra       dns-tcp   192.168.10.2    default
infra       dns-udp   192.168.10.2    default
shop        cache     192.168.10.1    default
shop        db        192.168.10.50   default
"
    );
    assert_eq!(stderr(&output), "");
}

#[test]
fn json_and_yaml_are_the_result_document() {
    let path = quickstart();
    let json = run(
        &["replay", path.to_str().unwrap(), "--output", "json"],
        None,
    );
    assert_eq!(json.status.code(), Some(0));
    let document: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let keys: Vec<&String> = document.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "cilium_pools",
            "events",
            "pools",
            "rejected_pools",
            "services"
        ]
    );
    assert!(stdout(&json).starts_with("{\n  \"services\": [\n"));
    assert_eq!(document["pools"][0]["ipv4"]["total"], 254);
    assert_eq!(document["pools"][0]["kind"], "IPAddressPool");

    let yaml = run(&["replay", path.to_str().unwrap(), "-o", "yaml"], None);
    assert_eq!(yaml.status.code(), Some(0));
    let from_yaml: serde_json::Value = serde_yaml_ng::from_slice(&yaml.stdout).unwrap();
    assert_eq!(from_yaml, document);
}

#[test]
fn standard_input_is_dash() {
    let stream = format!("{POOL}\n{}\n", service("web"));
    let output = run(&["replay", "-", "-o", "json"], Some(&stream));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let document: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(document["services"][0]["key"], "default/web");
    assert_eq!(document["services"][0]["ips"][0], "10.0.0.0");
}

#[test]
fn a_bad_line_stops_with_status_2_and_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let stream = format!("{POOL}\n{{\"type\":\"ADDDED\"}}\n{}\n", service("web"));
    let path = write(&dir, "bad.jsonl", &stream);
    let output = run(&["replay", &path], None);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(stdout(&output), "");
    assert_eq!(
        stderr(&output),
        format!("{path}:2: unknown event type \"ADDDED\"\n")
    );

    let output = run(&["replay", &path, "--keep-going"], None);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stdout(&output).contains("default     web    10.0.0.0"),
        "{}",
        stdout(&output)
    );
    assert_eq!(
        stderr(&output),
        format!("{path}:2: unknown event type \"ADDDED\"\n")
    );
}

#[test]
fn a_stream_cut_off_midway_names_its_last_line() {
    let stream = format!("{POOL}\n{}", &service("web")[..40]);
    let output = run(&["replay", "-"], Some(&stream));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).starts_with("<stdin>:2: not JSON: EOF while parsing"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn unknown_kinds_warn_once() {
    let deployment = r#"{"type":"ADDED","object":{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"}}}"#;
    let stream = format!("{deployment}\n{deployment}\n");
    let output = run(&["replay", "-"], Some(&stream));
    assert_eq!(output.status.code(), Some(0));
    let warnings = stderr(&output).matches("Deployment").count();
    assert_eq!(warnings, 1, "{}", stderr(&output));
    assert!(stderr(&output).contains("No LoadBalancer services found."));
    assert_eq!(stdout(&output), "");
}

#[test]
fn legacy_config_and_lb_class() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        &dir,
        "metallb.yaml",
        "address-pools:\n- name: legacy\n  protocol: layer2\n  addresses: [10.9.0.0/24]\n",
    );
    let classy = service("classy").replace(
        "\"type\":\"LoadBalancer\"",
        "\"type\":\"LoadBalancer\",\"loadBalancerClass\":\"x\"",
    );
    let stream = format!("{}\n{classy}\n", service("web"));
    let output = run(&["replay", "-", "--config", &config], Some(&stream));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "\
NAMESPACE   NAME   EXTERNAL-IP   POOL     WARNING   REASON
default     web    10.9.0.0      legacy
"
    );
    // A Service of another class is not pending: it is listed only with
    // --all, as `other class` (docs/replay.md §2.1).
    let all = run(
        &["replay", "-", "--config", &config, "--all"],
        Some(&stream),
    );
    assert_eq!(
        stdout(&all),
        "\
NAMESPACE   NAME     EXTERNAL-IP   POOL     WARNING   REASON
default     classy   <pending>     <none>             other class
default     web      10.9.0.0      legacy
"
    );
    let output = run(
        &["replay", "-", "--config", &config, "--lb-class", "x"],
        Some(&stream),
    );
    assert!(
        stdout(&output).contains("default     classy   10.9.0.0"),
        "{}",
        stdout(&output)
    );

    let bad = write(
        &dir,
        "bad.yaml",
        "address-pools:\n- name: a\n  addresses: 7\n",
    );
    let output = run(&["replay", "-", "--config", &bad], Some(""));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).starts_with(&format!("{bad}: address-pools[0] (\"a\"): addresses:")),
        "{}",
        stderr(&output)
    );
}

#[test]
fn bad_usage_and_missing_files_are_status_2() {
    for args in [
        &["replay"][..],
        &["replay", "-", "--output", "xml"],
        &["frobnicate"],
    ] {
        let output = run(args, Some(""));
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert_eq!(stdout(&output), "");
    }
    let output = run(&["replay", "/nonexistent/stream.jsonl"], None);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).starts_with("/nonexistent/stream.jsonl: cannot open: "));
}

#[test]
fn warnings_and_reasons_show_in_the_last_columns() {
    let stream = format!(
        "{POOL}\n{}\n{}\n{}\n",
        service("a"),
        service("b"),
        service("c")
    );
    let output = run(&["replay", "-"], Some(&stream));
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        stdout(&output),
        "\
NAMESPACE   NAME   EXTERNAL-IP   POOL     WARNING            REASON
default     a      10.0.0.0      p
default     b      10.0.0.1      p
default     c      <pending>     <none>   AllocationFailed   PoolExhausted
"
    );
}

#[test]
fn endless_input_without_a_newline_stops_at_the_line_limit() {
    // Read to the limit (64 MiB) and no further: a line that never ends is
    // an error at line 1, with or without --keep-going.
    for args in [
        &["replay", "/dev/zero"][..],
        &["replay", "/dev/zero", "--keep-going"],
    ] {
        let output = run(args, None);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert_eq!(stdout(&output), "");
        assert_eq!(
            stderr(&output),
            "/dev/zero:1: line is longer than 67108864 bytes\n"
        );
    }
}

#[test]
fn progress_goes_to_stderr_when_forced_and_never_to_stdout() {
    let mut stream = format!("{POOL}\n");
    for n in 0..300 {
        stream.push_str(&service(&format!("s{n}")));
        stream.push('\n');
    }
    let plain = run(&["replay", "-", "-o", "json"], Some(&stream));
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    // Not a terminal: no progress unless forced.
    assert_eq!(stderr(&plain), "");
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "s.jsonl", &stream);
    let forced = run(&["replay", &path, "-o", "json", "--progress"], None);
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
    assert_eq!(forced.stdout, plain.stdout);
    assert!(
        stderr(&forced).starts_with("progress: line 256 of ~"),
        "{}",
        stderr(&forced)
    );
    let quiet = run(&["replay", &path, "-o", "json", "--quiet"], None);
    assert_eq!(quiet.stdout, plain.stdout);
    assert_eq!(stderr(&quiet), "");
    let both = run(&["replay", &path, "--quiet", "--progress"], None);
    assert_eq!(both.status.code(), Some(2));
}

#[test]
fn an_empty_lb_class_means_no_class() {
    let classy = service("classy").replace(
        "\"type\":\"LoadBalancer\"",
        "\"type\":\"LoadBalancer\",\"loadBalancerClass\":\"x\"",
    );
    let stream = format!("{POOL}\n{}\n{classy}\n", service("web"));
    let without = run(&["replay", "-"], Some(&stream));
    let empty = run(&["replay", "-", "--lb-class", ""], Some(&stream));
    assert_eq!(empty.status.code(), Some(0), "{}", stderr(&empty));
    assert_eq!(stdout(&empty), stdout(&without));
    assert!(
        stdout(&empty).contains("default     web    10.0.0.0"),
        "{}",
        stdout(&empty)
    );
}

#[test]
fn an_unwritable_output_is_status_1_with_a_message() {
    let full = std::fs::File::create("/dev/full").unwrap();
    let output = Command::new(BIN)
        .args(["replay", quickstart().to_str().unwrap()])
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).starts_with("cannot write the result: "),
        "{}",
        stderr(&output)
    );
}

#[test]
fn config_takes_pool_objects_and_configmaps_and_refuses_a_file_without_pools() {
    let dir = tempfile::tempdir().unwrap();
    let stream = format!("{}\n", service("web"));
    let objects = write(
        &dir,
        "pools.yaml",
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: yaml\n  namespace: metallb-system\nspec:\n  addresses: [10.7.0.0/24]\n---\napiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {name: l2}\n",
    );
    let configmap = write(
        &dir,
        "configmap.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: config, namespace: metallb-system}\ndata:\n  config: |\n    address-pools:\n    - name: wrapped\n      addresses: [10.8.0.0/24]\n",
    );
    let list = write(
        &dir,
        "list.json",
        r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"json"},"spec":{"addresses":["10.9.0.0/24"]}}]}"#,
    );
    for (config, pool, ip) in [
        (&objects, "yaml", "10.7.0.0"),
        (&configmap, "wrapped", "10.8.0.0"),
        (&list, "json", "10.9.0.0"),
    ] {
        let output = run(
            &["replay", "-", "-o", "json", "--config", config],
            Some(&stream),
        );
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let document: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(document["services"][0]["pool"], pool);
        assert_eq!(document["services"][0]["ips"][0], ip);
    }
    let empty = write(&dir, "empty.yaml", "peers: []\n");
    let output = run(&["replay", "-", "--config", &empty], Some(&stream));
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(stdout(&output), "");
    assert_eq!(
        stderr(&output),
        format!(
            "{empty}: no pool in the file: no address-pools, IPAddressPool object or \
             ConfigMap with data.config\n"
        )
    );
}

/// docs/replay.md §2.1: an address the replay moved is marked with what the
/// stream's status showed.
#[test]
fn a_moved_address_shows_what_it_was() {
    let held = service("web").replace(
        "\"spec\":{\"type\":\"LoadBalancer\"}",
        "\"spec\":{\"type\":\"LoadBalancer\"},\"status\":{\"loadBalancer\":{\"ingress\":[{\"ip\":\"10.9.9.9\"}]}}",
    );
    let stream = format!("{POOL}\n{held}\n");
    let output = run(&["replay", "-"], Some(&stream));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("10.0.0.0 (was 10.9.9.9)"),
        "{}",
        stdout(&output)
    );
}
