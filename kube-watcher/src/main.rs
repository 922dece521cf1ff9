//! `kube-watcher`: the allocator plugin on a real cluster.
//!
//! - `run`: watch Services, `IPAddressPool`s, Namespaces and (when served)
//!   `CiliumLoadBalancerIPPool`s, elect a leader,
//!   allocate and write (see the library's crate documentation).
//! - `record -o FILE`: write the cluster as a replay stream (docs/replay.md).
//! - `crd`: print the `IPAddressPool` CustomResourceDefinition.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kube_watcher::crd::crd_yaml;
use kube_watcher::logging::{self, LogFormat};
use kube_watcher::metrics::serve;
use kube_watcher::record::record;
use kube_watcher::{Host, HostConfig};
use manager::SharingAcrossNamespaces;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "kube-watcher", version, about)]
struct Cli {
    /// How log lines are written to stderr (text has colour only on a
    /// terminal; `RUST_LOG` sets the level, default info).
    #[arg(long, value_enum, global = true, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Allocate LoadBalancer addresses on the cluster (kubeconfig or in-cluster).
    Run(RunArgs),
    /// Write the cluster's objects, then its watch events, as a replay stream.
    Record(RecordArgs),
    /// Print the IPAddressPool CustomResourceDefinition (YAML).
    Crd {
        /// Write it to this file instead of standard output.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Handle only Services of this spec.loadBalancerClass.
    #[arg(long, value_name = "NAME")]
    lb_class: Option<String>,
    /// The namespace of the leader election Lease [default: the client's
    /// namespace: the pod's in a cluster].
    #[arg(long, value_name = "NS")]
    namespace_for_leases: Option<String>,
    /// The name of the leader election Lease (one per --lb-class).
    #[arg(long, value_name = "NAME", default_value = "kube-watcher")]
    lease_name: String,
    /// This replica's identity in the Lease [default: $POD_NAME, else the
    /// host name, with the process id].
    #[arg(long, value_name = "ID")]
    identity: Option<String>,
    /// Serve /metrics, /healthz and /readyz on this address.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:7472")]
    metrics_addr: SocketAddr,
    /// Whether Services with one MetalLB sharing key (allow-shared-ip) may
    /// share an address across namespaces freely (MetalLB's rule), or only
    /// when both carry Cilium's lbipam.cilium.io/sharing-cross-namespace
    /// naming the other's namespace (or `*`).
    #[arg(long, value_enum, value_name = "MODE", default_value = "allow")]
    sharing_across_namespaces: SharingMode,
    /// Write Cilium's cilium.io/IPAMRequestSatisfied condition on Services
    /// while a CiliumLoadBalancerIPPool exists.
    #[arg(long, value_enum, value_name = "ON_OFF", default_value = "on")]
    cilium_conditions: OnOff,
    /// How often (seconds) discovery is asked again whether the cluster
    /// serves CiliumLoadBalancerIPPools (or IPAddressPools), while it does
    /// not.
    #[arg(long, alias = "cilium-discovery-period", value_name = "SECONDS", default_value = "300",
          value_parser = clap::value_parser!(u64).range(1..))]
    discovery_period: u64,
}

/// `--sharing-across-namespaces`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum SharingMode {
    /// Any namespace (MetalLB's behaviour).
    Allow,
    /// Only namespaces both Services admit with Cilium's annotation.
    Annotated,
}

impl From<SharingMode> for SharingAcrossNamespaces {
    fn from(mode: SharingMode) -> Self {
        match mode {
            SharingMode::Allow => SharingAcrossNamespaces::Allow,
            SharingMode::Annotated => SharingAcrossNamespaces::Annotated,
        }
    }
}

/// `on` or `off`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(clap::Args)]
struct RecordArgs {
    /// The stream to write (`-` for standard output).
    #[arg(long, short, value_name = "FILE")]
    output: PathBuf,
    /// Stop after the SYNCED line instead of recording watch events until
    /// interrupted.
    #[arg(long)]
    list_only: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ansi = std::io::stderr().is_terminal();
    let subscriber =
        logging::subscriber(cli.log_format, ansi, logging::env_filter(), std::io::stderr);
    if let Err(error) = tracing::subscriber::set_global_default(subscriber) {
        eprintln!("kube-watcher: cannot set up logging: {error}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("kube-watcher: cannot start a tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kube-watcher: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Run(args) => run(args).await,
        Command::Record(args) => record_command(args).await,
        Command::Crd { output } => {
            let yaml = crd_yaml()?;
            match output {
                Some(path) => std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => std::io::stdout().write_all(yaml.as_bytes())?,
            }
            Ok(())
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for SIGTERM");
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "kube-watcher".to_owned());
    format!("{host}_{}", std::process::id())
}

async fn run(args: RunArgs) -> Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the cluster (kubeconfig or in-cluster)")?;
    let lease_namespace = args
        .namespace_for_leases
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let identity = args.identity.unwrap_or_else(default_identity);
    tracing::info!(%identity, %lease_namespace, lb_class = ?args.lb_class, "starting");
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("listening on {}", args.metrics_addr))?;
    let mut config = HostConfig::new(identity, lease_namespace)
        .lb_class(args.lb_class)
        .lease_name(args.lease_name);
    config.sharing_across_namespaces = args.sharing_across_namespaces.into();
    config.cilium_conditions = args.cilium_conditions == OnOff::On;
    config.discovery_period = std::time::Duration::from_secs(args.discovery_period);
    let host = Host::start(client, config);
    let cancel = CancellationToken::new();
    let server = tokio::spawn(serve(listener, host.metrics().clone(), cancel.clone()));
    shutdown_signal().await;
    tracing::info!("shutting down");
    cancel.cancel();
    host.shutdown().await;
    server.await.context("the metrics server failed")?;
    Ok(())
}

async fn record_command(args: RecordArgs) -> Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the cluster (kubeconfig or in-cluster)")?;
    let out: Box<dyn Write + Send> = if args.output.as_os_str() == "-" {
        Box::new(BufWriter::new(std::io::stdout()))
    } else {
        let file = File::create(&args.output)
            .with_context(|| format!("creating {}", args.output.display()))?;
        Box::new(BufWriter::new(file))
    };
    let stats = record(client, out, args.list_only, shutdown_signal()).await?;
    eprintln!(
        "kube-watcher: recorded {} objects{} and {} events",
        stats.listed,
        if stats.synced {
            ", SYNCED"
        } else {
            " (initial list incomplete)"
        },
        stats.events
    );
    Ok(())
}
