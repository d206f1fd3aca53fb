use std::process::ExitCode;

use tocsin_ingest::Config;
use tocsin_web::config::run_service;

#[tokio::main]
async fn main() -> ExitCode {
    run_service(
        "tocsin-ingest",
        |config: &Config| config.common.log_format,
        |config| async {
            tocsin_ingest::build(config)
                .await?
                .run_until_stopped()
                .await
        },
    )
    .await
}
