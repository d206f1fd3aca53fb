use std::process::ExitCode;

use tocsin_dispatcher::Config;
use tocsin_web::config::run_service;

#[tokio::main]
async fn main() -> ExitCode {
    run_service(
        "tocsin-dispatcher",
        |config: &Config| config.common.log_format,
        |config| async {
            tocsin_dispatcher::build(config)
                .await?
                .run_until_stopped()
                .await
        },
    )
    .await
}
