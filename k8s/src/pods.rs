//! Executor pods: the spec Flint creates (labels, command, the secret by reference, the owner
//! reference, the settings users expect from Spark's `spark.kubernetes.*`: resources, node
//! selector, tolerations, image pull policy and secrets, service account, labels, annotations,
//! the termination grace period) and what a pod's status means as an [`ExecutorState`].
//!
//! A pod template (`--pod-template`) is merged the way Spark merges `podTemplateFile`: the
//! template is the starting point and Flint's own fields win; maps (labels, annotations, node
//! selector, resources) are merged key by key with Flint's keys over the template's, lists
//! (tolerations, image pull secrets, env) keep the template's entries and add Flint's (an env
//! var or pull secret of the same name is replaced), everything Flint does not set (volumes,
//! affinity, sidecars, security contexts, ...) is the template's.

use std::collections::BTreeMap;

use flint_engine::lifecycle::ExecutorState;
use flint_net::executor::DRAIN_TIMEOUT_ENV;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, LocalObjectReference, Pod, PodSpec, ResourceRequirements,
    Secret, SecretKeySelector, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;

/// Label naming the application (Spark: `spark-app-selector`).
pub const APP_LABEL: &str = "flint-app-id";
/// Label naming the role, `executor` (Spark: `spark-role`).
pub const ROLE_LABEL: &str = "flint-role";
/// Label naming the executor id (Spark: `spark-exec-id`).
pub const EXEC_LABEL: &str = "flint-exec-id";
/// The key of the shared secret in the app's Secret, and the variable the executor reads.
pub const SECRET_KEY: &str = "FLINT_SECRET";
/// The executor container's name (in a pod template, the container Flint fills in).
pub const CONTAINER: &str = "executor";

/// The label selector for one application's executor pods.
pub fn selector(app_id: &str) -> String {
    format!("{APP_LABEL}={app_id},{ROLE_LABEL}=executor")
}

