//! The manifests in `k8s/deploy/` are what the API server would accept: each deserializes into
//! its k8s-openapi type and back to the same document (a misspelled or misplaced field would
//! be dropped on the way and show as a difference), and the Role grants what the driver needs
//! and nothing more.

use std::path::PathBuf;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn deploy(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Parses `file` as a `T`, checks nothing was lost on the way, and returns it.
fn typed<T: DeserializeOwned + Serialize>(file: &str) -> T {
    let text = deploy(file);
    let document: Value = if file.ends_with(".json") {
        serde_json::from_str(&text).expect("JSON")
    } else {
        serde_yaml::from_str(&text).expect("YAML")
    };
    let object: T = serde_json::from_value(document.clone())
        .unwrap_or_else(|e| panic!("{file} is not its type: {e}"));
    let mut back = serde_json::to_value(&object).expect("serializes");
    if let (Some(back), Some(_)) = (back.as_object_mut(), document.get("apiVersion")) {
        // k8s-openapi writes apiVersion and kind itself; they must be the type's.
        assert_eq!(back.get("apiVersion"), document.get("apiVersion"), "{file}");
        assert_eq!(back.get("kind"), document.get("kind"), "{file}");
    }
    assert_eq!(back, document, "{file} changed on its way through its type");
    object
}

#[test]
fn the_service_account_is_a_service_account() {
    let account: ServiceAccount = typed("serviceaccount.yaml");
    assert_eq!(account.metadata.name.as_deref(), Some("flint-driver"));
}

#[test]
fn the_role_grants_pods_and_secrets_create_get_list_watch_delete_and_nothing_more() {
    let role: Role = typed("role.yaml");
    let rules = role.rules.expect("rules");
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(
        rule.resources.as_deref(),
        Some(&["pods".to_string(), "secrets".to_string()][..])
    );
    let verbs: Vec<&str> = rule.verbs.iter().map(String::as_str).collect();
    assert_eq!(verbs, ["create", "get", "list", "watch", "delete"]);
    assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
}

#[test]
fn the_role_binding_gives_the_role_to_the_drivers_account() {
    let binding: RoleBinding = typed("rolebinding.yaml");
    assert_eq!(binding.role_ref.kind, "Role");
    assert_eq!(binding.role_ref.name, "flint-driver");
    let subjects = binding.subjects.expect("subjects");
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(subjects[0].name, "flint-driver");
}

#[test]
fn the_driver_service_is_headless_and_selects_the_driver_pod() {
    let service: Service = typed("driver-service.yaml");
    let spec = service.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    let job: Job = typed("driver-job.yaml");
    let labels = job
        .spec
        .expect("spec")
        .template
        .metadata
        .expect("meta")
        .labels;
    let labels = labels.expect("labels");
    for (key, value) in spec.selector.expect("selector") {
        assert_eq!(
            labels.get(&key),
            Some(&value),
            "the Job's pod has {key}={value}"
        );
    }
}

#[test]
fn the_driver_job_runs_flint_k8s_as_the_drivers_account_non_root_read_only() {
    let job: Job = typed("driver-job.yaml");
    let pod = job.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some("flint-driver"));
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        pod.security_context.and_then(|s| s.run_as_non_root),
        Some(true)
    );
    let driver = &pod.containers[0];
    let command = driver.command.clone().expect("command");
    assert_eq!(command.last().map(String::as_str), Some("flint-k8s"));
    let args = driver.args.clone().expect("args");
    assert_eq!(args[0], "submit");
    assert!(args
        .windows(2)
        .any(|w| w[0] == "--master" && w[1] == "k8s://"));
    let security = driver.security_context.clone().expect("securityContext");
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    let env = driver.env.clone().expect("env");
    assert!(env.iter().any(|e| e.name == "FLINT_DRIVER_POD_NAME"));
}

#[test]
fn the_executor_template_is_a_pod_with_an_executor_container() {
    let pod: Pod = typed("executor-template.json");
    let spec = pod.spec.expect("spec");
    assert_eq!(spec.containers[0].name, "executor");
    let security = spec.containers[0]
        .security_context
        .clone()
        .expect("security");
    assert_eq!(security.read_only_root_filesystem, Some(true));
}
