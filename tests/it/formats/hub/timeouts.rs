//! Timeouts, stalled transfers, Ctrl-C, and a download in another process.

use super::*;

// ---------------------------------------------------------------------------------------------
// Timeouts and Ctrl-C

/// A hub that accepts each connection and never answers (nor closes it).
struct Silent {
    addr: SocketAddr,
    held: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Silent {
    fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let addr = listener.local_addr().unwrap();
        let held = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, st) = (held.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(c) = conn {
                    h.lock().unwrap().push(c);
                }
            }
        });
        Silent {
            addr,
            held,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn accepted(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// Runs `cmd` and times it; `fails_with`'s checks, and a bound on the time.
fn fails_within(cmd: &mut Command, args: &[&str], code: i32, limit: Duration) -> String {
    let t = std::time::Instant::now();
    let err = fails_with(cmd.timeout(Duration::from_secs(30)), args, code);
    let took = t.elapsed();
    assert!(
        took < limit,
        "{args:?} took {took:?} (limit {limit:?}): {err}"
    );
    err
}

/// A hub that accepts the connection and never answers: `inspect` and `shard` give up after
/// `HF_HUB_ETAG_TIMEOUT` seconds and say which variable to raise.
#[test]
fn silent_hub_times_out() {
    let silent = Silent::start();
    let home = TempDir::new().unwrap();
    let out = home.path().join("out");
    for args in [
        &["inspect", REPO][..],
        &["shard", REPO, "--tp", "2", "-o", out.to_str().unwrap()],
    ] {
        let err = fails_within(
            wload_at(&silent.url(), home.path()).env("HF_HUB_ETAG_TIMEOUT", "1"),
            args,
            1,
            Duration::from_secs(6),
        );
        for want in [
            REPO,
            &silent.url(),
            "1 s",
            "HF_HUB_ETAG_TIMEOUT",
            "file list",
        ] {
            assert!(err.contains(want), "{args:?}: no '{want}' in: {err}");
        }
    }
    assert!(silent.accepted() >= 2, "the connections were accepted");
    assert!(!out.exists());
}

/// A transfer that sends half the file and then nothing is retried with a Range request from
/// where it stopped, a few times, then given up with a message naming the file, the endpoint and
/// `HF_HUB_DOWNLOAD_TIMEOUT`; what arrived stays for the next run, which completes it.
#[test]
fn stalled_transfer_gives_up_and_the_next_run_resumes() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.stall(SHARDS[0], u32::MAX);
    let home = TempDir::new().unwrap();
    let err = fails_within(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_DOWNLOAD_TIMEOUT", "1"),
        &read_all(REPO, &[]),
        1,
        Duration::from_secs(15),
    );
    for want in [
        SHARDS[0],
        &hub.url(),
        "1 s",
        "HF_HUB_DOWNLOAD_TIMEOUT",
        ".part",
    ] {
        assert!(err.contains(want), "no '{want}' in: {err}");
    }
    let data = llama_repo().files[SHARDS[0]].clone();
    let half = data.len() / 2;
    // The first try got half; three more (DOWNLOAD_ATTEMPTS in a row without new bytes) each
    // asked for the rest.
    let resumed = Some(format!("bytes={half}-"));
    let tries = hub.transfers(SHARDS[0]);
    assert_eq!(tries.len(), 4, "{tries:?}");
    assert_eq!(tries[0].as_deref(), Some("bytes=0-"), "{tries:?}");
    assert!(tries[1..].iter().all(|r| *r == resumed), "{tries:?}");
    let blobs = repo_dir(&home.path().join("hub")).join("blobs");
    let part = blobs.join(format!("{}.part", etag(&data)));
    assert_eq!(fs::read(&part).unwrap(), data[..half]);

    let hub = Hub::start(one_repo(REPO, llama_repo()));
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &["--json"]),
    );
    assert_eq!(hub.transfers(SHARDS[0]), [resumed]);
    assert_eq!(fs::read(blobs.join(etag(&data))).unwrap(), data);
    assert!(!part.exists());
}

