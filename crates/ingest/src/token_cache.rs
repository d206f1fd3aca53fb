//! The token cache: what each live inbound token allows, remembered for a minute after the
//! database last gave it, so that a request with a token seen lately is not held up by a
//! lookup (docs/ingest.md, "Credentials"). A token's settings never change once it is made;
//! only its revocation does, and the statement or transaction that applies a body checks that
//! again (`AlertBody::token`), as a request whose body changes nothing confirms its token with
//! the database. A revoked token is thus refused on the next request, cached or not.
//!
//! Entries are keyed by the token's SHA-256, never by the token itself. Only tokens the
//! database found live are remembered: unknown tokens are looked up every time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tocsin_domain::AccessToken;
use tocsin_storage::tokens::LiveToken;

/// How long a token is remembered. A lookup writes the token's `last_used_at` when it is
/// older than a minute, so the lookup a minute after keeps that figure as fresh as before.
pub const FRESH_FOR: Duration = Duration::from_secs(60);
/// Past this many entries, an insertion first drops the stale ones.
const TIDY_ABOVE: usize = 1024;

pub struct TokenCache {
    fresh_for: Duration,
    entries: Mutex<HashMap<Vec<u8>, (LiveToken, Instant)>>,
}

impl TokenCache {
    pub fn new(fresh_for: Duration) -> TokenCache {
        TokenCache {
            fresh_for,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The live token remembered for `presented`, if it was found live within `fresh_for`.
    pub fn get(&self, presented: &AccessToken) -> Option<LiveToken> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(&presented.hash())
            .filter(|(_, found)| found.elapsed() < self.fresh_for)
            .map(|(token, _)| token.clone())
    }

    /// Remembers that the database found `presented` live, as `token`.
    pub fn insert(&self, presented: &AccessToken, token: LiveToken) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= TIDY_ABOVE {
            entries.retain(|_, (_, found)| found.elapsed() < self.fresh_for);
        }
        entries.insert(presented.hash(), (token, Instant::now()));
    }

    /// Forgets `presented` (it was found revoked).
    pub fn forget(&self, presented: &AccessToken) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.remove(&presented.hash());
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn live() -> LiveToken {
        LiveToken {
            id: Uuid::now_v7(),
            source: None,
            basic_auth: false,
            query_token: false,
            signing_secret: None,
            sns_signature: false,
        }
    }

    #[test]
    fn a_token_is_remembered_until_forgotten_and_only_itself() {
        let cache = TokenCache::new(FRESH_FOR);
        let (token, other) = (AccessToken::generate(), AccessToken::generate());
        assert!(cache.get(&token).is_none());
        let found = live();
        cache.insert(&token, found.clone());
        assert_eq!(cache.get(&token).map(|t| t.id), Some(found.id));
        assert!(cache.get(&other).is_none());
        cache.forget(&token);
        assert!(cache.get(&token).is_none());
    }

    #[test]
    fn a_token_is_looked_up_again_once_stale() {
        let cache = TokenCache::new(Duration::ZERO);
        let token = AccessToken::generate();
        cache.insert(&token, live());
        assert!(cache.get(&token).is_none());
    }

    #[test]
    fn stale_entries_are_dropped_as_the_cache_grows() {
        let cache = TokenCache::new(Duration::ZERO);
        for _ in 0..TIDY_ABOVE + 10 {
            cache.insert(&AccessToken::generate(), live());
        }
        let entries = cache.entries.lock().unwrap().len();
        assert!(entries <= TIDY_ABOVE, "{entries} entries");
    }
}