/// What goes into every executor pod.
#[derive(Debug, Clone, Default)]
pub struct PodSettings {
    /// The application id (a label value: at most 63 characters of `[a-z0-9-]`).
    pub app_id: String,
    /// The namespace the pods are created in.
    pub namespace: String,
    /// The container image (overrides the template's).
    pub image: Option<String>,
    /// The program the container runs, split on whitespace (`tini -- flint` in the image built
    /// from the Dockerfile, so `flint executor` is not the container's PID 1).
    pub executor_command: String,
    /// The driver's address as the executors reach it.
    pub driver_addr: String,
    /// Cores per executor (the container's cpu request and limit, and `flint executor
    /// --cores`).
    pub cores: u32,
    /// Memory per executor, in MiB: the container's memory request and limit (0: none).
    pub memory_mb: u64,
    /// Node labels the pods must match (`spec.nodeSelector`, merged over the template's).
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate (added to the template's).
    pub tolerations: Vec<Toleration>,
    /// `Always`, `IfNotPresent` or `Never` (else the template's, else the server's default).
    pub image_pull_policy: Option<String>,
    /// Secrets to pull the image with (added to the template's).
    pub image_pull_secrets: Vec<String>,
    /// The pods' service account (else the template's, else the namespace's default).
    pub service_account: Option<String>,
    /// Labels added to the pods (Flint's own three always win).
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the pods.
    pub annotations: BTreeMap<String, String>,
    /// `terminationGracePeriodSeconds`: how long a deleted pod's executor has between SIGTERM
    /// and SIGKILL (the deletes Flint makes use the same); 0: the template's, else the
    /// server's default (30 s).
    pub grace_s: u32,
    /// The Secret holding [`SECRET_KEY`].
    pub secret_name: String,
    /// The driver's pod, when the driver runs in one: executor pods are owned by it.
    pub owner: Option<OwnerReference>,
    /// A pod to start from (`--pod-template`): its metadata labels and annotations, spec
    /// (node selector, tolerations, volumes, ...) and the container named `executor` (or the
    /// first) are kept; name, namespace, Flint's labels, restart policy, command, args and
    /// Flint's env are set over it.
    pub template: Option<Pod>,
}

/// The Secret the application creates: the shared secret under [`SECRET_KEY`], labelled with
/// the app id.
pub fn secret(settings: &PodSettings, value: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(settings.secret_name.clone()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(BTreeMap::from([(
                APP_LABEL.to_string(),
                settings.app_id.clone(),
            )])),
            owner_references: settings.owner.clone().map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            SECRET_KEY.to_string(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        type_: Some("Opaque".into()),
        ..Secret::default()
    }
}

/// The pod for executor `name` (which is also the pod's name).
pub fn executor_pod(settings: &PodSettings, name: &str) -> Pod {
    let mut pod = settings.template.clone().unwrap_or_default();
    pod.status = None;
    set_metadata(&mut pod.metadata, settings, name);
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    spec.restart_policy = Some("Never".into());
    let index = spec
        .containers
        .iter()
        .position(|c| c.name == CONTAINER)
        .unwrap_or(0);
    if spec.containers.is_empty() {
        spec.containers.push(Container::default());
    }
    let container = &mut spec.containers[index];
    container.name = CONTAINER.into();
    if let Some(image) = &settings.image {
        container.image = Some(image.clone());
    }
    container.command = Some(
        settings
            .executor_command
            .split_whitespace()
            .map(String::from)
            .collect(),
    );
    container.args = Some(vec![
        "executor".into(),
        "--driver".into(),
        settings.driver_addr.clone(),
        "--cores".into(),
        settings.cores.to_string(),
        "--id".into(),
        name.to_string(),
    ]);
    set_env(container, settings, name);
    set_resources(container, settings);
    set_scheduling(spec, settings);
    pod
}

/// The pod-wide settings over the template's: node selector, tolerations, pull secrets,
/// service account, grace period.
fn set_scheduling(spec: &mut PodSpec, settings: &PodSettings) {
    if !settings.node_selector.is_empty() {
        let selector = spec.node_selector.get_or_insert_with(BTreeMap::new);
        selector.extend(settings.node_selector.clone());
    }
    if !settings.tolerations.is_empty() {
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        tolerations.extend(settings.tolerations.iter().cloned());
    }
    if !settings.image_pull_secrets.is_empty() {
        let secrets = spec.image_pull_secrets.get_or_insert_with(Vec::new);
        secrets.retain(|s| !settings.image_pull_secrets.contains(&s.name));
        secrets.extend(
            settings
                .image_pull_secrets
                .iter()
                .map(|name| LocalObjectReference { name: name.clone() }),
        );
    }
    if let Some(account) = &settings.service_account {
        spec.service_account_name = Some(account.clone());
    }
    if settings.grace_s > 0 {
        spec.termination_grace_period_seconds = Some(i64::from(settings.grace_s));
    }
}

/// The executor pod's name, namespace, labels and owner (the template's server-set fields
/// cleared).
fn set_metadata(meta: &mut ObjectMeta, settings: &PodSettings, name: &str) {
    meta.name = Some(name.to_string());
    meta.generate_name = None;
    meta.namespace = Some(settings.namespace.clone());
    meta.resource_version = None;
    meta.uid = None;
    if !settings.annotations.is_empty() {
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        annotations.extend(settings.annotations.clone());
    }
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.extend(settings.labels.clone());
    labels.insert(APP_LABEL.into(), settings.app_id.clone());
    labels.insert(ROLE_LABEL.into(), "executor".into());
    labels.insert(EXEC_LABEL.into(), name.to_string());
    if let Some(owner) = &settings.owner {
        meta.owner_references
            .get_or_insert_with(Vec::new)
            .push(owner.clone());
    }
}

/// How long an executor drains on SIGTERM: its grace period (30 s, the server's default, when
/// not set) less 2 s to report what is left and exit, at least 1 s.
pub fn drain_timeout_ms(settings: &PodSettings) -> u64 {
    let grace_s = if settings.grace_s > 0 {
        settings.grace_s
    } else {
        30
    };
    (u64::from(grace_s) * 1000).saturating_sub(2000).max(1000)
}

/// The executor container's Flint variables (replacing the template's): the secret from the
/// app's Secret, the executor's and the app's ids, the drain timeout on SIGTERM.
fn set_env(container: &mut Container, settings: &PodSettings, name: &str) {
    let env = container.env.get_or_insert_with(Vec::new);
    env.retain(|e| {
        !matches!(
            e.name.as_str(),
            SECRET_KEY | "FLINT_EXECUTOR_ID" | "FLINT_APP_ID" | DRAIN_TIMEOUT_ENV
        )
    });
    env.push(EnvVar {
        name: DRAIN_TIMEOUT_ENV.into(),
        value: Some(drain_timeout_ms(settings).to_string()),
        ..EnvVar::default()
    });
    env.push(EnvVar {
        name: SECRET_KEY.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: settings.secret_name.clone(),
                key: SECRET_KEY.into(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    });
    env.push(EnvVar {
        name: "FLINT_EXECUTOR_ID".into(),
        value: Some(name.to_string()),
        ..EnvVar::default()
    });
    env.push(EnvVar {
        name: "FLINT_APP_ID".into(),
        value: Some(settings.app_id.clone()),
        ..EnvVar::default()
    });
}

/// The executor container's resources over the template's: cpu request and limit of its
/// cores, memory request and limit of its memory (if given); other resources stay.
fn set_resources(container: &mut Container, settings: &PodSettings) {
    if let Some(policy) = &settings.image_pull_policy {
        container.image_pull_policy = Some(policy.clone());
    }
    let resources = container
        .resources
        .get_or_insert_with(ResourceRequirements::default);
    let mut amounts = vec![("cpu", Quantity(settings.cores.to_string()))];
    if settings.memory_mb > 0 {
        amounts.push(("memory", Quantity(format!("{}Mi", settings.memory_mb))));
    }
    for map in [&mut resources.requests, &mut resources.limits] {
        let map = map.get_or_insert_with(BTreeMap::new);
        for (name, amount) in &amounts {
            map.insert((*name).into(), amount.clone());
        }
    }
}

/// Termination reasons that mean the application brought the container down.
const APP_REASONS: &[&str] = &["OOMKilled"];

/// A pod's state as an executor state (after Spark's `ExecutorPodState`): phase `Pending`,
/// `Running`, `Succeeded`; `Failed` with the executor container's exit code (-1 if it has
/// none, e.g. evicted or its node lost) and whether the application caused it (OOMKilled, a
/// panic's code 101 or a crash signal: SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV; not eviction,
/// node loss, SIGKILL or SIGTERM); a pod being deleted (a deletion timestamp) and not finished
/// is deleted; an unknown phase is unknown.
pub fn pod_state(pod: &Pod) -> ExecutorState {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    match phase {
        "Succeeded" => return ExecutorState::Succeeded,
        "Failed" => return failed_state(pod),
        _ => {}
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return ExecutorState::Deleted;
    }
    match phase {
        "Pending" => ExecutorState::Pending,
        "Running" => ExecutorState::Running,
        _ => ExecutorState::Unknown,
    }
}

/// The state of a pod the API server reports deleted: its last phase if that was final,
/// else deleted.
pub fn deleted_state(pod: &Pod) -> ExecutorState {
    match pod_state(pod) {
        state if state.is_terminal() => state,
        _ => ExecutorState::Deleted,
    }
}

fn failed_state(pod: &Pod) -> ExecutorState {
    let status = pod.status.as_ref();
    let terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|all| {
            all.iter()
                .find(|c| c.name == CONTAINER)
                .or_else(|| all.first())
        })
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    match terminated {
        Some(t) => {
            let reason = t.reason.as_deref().unwrap_or("");
            let by_signal = t.exit_code > 128 && matches!(t.exit_code - 128, 4 | 6 | 7 | 8 | 11);
            ExecutorState::Failed {
                code: t.exit_code,
                caused_by_app: APP_REASONS.contains(&reason) || t.exit_code == 101 || by_signal,
            }
        }
        // Evicted, node lost, deadline exceeded: nothing the application did.
        None => ExecutorState::Failed {
            code: -1,
            caused_by_app: false,
        },
    }
}

/// The executor name of a pod (its name).
pub fn pod_name(pod: &Pod) -> Option<&str> {
    pod.metadata.name.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };

    fn settings() -> PodSettings {
        PodSettings {
            app_id: "flint-abc".into(),
            namespace: "ns".into(),
            image: Some("flint:dev".into()),
            executor_command: "flint".into(),
            driver_addr: "10.0.0.1:7078".into(),
            cores: 2,
            memory_mb: 512,
            secret_name: "flint-abc-secret".into(),
            owner: None,
            template: None,
            ..PodSettings::default()
        }
    }

    fn failed(code: i32, reason: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: CONTAINER.into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: code,
                            reason: Some(reason.into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_pod_has_the_labels_and_the_secret_by_reference_only() {
        let pod = executor_pod(&settings(), "flint-abc-exec-0");
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels[APP_LABEL], "flint-abc");
        assert_eq!(labels[ROLE_LABEL], "executor");
        assert_eq!(labels[EXEC_LABEL], "flint-abc-exec-0");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("flint:dev"));
        let env = c.env.as_ref().unwrap();
        let secret = env.iter().find(|e| e.name == SECRET_KEY).unwrap();
        assert!(secret.value.is_none(), "never plain env");
        let r = secret
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(r.name, "flint-abc-secret");
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("10.0.0.1:7078"));
    }