/// A transfer that stalls once is resumed by the same run, and the file is whole.
#[test]
fn transfer_that_stalls_once_completes() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.stall(SHARDS[0], 1);
    let home = TempDir::new().unwrap();
    let t = std::time::Instant::now();
    let v = ok_json(
        wload_hub(Some(&hub), home.path())
            .env("HF_HUB_DOWNLOAD_TIMEOUT", "1")
            .timeout(Duration::from_secs(30)),
        &read_all(REPO, &["--json"]),
    );
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert_eq!(fetched_files(&v), read_set());
    let data = llama_repo().files[SHARDS[0]].clone();
    assert_eq!(
        hub.transfers(SHARDS[0]),
        [
            Some("bytes=0-".to_string()),
            Some(format!("bytes={}-", data.len() / 2))
        ]
    );
    let blob = repo_dir(&home.path().join("hub"))
        .join("blobs")
        .join(etag(&data));
    assert_eq!(fs::read(blob).unwrap(), data);
}

/// A timeout that huggingface_hub would not read either is a usage error naming the variable,
/// found before any connection is made.
#[test]
fn malformed_timeouts_are_usage_errors() {
    let home = TempDir::new().unwrap();
    for (var, value) in [
        ("HF_HUB_ETAG_TIMEOUT", "1.5"),
        ("HF_HUB_ETAG_TIMEOUT", "ten"),
        ("HF_HUB_DOWNLOAD_TIMEOUT", "-3"),
    ] {
        let err = fails_within(
            wload_hub(None, home.path()).env(var, value),
            &["inspect", REPO],
            2,
            Duration::from_secs(5),
        );
        assert!(
            err.contains(&format!("{var}='{value}'")) && err.contains("seconds"),
            "{err}"
        );
    }
    // A whole number is taken, and 0 means the default, as in huggingface_hub: these fail only
    // because nothing listens at the endpoint.
    for value in ["30", "0", " 1_0 "] {
        let err = fails_within(
            wload_hub(None, home.path()).env("HF_HUB_ETAG_TIMEOUT", value),
            &["inspect", REPO],
            1,
            Duration::from_secs(5),
        );
        assert!(err.contains("cannot reach"), "{value}: {err}");
    }
}

/// `wload` as a plain child process, for the tests that signal it, with SIGINT as a terminal
/// gives it: a suite started in the background by a shell without job control has it ignored,
/// and children inherit that.
fn spawn_wload(endpoint: &str, home: &Path, args: &[&str]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = wload_process();
    // SAFETY: `signal` is async-signal-safe, as code between fork and exec must be.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    for k in CLEARED {
        cmd.env_remove(k);
    }
    cmd.env("HF_HOME", home)
        .env("HF_ENDPOINT", endpoint)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("wload starts")
}

/// Waits for `cond`, failing the test after `limit`.
fn wait_for(what: &str, limit: Duration, cond: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGINT and expects the process to end, as interrupted, within two seconds (it is killed
/// and the test fails otherwise).
fn interrupt(child: &mut std::process::Child) {
    use std::os::unix::process::ExitStatusExt;
    // SAFETY: a signal to a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(2) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("Ctrl-C did not stop wload within 2 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        status.signal() == Some(libc::SIGINT) || status.code() == Some(130),
        "{status:?}"
    );
}

/// Ctrl-C stops a run at once while the hub is silent and while a transfer is stalled (with the
/// default 10 s timeouts), and the partial file it leaves is resumed by the next run.
#[test]
fn ctrl_c_stops_a_waiting_run_and_the_next_run_resumes() {
    let home = TempDir::new().unwrap();
    let silent = Silent::start();
    let load: &[&str] = &["load", REPO, "--tp", "1", "--dry-run", "--device", "cpu"];
    for (i, args) in [&["inspect", REPO][..], load].into_iter().enumerate() {
        let mut child = spawn_wload(&silent.url(), home.path(), args);
        wait_for(
            "a connection to the silent hub",
            Duration::from_secs(20),
            || silent.accepted() > i,
        );
        interrupt(&mut child);
    }

    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.stall(SHARDS[0], 1);
    let data = llama_repo().files[SHARDS[0]].clone();
    let half = data.len() / 2;
    let blobs = repo_dir(&home.path().join("hub")).join("blobs");
    let part = blobs.join(format!("{}.part", etag(&data)));
    let out = home.path().join("out");
    let mut child = spawn_wload(
        &hub.url(),
        home.path(),
        &["shard", REPO, "--tp", "2", "-o", out.to_str().unwrap()],
    );
    wait_for(
        "half the shard in its .part",
        Duration::from_secs(20),
        || fs::metadata(&part).is_ok_and(|m| m.len() == half as u64),
    );
    interrupt(&mut child);
    assert_eq!(fs::read(&part).unwrap(), data[..half]);
    assert!(!out.exists());

    hub.forget();
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &["--json"]),
    );
    assert_eq!(hub.transfers(SHARDS[0]), [Some(format!("bytes={half}-"))]);
    assert_eq!(fs::read(blobs.join(etag(&data))).unwrap(), data);
}

