use std::process::ExitCode;

use tocsin_admin::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli: Cli = tocsin_web::config::parse_or_exit("tocsin-admin");
    let result = match cli.into_command() {
        Command::Serve(config) => {
            match tocsin_web::telemetry::init(config.common.log_format, "tocsin-admin") {
                Ok(telemetry) => {
                    let served =
                        async { tocsin_admin::build(config).await?.run_until_stopped().await }
                            .await;
                    telemetry.shutdown().await;
                    served
                }
                Err(error) => Err(error),
            }
        }
        // No tracing here: stdout carries only the command's output.
        Command::Token(args) => tocsin_admin::cli::run(args).await,
        Command::Key(args) => tocsin_admin::cli::keys(args).await,
        Command::Audit(args) => tocsin_admin::cli::audit(args).await,
        Command::Migrate(args) => tocsin_admin::cli::migrate(args).await,
        Command::Deliveries(args) => tocsin_admin::cli::deliveries(args).await,
        Command::Prune(args) => tocsin_admin::cli::prune(args).await,
        Command::Reshape(args) => tocsin_admin::cli::reshape(args).await,
        Command::Parked(args) => tocsin_admin::cli::parked(args).await,
    };
    tocsin_web::config::exit_code("tocsin-admin", result)
}
