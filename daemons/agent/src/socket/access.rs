//! Who may use the agent's socket: the users the agent serves, checked on every connection with the peer's
//! credentials (SO_PEERCRED), and the group the socket belongs to. The file modes keep other users from reaching
//! the socket; this check holds even for those the modes let through (root, a member of the socket's group that is
//! not allowed).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use nix::unistd::{Gid, Group, Uid, User};

/// Why an access setting cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("no user named {0:?}")]
    NoUser(String),
    #[error("no group named {0:?}")]
    NoGroup(String),
    #[error("cannot look up {0:?}: {1}")]
    Lookup(String, String),
}

/// A group whose members may connect: its id, its name, and the users its entry lists.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AllowedGroup {
    gid: u32,
    name: String,
    members: BTreeSet<u32>,
}

/// Who may use the socket, and the group it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// The agent's own user: always allowed.
    own: u32,
    users: BTreeSet<u32>,
    groups: Vec<AllowedGroup>,
    /// The socket's group (mode 0660) and that of a directory the agent makes for it (mode 0710); `None`: the
    /// socket is 0600 and its directory 0700.
    group: Option<(u32, String)>,
}

impl Default for Access {
    /// The agent's own user only, a socket of mode 0600.
    fn default() -> Self {
        Access {
            own: Uid::effective().as_raw(),
            users: BTreeSet::new(),
            groups: Vec::new(),
            group: None,
        }
    }
}

fn lookup_user(entry: &str) -> Result<u32, AccessError> {
    if let Ok(uid) = entry.parse::<u32>() {
        return Ok(uid);
    }
    match User::from_name(entry) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => Err(AccessError::NoUser(entry.to_string())),
        Err(e) => Err(AccessError::Lookup(entry.to_string(), e.to_string())),
    }
}

fn lookup_group(entry: &str) -> Result<AllowedGroup, AccessError> {
    let found = match entry.parse::<u32>() {
        Ok(gid) => Group::from_gid(Gid::from_raw(gid)).map(|g| (gid, g)),
        Err(_) => Group::from_name(entry).map(|g| (g.as_ref().map_or(0, |g| g.gid.as_raw()), g)),
    };
    let (gid, group) = found.map_err(|e| AccessError::Lookup(entry.to_string(), e.to_string()))?;
    let Some(group) = group else {
        // A numeric group with no entry still names a group: its id is what the kernel checks.
        return match entry.parse::<u32>() {
            Ok(gid) => Ok(AllowedGroup {
                gid,
                name: gid.to_string(),
                members: BTreeSet::new(),
            }),
            Err(_) => Err(AccessError::NoGroup(entry.to_string())),
        };
    };
    // Members are resolved once, at start: the group's entry as it is when the agent starts.
    let members = group
        .mem
        .iter()
        .filter_map(|name| User::from_name(name).ok().flatten())
        .map(|u| u.uid.as_raw())
        .collect();
    Ok(AllowedGroup {
        gid,
        name: group.name,
        members,
    })
}

impl Access {
    /// From the agent's configuration: `allowed_users` names users (a name or a uid) and groups (`@name` or
    /// `@gid`: every member); empty, the agent's own user and, with a `socket_group`, that group's members.
    /// `socket_group` (empty: none) is the socket's group.
    pub fn from_config(allowed_users: &[String], socket_group: &str) -> Result<Access, AccessError> {
        let mut access = Access::default();
        let socket_group = socket_group.trim();
        if !socket_group.is_empty() {
            let g = lookup_group(socket_group)?;
            access.group = Some((g.gid, g.name.clone()));
            if allowed_users.is_empty() {
                access.groups.push(g);
            }
        }
        for entry in allowed_users.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            match entry.strip_prefix('@') {
                Some(group) => access.groups.push(lookup_group(group)?),
                None => {
                    access.users.insert(lookup_user(entry)?);
                }
            }
        }
        Ok(access)
    }

    /// The socket's group, if one is configured.
    pub fn socket_group(&self) -> Option<u32> {
        self.group.as_ref().map(|(gid, _)| *gid)
    }

    /// Whether a peer running as `uid` with group `gid` may use the socket: the agent's own user, a user listed,
    /// or a member of a group listed (by the peer's group, or by the group's entry).
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        uid == self.own
            || self.users.contains(&uid)
            || self
                .groups
                .iter()
                .any(|g| g.gid == gid || g.members.contains(&uid))
    }

    /// Who is allowed, for messages: `uid 0, members of group nogroup (65534)`.
    pub fn describe(&self) -> String {
        let mut out = format!("uid {}", self.own);
        for uid in self.users.iter().filter(|u| **u != self.own) {
            let _ = write!(out, ", uid {uid}");
        }
        for g in &self.groups {
            let _ = write!(out, ", members of group {} ({})", g.name, g.gid);
        }
        out
    }

    /// The refusal of a peer, or `None` if it may connect.
    pub fn check(&self, uid: u32, gid: u32, pid: Option<i32>) -> Option<String> {
        if self.allows(uid, gid) {
            return None;
        }
        let pid = pid.map_or_else(|| "unknown".to_string(), |p| p.to_string());
        Some(format!(
            "uid {uid} (pid {pid}) may not use this agent's socket (allowed: {})",
            self.describe()
        ))
    }
}

/// Refusals logged at most once a second, each line saying how many were not logged since the last one (a
/// stranger that reconnects in a loop must not fill the log).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_allows_the_agents_own_user_only() {
        let a = Access::default();
        let me = Uid::effective().as_raw();
        assert!(a.allows(me, 12345));
        let other = if me == 65534 { 65533 } else { 65534 };
        assert_eq!(
            a.check(other, other, Some(42)).as_deref(),
            Some(
                format!("uid {other} (pid 42) may not use this agent's socket (allowed: uid {me})").as_str()
            )
        );
        assert_eq!(a.socket_group(), None);
    }

    #[test]
    fn users_and_groups_are_named_or_numbered() {
        let a = Access::from_config(&["root".into(), "4242".into(), "@nogroup".into()], "").unwrap();
        assert!(a.allows(0, 7) && a.allows(4242, 7));
        assert!(a.allows(5000, 65534), "the peer's group is allowed");
        assert!(!a.allows(5000, 5000));
        assert!(
            a.describe().contains("members of group nogroup (65534)"),
            "{}",
            a.describe()
        );
        assert_eq!(
            Access::from_config(&["no-such-user-here".into()], ""),
            Err(AccessError::NoUser("no-such-user-here".into()))
        );
        assert_eq!(
            Access::from_config(&[], "no-such-group-here"),
            Err(AccessError::NoGroup("no-such-group-here".into()))
        );
    }

    #[test]
    fn a_socket_group_lets_its_members_in_unless_users_are_listed() {
        let a = Access::from_config(&[], "nogroup").unwrap();
        assert_eq!(a.socket_group(), Some(65534));
        assert!(a.allows(5000, 65534));
        let listed = Access::from_config(&["4242".into()], "nogroup").unwrap();
        assert_eq!(listed.socket_group(), Some(65534));
        assert!(!listed.allows(5000, 65534), "only those listed");
    }
}
