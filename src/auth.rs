//! Client tokens and their grants: what a token looks like, how it is stored, and what it may do.
//!
//! Owns: the token format `rnv_<name>_<secret>`, the stored form (a random salt and the SHA-256
//! of salt and secret; the secret itself is never stored, replicated or logged), grants
//! (`read` / `publish` / `admin`, each scoped by a stream-name pattern) and the decision whether
//! a grant covers a request. Must never: keep, log or answer a token's secret after it was
//! shown once at creation, or compare a secret in a way that depends on where it first differs.
//!
//! The idea is etcd's and NATS's (users or accounts with per-key or per-subject permissions)
//! with bearer tokens as in RFC 6750. Tokens live in the replicated state (a Raft command), so
//! any node authenticates any token and a deleted token stops working on every node once the
//! delete is applied there.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Every token starts with this.
pub const TOKEN_PREFIX: &str = "rnv_";
/// Bytes of randomness in a token's secret (written as twice as many hex digits).
pub const SECRET_BYTES: usize = 32;
/// Bytes of a stored salt.
pub const SALT_BYTES: usize = 16;
/// Longest token name, in characters.
pub const TOKEN_NAME_CHARS_MAX: usize = 64;
/// Most grants one token may carry.
pub const GRANTS_MAX: usize = 64;
/// The name of the token made at a cluster's bootstrap (`--admin-token-file`).
pub const ADMIN_TOKEN_NAME: &str = "admin";

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Read, subscribe, stream info and the stream list, the cluster view, metrics.
    Read,
    /// Publish.
    Publish,
    /// Everything: streams, membership, tokens, and what `read` and `publish` allow.
    Admin,
}

impl std::str::FromStr for Permission {
    type Err = String;
    fn from_str(s: &str) -> Result<Permission, String> {
        match s {
            "read" => Ok(Permission::Read),
            "publish" => Ok(Permission::Publish),
            "admin" => Ok(Permission::Admin),
            _ => Err(format!("{s:?} is not a permission (read, publish or admin)")),
        }
    }
}

/// A permission on the streams a pattern matches: `*` (every stream), `orders.*` (every name
/// starting with `orders.`), or one exact stream name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Grant {
    /// What it allows.
    pub permission: Permission,
    /// Which streams: `*`, a stream name, or a name's beginning followed by `*`.
    #[schema(pattern = r"^(\*|[A-Za-z0-9._-]{1,128}\*?)$")]
    pub streams: String,
}

impl std::str::FromStr for Grant {
    type Err = String;
    /// `PERMISSION:PATTERN`, as the CLI's `--grant publish:orders.*` gives it.
    fn from_str(s: &str) -> Result<Grant, String> {
        let (p, streams) = s.split_once(':').ok_or_else(|| format!("{s:?} is not PERMISSION:PATTERN"))?;
        let grant = Grant { permission: p.parse()?, streams: streams.to_string() };
        grant.validate()?;
        Ok(grant)
    }
}

/// What a request acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// One stream.
    Stream(&'a str),
    /// Something every holder of the permission may do whatever its streams (list streams,
    /// the cluster view, metrics).
    Any,
    /// The whole cluster (membership, tokens): only a grant on `*` covers it.
    Cluster,
}

impl Grant {
    /// Checks the pattern: `*`, a stream name, or a stream name's prefix followed by `*`.
    ///
    /// Errors: a text saying what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let p = self.streams.as_str();
        if p == "*" {
            return Ok(());
        }
        let stem = p.strip_suffix('*').unwrap_or(p);
        let ok = !stem.is_empty()
            && stem.len() <= crate::limits::STREAM_NAME_CHARS_MAX
            && stem.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok {
            Ok(())
        } else {
            Err(format!("{p:?} is not a stream pattern: `*`, a stream name, or a name's beginning followed by `*`"))
        }
    }

    /// Whether this grant allows `need` on `scope`. `admin` allows every permission.
    pub fn allows(&self, need: Permission, scope: Scope<'_>) -> bool {
        if self.permission != Permission::Admin && self.permission != need {
            return false;
        }
        match scope {
            Scope::Any => true,
            Scope::Cluster => self.streams == "*",
            Scope::Stream(name) => pattern_matches(&self.streams, name),
        }
    }
}

/// Whether stream `name` matches `pattern` (see [`Grant`]).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Checks a token name: 1 to [`TOKEN_NAME_CHARS_MAX`] characters of `[A-Za-z0-9.-]` (no `_`,
/// which separates the parts of a token).
///
/// Errors: a text saying what is wrong.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= TOKEN_NAME_CHARS_MAX
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a token name: 1 to {TOKEN_NAME_CHARS_MAX} characters of A-Z a-z 0-9 . -"))
    }
}