    #[test]
    fn a_template_keeps_its_spec_and_gets_flints_fields() {
        let template: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"team": "x"}},
            "spec": {"nodeSelector": {"pool": "batch"}, "containers": [
                {"name": "sidecar", "image": "busybox"},
                {"name": "executor", "image": "old", "env": [{"name": "A", "value": "1"}]}
            ]}
        }))
        .unwrap();
        let pod = executor_pod(
            &PodSettings {
                template: Some(template),
                ..settings()
            },
            "e1",
        );
        assert_eq!(pod.metadata.labels.as_ref().unwrap()["team"], "x");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_selector.unwrap()["pool"], "batch");
        assert_eq!(spec.containers[0].name, "sidecar");
        let c = &spec.containers[1];
        assert_eq!(c.image.as_deref(), Some("flint:dev"));
        assert!(c.env.as_ref().unwrap().iter().any(|e| e.name == "A"));
    }

    #[test]
    fn flints_settings_merge_over_the_templates_as_spark_merges_pod_templates() {
        let template: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"team": "x", "tier": "old"}, "annotations": {"a": "1"}},
            "spec": {
                "nodeSelector": {"pool": "batch", "zone": "a"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "imagePullSecrets": [{"name": "old"}, {"name": "shared"}],
                "serviceAccountName": "template-sa",
                "terminationGracePeriodSeconds": 99,
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [{"name": "executor", "image": "old", "imagePullPolicy": "Always",
                    "resources": {"requests": {"cpu": "7", "ephemeral-storage": "1Gi"}}}]
            }
        }))
        .unwrap();
        let toleration = Toleration {
            key: Some("spot".into()),
            operator: Some("Equal".into()),
            value: Some("true".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        };
        let settings = PodSettings {
            template: Some(template),
            node_selector: BTreeMap::from([("zone".into(), "b".into())]),
            tolerations: vec![toleration.clone()],
            image_pull_policy: Some("IfNotPresent".into()),
            image_pull_secrets: vec!["shared".into(), "new".into()],
            service_account: Some("flint".into()),
            labels: BTreeMap::from([("tier".into(), "new".into())]),
            annotations: BTreeMap::from([("b".into(), "2".into())]),
            grace_s: 40,
            ..settings()
        };
        let pod = executor_pod(&settings, "e1");
        let meta = &pod.metadata;
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(
            (labels["team"].as_str(), labels["tier"].as_str()),
            ("x", "new")
        );
        assert_eq!(labels[APP_LABEL], "flint-abc", "Flint's own labels win");
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(
            (annotations["a"].as_str(), annotations["b"].as_str()),
            ("1", "2")
        );
        let spec = pod.spec.unwrap();
        let selector = spec.node_selector.unwrap();
        assert_eq!(
            (selector["pool"].as_str(), selector["zone"].as_str()),
            ("batch", "b")
        );
        let tolerations = spec.tolerations.unwrap();
        assert_eq!(tolerations.len(), 2);
        assert_eq!(tolerations[1], toleration);
        let secrets: Vec<String> = spec
            .image_pull_secrets
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(secrets, vec!["old", "shared", "new"]);
        assert_eq!(spec.service_account_name.as_deref(), Some("flint"));
        assert_eq!(spec.termination_grace_period_seconds, Some(40));
        assert_eq!(
            spec.volumes.unwrap()[0].name,
            "scratch",
            "the rest is the template's"
        );
        let c = &spec.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        let resources = c.resources.as_ref().unwrap();
        let requests = resources.requests.as_ref().unwrap();
        assert_eq!(requests["cpu"].0, "2");
        assert_eq!(requests["memory"].0, "512Mi");
        assert_eq!(requests["ephemeral-storage"].0, "1Gi");
        let limits = resources.limits.as_ref().unwrap();
        assert_eq!(
            (limits["cpu"].0.as_str(), limits["memory"].0.as_str()),
            ("2", "512Mi")
        );
    }

    #[test]
    fn the_executor_drains_on_sigterm_for_its_grace_period_less_two_seconds() {
        let env_of = |grace_s| {
            let pod = executor_pod(
                &PodSettings {
                    grace_s,
                    ..settings()
                },
                "e1",
            );
            let spec = pod.spec.unwrap();
            let env = spec.containers[0].env.clone().unwrap();
            let drain = env.iter().find(|e| e.name == DRAIN_TIMEOUT_ENV).unwrap();
            (
                drain.value.clone().unwrap(),
                spec.termination_grace_period_seconds,
            )
        };
        assert_eq!(env_of(45), ("43000".to_string(), Some(45)));
        assert_eq!(env_of(0), ("28000".to_string(), None), "the server's 30 s");
        assert_eq!(
            env_of(2),
            ("1000".to_string(), Some(2)),
            "at least a second"
        );
    }

    #[test]
    fn without_settings_the_templates_values_stay() {
        let template: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"serviceAccountName": "template-sa", "terminationGracePeriodSeconds": 99,
                "containers": [{"name": "executor", "image": "i", "imagePullPolicy": "Never"}]}
        }))
        .unwrap();
        let pod = executor_pod(
            &PodSettings {
                template: Some(template),
                grace_s: 0,
                ..settings()
            },
            "e1",
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("template-sa"));
        assert_eq!(spec.termination_grace_period_seconds, Some(99));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("Never")
        );
    }

    #[test]
    fn phases_map_to_states() {
        assert_eq!(pod_state(&Pod::default()), ExecutorState::Pending);
        assert_eq!(
            pod_state(&failed(137, "Error")),
            ExecutorState::Failed {
                code: 137,
                caused_by_app: false
            }
        );
        assert_eq!(
            pod_state(&failed(137, "OOMKilled")),
            ExecutorState::Failed {
                code: 137,
                caused_by_app: true
            }
        );
        let evicted = Pod {
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                reason: Some("Evicted".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            pod_state(&evicted),
            ExecutorState::Failed {
                code: -1,
                caused_by_app: false
            }
        );
        let running = Pod {
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(pod_state(&running), ExecutorState::Running);
        assert_eq!(deleted_state(&running), ExecutorState::Deleted);
        assert_eq!(
            deleted_state(&failed(1, "Error")),
            ExecutorState::Failed {
                code: 1,
                caused_by_app: false
            }
        );
    }
}
