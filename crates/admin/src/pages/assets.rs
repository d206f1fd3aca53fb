//! The pages' stylesheet and script, compiled into the binary and served from
//! `/settings/assets/` with a year-long cache: their URLs carry a hash of their content, so a
//! new build is fetched at once.

use std::sync::LazyLock;

use actix_web::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use actix_web::{web, HttpResponse};

const STYLESHEET: &str = include_str!("../../assets/settings.css");
const SCRIPT: &str = include_str!("../../assets/settings.js");

static VERSION: LazyLock<String> = LazyLock::new(|| {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(STYLESHEET.as_bytes());
    context.update(SCRIPT.as_bytes());
    context
        .finish()
        .as_ref()
        .iter()
        .take(6)
        .map(|byte| format!("{byte:02x}"))
        .collect()
});

/// The hash the asset URLs carry (`?v=...`).
pub fn version() -> &'static str {
    VERSION.as_str()
}

/// `GET /settings/assets/{file}`.
pub async fn serve(file: web::Path<String>) -> HttpResponse {
    let (content_type, body) = match file.as_str() {
        "settings.css" => ("text/css; charset=utf-8", STYLESHEET),
        "settings.js" => ("text/javascript; charset=utf-8", SCRIPT),
        _ => return HttpResponse::NotFound().finish(),
    };
    HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, content_type))
        .insert_header((CACHE_CONTROL, "public, max-age=31536000, immutable"))
        .body(body)
}