/// A token as stored in the replicated state: salt, SHA-256 of salt and secret, grants.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// [`SALT_BYTES`] random bytes.
    #[serde(with = "serde_bytes")]
    pub salt: Vec<u8>,
    /// SHA-256 of the salt followed by the secret's text.
    #[serde(with = "serde_bytes")]
    pub hash: Vec<u8>,
    /// What the token may do.
    pub grants: Vec<Grant>,
}

impl std::fmt::Debug for TokenRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRecord").field("grants", &self.grants).finish_non_exhaustive()
    }
}

/// SHA-256 of `salt` then `secret`.
fn digest(salt: &[u8], secret: &str) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(secret.as_bytes());
    h.finalize().to_vec()
}

/// Equality in time that depends only on the lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl TokenRecord {
    /// The record of `secret` with a fresh random salt.
    ///
    /// Errors: the operating system's random source failed.
    pub fn new(secret: &str, grants: Vec<Grant>) -> Result<TokenRecord, getrandom::Error> {
        let mut salt = vec![0u8; SALT_BYTES];
        getrandom::fill(&mut salt)?;
        let hash = digest(&salt, secret);
        Ok(TokenRecord { salt, hash, grants })
    }

    /// Whether `secret` is this token's.
    pub fn verifies(&self, secret: &str) -> bool {
        same(&digest(&self.salt, secret), &self.hash)
    }

    /// Whether any grant allows `need` on `scope`.
    pub fn allows(&self, need: Permission, scope: Scope<'_>) -> bool {
        self.grants.iter().any(|g| g.allows(need, scope))
    }
}

/// A token's text, `rnv_<name>_<secret>`. Its `Debug` shows the name only.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({}…)", self.parts().map_or("?", |(n, _)| n))
    }
}

impl Token {
    /// A new token named `name` with a fresh secret of [`SECRET_BYTES`] random bytes.
    ///
    /// Errors: the operating system's random source failed.
    pub fn generate(name: &str) -> Result<Token, getrandom::Error> {
        let mut secret = [0u8; SECRET_BYTES];
        getrandom::fill(&mut secret)?;
        let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Token(format!("{TOKEN_PREFIX}{name}_{hex}")))
    }

    /// Reads a token's text (surrounding white space ignored).
    ///
    /// Errors: it is not `rnv_<name>_<secret>` with a valid name and a non-empty secret.
    pub fn parse(text: &str) -> Result<Token, String> {
        let token = Token(text.trim().to_string());
        match token.parts() {
            Some(_) => Ok(token),
            None => Err("not a Runnev token (rnv_<name>_<secret>)".into()),
        }
    }

    /// The name and the secret.
    pub fn parts(&self) -> Option<(&str, &str)> {
        let rest = self.0.strip_prefix(TOKEN_PREFIX)?;
        let (name, secret) = rest.split_once('_')?;
        (validate_name(name).is_ok() && !secret.is_empty()).then_some((name, secret))
    }

    /// The whole text, for an `Authorization: Bearer` header or a file.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_cover_their_streams_and_permission() {
        let g: Grant = "publish:orders.*".parse().unwrap();
        assert!(g.allows(Permission::Publish, Scope::Stream("orders.eu")));
        assert!(!g.allows(Permission::Publish, Scope::Stream("billing")));
        assert!(!g.allows(Permission::Read, Scope::Stream("orders.eu")));
        assert!(!g.allows(Permission::Publish, Scope::Cluster));
        let admin: Grant = "admin:*".parse().unwrap();
        assert!(
            admin.allows(Permission::Read, Scope::Cluster) && admin.allows(Permission::Publish, Scope::Stream("x"))
        );
        let exact: Grant = "read:t1".parse().unwrap();
        assert!(
            exact.allows(Permission::Read, Scope::Stream("t1"))
                && !exact.allows(Permission::Read, Scope::Stream("t10"))
        );
        assert!("read:".parse::<Grant>().is_err());
        assert!("read:a*b".parse::<Grant>().is_err());
        assert!("write:*".parse::<Grant>().is_err());
    }

    #[test]
    fn tokens_round_trip_and_verify_only_their_secret() {
        let t = Token::generate("ci-bot").unwrap();
        let (name, secret) = t.parts().unwrap();
        assert_eq!(name, "ci-bot");
        assert_eq!(secret.len(), 2 * SECRET_BYTES);
        let rec = TokenRecord::new(secret, vec![]).unwrap();
        assert!(rec.verifies(secret));
        assert!(!rec.verifies(&secret[1..]));
        assert!(!format!("{rec:?}{t:?}").contains(secret), "Debug never shows a secret");
        let stored = postcard::to_stdvec(&rec).unwrap();
        assert!(!stored.windows(secret.len()).any(|w| w == secret.as_bytes()));
        assert_eq!(Token::parse(&format!(" {} ", t.expose())).unwrap(), t);
        assert!(Token::parse("rnv_bad_").is_err() && Token::parse("rnv__x").is_err() && Token::parse("abc").is_err());
    }
}
