//! The roles of admin keys: what a person or a script may do through the admin API, the
//! settings pages and the CLI. Each role allows everything the one before it does.

use std::fmt;
use std::str::FromStr;

/// A role, from the least to the most powerful.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Reads webhooks (never their secrets), the delivery log, incidents, tokens' names, the
    /// audit log.
    Viewer,
    /// Also retries deliveries, replays and recovers, sends test events, changes an
    /// incident's status.
    Operator,
    /// Everything: webhooks' create, change and delete, revealing and rotating secrets,
    /// inbound tokens, admin keys.
    Admin,
}

/// The text is not a role's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be one of viewer, operator, admin")]
pub struct InvalidRole;

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// Whether a holder of this role may do what `needed` is required for.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

impl FromStr for Role {
    type Err = InvalidRole;
    fn from_str(text: &str) -> Result<Self, InvalidRole> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == text)
            .ok_or(InvalidRole)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_allows_what_the_ones_before_it_do() {
        assert!(Role::Admin.allows(Role::Operator) && Role::Admin.allows(Role::Viewer));
        assert!(Role::Operator.allows(Role::Viewer) && !Role::Operator.allows(Role::Admin));
        assert!(!Role::Viewer.allows(Role::Operator));
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert_eq!("Admin".parse::<Role>(), Err(InvalidRole));
    }
}
