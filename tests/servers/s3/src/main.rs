//! An S3 server on loopback for the S3 backend's tests and benchmarks:
//! s3s-fs's store (objects as files under a root directory) behind s3s's
//! S3 service, which checks SigV4 signatures. The same flags as the
//! `s3s-fs` binary.
//!
//! Why not that binary: its accepted sockets keep Nagle's algorithm, and it
//! writes a response's head and body apart, so the body of every response
//! on a kept-alive connection waited for the client's delayed ACK (about
//! 40 ms a request). Real S3 servers turn Nagle off; so does this one.

use clap::Parser;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "s3s-fs's store on loopback, with TCP_NODELAY")]
struct Opt {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long)]
    port: u16,
    /// Access key every request must be signed with.
    #[arg(long, requires = "secret_key")]
    access_key: Option<String>,
    /// Secret key of `--access-key`.
    #[arg(long, requires = "access_key")]
    secret_key: Option<String>,
    /// Directory holding one subdirectory per bucket.
    root: PathBuf,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let opt = Opt::parse();
    let store =
        s3s_fs::FileSystem::new(&opt.root).map_err(|e| format!("{}: {e:?}", opt.root.display()))?;
    let mut service = S3ServiceBuilder::new(store);
    if let (Some(access), Some(secret)) = (opt.access_key, opt.secret_key) {
        service.set_auth(SimpleAuth::from_single(access, secret));
    }
    let service = service.build();
    let listener = tokio::net::TcpListener::bind((opt.host.as_str(), opt.port)).await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    let server = Builder::new(TokioExecutor::new());
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        // A connection reset before this is that connection's problem only.
        if let Err(e) = socket.set_nodelay(true) {
            eprintln!("TCP_NODELAY: {e}");
            continue;
        }
        let connection = server
            .serve_connection(TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}
