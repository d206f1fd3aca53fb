use std::process::ExitCode;

use tocsin_dispatcher::Config;

#[tokio::main]
async fn main() -> ExitCode {
    let config: Config = tocsin_web::config::parse_or_exit("tocsin-dispatcher");
    tocsin_web::config::init_tracing(config.common.log_format);
    let app = match tocsin_dispatcher::build(config).await {
        Ok(app) => app,
        Err(error) => {
            eprintln!("tocsin-dispatcher: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    match app.run_until_stopped().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tocsin-dispatcher: {error:#}");
            ExitCode::FAILURE
        }
    }
}
