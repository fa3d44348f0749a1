//! For `bench/store.sh`: an S3-protocol server over a folder (`s3s-fs`), and an uploader through
//! the same client wload uses, so that wload's object-store runs are timed against a plain
//! upload of the same bytes through the same server.
//!
//! `cargo run --release --example s3_server -- serve ROOT PORT` serves ROOT (one folder per
//! bucket) on 127.0.0.1:PORT with the key `bench`/`bench`, until killed.
//! `cargo run --release --example s3_server -- upload DIR s3://bucket/prefix` uploads DIR's files
//! (multipart, 8 MiB parts, 8 in flight) with the `AWS_*` variables set.

use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["serve", root, port] => rt.block_on(serve(root, port.parse().expect("a port"))),
        ["upload", dir, url] => rt.block_on(upload(dir, url)),
        _ => panic!("usage: s3_server serve ROOT PORT | upload DIR s3://bucket/prefix"),
    }
}

async fn serve(root: &str, port: u16) {
    let fs = s3s_fs::FileSystem::new(root).expect("the root folder");
    let mut b = s3s::service::S3ServiceBuilder::new(fs);
    b.set_auth(s3s::auth::SimpleAuth::from_single("bench", "bench"));
    let service = b.build();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the port");
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let service = service.clone();
        tokio::spawn(async move {
            let _ = ConnBuilder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(socket), service)
                .await;
        });
    }
}

async fn upload(dir: &str, url: &str) {
    let (bucket, prefix) = url
        .trim_start_matches("s3://")
        .split_once('/')
        .expect("s3://bucket/prefix");
    let store: Arc<dyn ObjectStore> = Arc::new(
        object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_allow_http(true)
            .build()
            .expect("a client"),
    );
    for e in std::fs::read_dir(dir).expect("the folder") {
        let path = e.expect("an entry").path();
        let key = format!("{prefix}/{}", path.file_name().unwrap().to_string_lossy());
        let up = store.put_multipart(&key.into()).await.expect("an upload");
        let mut w = WriteMultipart::new_with_chunk_size(up, 8 << 20);
        let bytes = std::fs::read(&path).expect("the file");
        for part in bytes.chunks(8 << 20) {
            w.wait_for_capacity(8).await.expect("a part");
            w.write(part);
        }
        w.finish().await.expect("the upload");
    }
}
