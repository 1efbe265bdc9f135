//! Executor pods: the spec Flint creates (labels, command, the secret by reference, the owner
//! reference) and what a pod's status means as an [`ExecutorState`].

use std::collections::BTreeMap;

use flint_engine::lifecycle::ExecutorState;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, Pod, PodSpec, ResourceRequirements, Secret, SecretKeySelector,
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
#[derive(Debug, Clone)]
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
    /// Cores per executor (the container's cpu request, and `flint executor --cores`).
    pub cores: u32,
    /// Memory request per executor, in MiB (0: none).
    pub memory_mb: u64,
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
    set_requests(container, settings);
    pod
}

/// The executor pod's name, namespace, labels and owner (the template's server-set fields
/// cleared).
fn set_metadata(meta: &mut ObjectMeta, settings: &PodSettings, name: &str) {
    meta.name = Some(name.to_string());
    meta.generate_name = None;
    meta.namespace = Some(settings.namespace.clone());
    meta.resource_version = None;
    meta.uid = None;
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(APP_LABEL.into(), settings.app_id.clone());
    labels.insert(ROLE_LABEL.into(), "executor".into());
    labels.insert(EXEC_LABEL.into(), name.to_string());
    if let Some(owner) = &settings.owner {
        meta.owner_references
            .get_or_insert_with(Vec::new)
            .push(owner.clone());
    }
}

/// The executor container's Flint variables (replacing the template's): the secret from the
/// app's Secret, the executor's and the app's ids.
fn set_env(container: &mut Container, settings: &PodSettings, name: &str) {
    let env = container.env.get_or_insert_with(Vec::new);
    env.retain(|e| {
        !matches!(
            e.name.as_str(),
            SECRET_KEY | "FLINT_EXECUTOR_ID" | "FLINT_APP_ID"
        )
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

/// The executor container's resource requests: its cores, and its memory if given.
fn set_requests(container: &mut Container, settings: &PodSettings) {
    let resources = container
        .resources
        .get_or_insert_with(ResourceRequirements::default);
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    requests.insert("cpu".into(), Quantity(settings.cores.to_string()));
    if settings.memory_mb > 0 {
        requests.insert(
            "memory".into(),
            Quantity(format!("{}Mi", settings.memory_mb)),
        );
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