/// A server that answers a resumed request with the whole file (200, not 206) gets the file
/// written from its start, not appended to the partial one.
#[test]
fn ignored_range_restarts_the_file() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.shared.ignore_range.store(true, Ordering::SeqCst);
    let home = TempDir::new().unwrap();
    let data = llama_repo().files[SHARDS[0]].clone();
    let half = data.len() / 2;
    let blobs = repo_dir(&home.path().join("hub")).join("blobs");
    fs::create_dir_all(&blobs).unwrap();
    fs::write(blobs.join(format!("{}.part", etag(&data))), &data[..half]).unwrap();
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &["--json"]),
    );
    assert_eq!(hub.transfers(SHARDS[0]), [Some(format!("bytes={half}-"))]);
    assert_eq!(fs::read(blobs.join(etag(&data))).unwrap(), data);
}

/// A download of the same blob by another process (holding `blobs/<etag>.lock`) is waited for
/// while its partial file grows (longer than `HF_HUB_DOWNLOAD_TIMEOUT`), and its complete file
/// is then taken without a transfer; a holder that writes nothing is given up on.
#[test]
fn a_download_in_another_process_is_waited_for() {
    use std::os::fd::AsRawFd;
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    let data = llama_repo().files[SHARDS[0]].clone();
    let blobs = repo_dir(&home.path().join("hub")).join("blobs");
    fs::create_dir_all(&blobs).unwrap();
    let lock = fs::File::create(blobs.join(format!("{}.lock", etag(&data)))).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let part = blobs.join(format!("{}.part", etag(&data)));
    fs::write(&part, &data[..data.len() / 2]).unwrap();
    // A holder that writes nothing is given up on after the timeout.
    let err = fails_within(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_DOWNLOAD_TIMEOUT", "1"),
        &read_all(REPO, &[]),
        1,
        Duration::from_secs(6),
    );
    assert!(
        err.contains(SHARDS[0]) && err.contains("held by another download"),
        "{err}"
    );
    hub.forget();
    let writer = {
        let (part, data) = (part.clone(), data.clone());
        std::thread::spawn(move || {
            // The other download goes on, slowly, for longer than HF_HUB_DOWNLOAD_TIMEOUT, then
            // completes and lets go.
            for _ in 0..8 {
                std::thread::sleep(Duration::from_millis(300));
                let mut f = fs::OpenOptions::new().append(true).open(&part).unwrap();
                let len = fs::metadata(&part).unwrap().len() as usize;
                f.write_all(&data[len..(len + 1).min(data.len())]).unwrap();
            }
            let len = fs::metadata(&part).unwrap().len() as usize;
            let mut f = fs::OpenOptions::new().append(true).open(&part).unwrap();
            f.write_all(&data[len..]).unwrap();
            drop(lock);
        })
    };
    let v = ok_json(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_DOWNLOAD_TIMEOUT", "1"),
        &read_all(REPO, &["--json"]),
    );
    writer.join().unwrap();
    assert!(fetched_files(&v).contains(SHARDS[0]), "{v:#}");
    assert_eq!(hub.transfers(SHARDS[0]), Vec::<Option<String>>::new());
    assert_eq!(fs::read(blobs.join(etag(&data))).unwrap(), data);
}
