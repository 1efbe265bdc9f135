//! Issue 16: each role fails with its own typed error (no `String`s), whose message is the one
//! the CLI has always printed.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flint_engine::standalone::AppSpec;
use flint_net::observe::http::{
    Access, HttpError, HttpHandler, HttpLimits, HttpServer, Response, Site,
};
use flint_net::pools::{self, PoolsError};
use flint_net::{
    AppClient, AppClientConfig, AppClientError, JournalError, MasterConfig, MasterError,
    MasterHandle, Secret, SecretError,
};

/// A fresh directory under the system's temporary one, named for this test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "flint-errors-{name}-{}-{}",
        std::process::id(),
        common::unique()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn secrets_say_what_is_wrong_with_them() {
    assert!(matches!(Secret::new(""), Err(SecretError::Empty)));
    assert_eq!(SecretError::Empty.to_string(), "the shared secret is empty");
    let dir = scratch("secret");
    let missing = dir.join("missing");
    let Err(SecretError::Read { path, .. }) = Secret::from_file(&missing) else {
        panic!("a missing file is a read error");
    };
    assert_eq!(path, missing);
    let file = dir.join("secret");
    let secret = Secret::new("s3cret").expect("non-empty");
    secret.write_new_file(&file).expect("written");
    let again = secret.write_new_file(&file);
    assert!(
        matches!(&again, Err(SecretError::Create { path, .. }) if *path == file),
        "{again:?}"
    );
    let shown = again.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(shown.starts_with("cannot create secret file "), "{shown}");
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").expect("written");
    assert!(matches!(Secret::from_file(&empty), Err(SecretError::Empty)));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_pool_file_is_refused_with_a_typed_reason() {
    assert!(matches!(
        pools::parse("[pool.a]\nweight = 0"),
        Err(PoolsError::Weight { ref pool, weight: 0 }) if pool == "a"
    ));
    assert!(matches!(
        pools::parse("[pool.a]\nmode = \"lifo\""),
        Err(PoolsError::Mode { ref mode, .. }) if mode == "lifo"
    ));
    assert!(matches!(
        pools::parse("[pool.a]\nminshare = 1"),
        Err(PoolsError::Syntax(_))
    ));
    let dir = scratch("pools");
    assert!(matches!(
        pools::load(&dir.join("missing.toml")),
        Err(PoolsError::Read { .. })
    ));
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[pool.a]\nweight = 2000").expect("written");
    let error = pools::load(&bad).expect_err("a weight over the maximum");
    let PoolsError::Invalid { path, source } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(path, &bad);
    assert!(matches!(**source, PoolsError::Weight { weight: 2000, .. }));
    assert_eq!(
        error.to_string(),
        format!("{}: pool a: weight 2000, expected 1 to 1000", bad.display())
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_master_that_cannot_start_says_why() {
    let insecure = MasterHandle::start(MasterConfig {
        listen: "0.0.0.0:0".parse().expect("addr"),
        ..MasterConfig::default()
    });
    assert!(
        matches!(insecure, Err(MasterError::InsecureBind(_))),
        "{insecure:?}"
    );

    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = held.local_addr().expect("addr");
    let taken = MasterHandle::start(MasterConfig {
        listen: addr,
        ..MasterConfig::default()
    });
    assert!(
        matches!(&taken, Err(MasterError::Listen { addr: a, .. }) if *a == addr),
        "{taken:?}"
    );

    // A state directory under a regular file cannot be created.
    let dir = scratch("journal");
    let file = dir.join("file");
    std::fs::write(&file, "").expect("written");
    let journal = MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        state_dir: Some(file.join("state")),
        ..MasterConfig::default()
    });
    assert!(
        matches!(
            journal,
            Err(MasterError::Journal(JournalError::CreateDir { .. }))
        ),
        "{journal:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_app_client_without_a_master_times_out_registering() {
    let master = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let client = AppClient::start(AppClientConfig {
        master,
        secret: None,
        spec: AppSpec {
            name: "errors".into(),
            cores_per_executor: 1,
            ..AppSpec::default()
        },
        executors: Some(1),
        reconnect_max: Duration::from_millis(100),
    })
    .expect("the client starts without a master");
    let registered = client.wait_registered(Duration::from_millis(200));
    assert!(
        matches!(
            registered,
            Err(AppClientError::NotRegistered { timeout_ms: 200 })
        ),
        "{registered:?}"
    );
    assert!(matches!(
        client.sync(Duration::from_millis(200)),
        Err(AppClientError::NoAnswer { timeout_ms: 200 })
    ));
    client.stop(Duration::from_millis(10));
}

#[test]
fn an_http_server_beyond_loopback_needs_a_token() {
    let handler: HttpHandler = Arc::new(|_| Response::text(200, "ok"));
    let refused = HttpServer::start(
        "0.0.0.0:0".parse().expect("addr"),
        Access::Open,
        HttpLimits::default(),
        Site::handler(handler),
    );
    assert!(
        matches!(refused, Err(HttpError::InsecureBind(_))),
        "{refused:?}"
    );
}
