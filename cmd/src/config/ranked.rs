//! Remotes in the plan's order, each found by name: [`Remotes`], a
//! persistent map, so that a value that holds them is copied for nothing
//! and changed for what changed, not for every remote.

use std::fmt;

use rpds::RedBlackTreeMapSync;

use super::remote::ResolvedRemote;
use crate::discovery::Place;

/// Where a remote stands in the plan's order: the static remotes in config
/// order, then the discovered ones by source (in config order) and Secret
/// name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    /// A static remote, by its place in the config.
    Static(usize),
    /// A discovered remote, by its source and Secret.
    Discovered(Place),
}

/// Remotes in [`Rank`] order, each found by name. A copy shares them (a
/// pointer's count); an insert or a removal costs O(log n).
#[derive(Clone)]
pub struct Remotes {
    by_rank: RedBlackTreeMapSync<Rank, ResolvedRemote>,
    rank_of: RedBlackTreeMapSync<String, Rank>,
}

impl Default for Remotes {
    fn default() -> Self {
        Self {
            by_rank: RedBlackTreeMapSync::new_sync(),
            rank_of: RedBlackTreeMapSync::new_sync(),
        }
    }
}

impl fmt::Debug for Remotes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Remotes {
    /// The remotes, in order.
    pub fn iter(&self) -> impl Iterator<Item = &ResolvedRemote> {
        self.by_rank.values()
    }

    /// How many there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rank_of.size()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rank_of.is_empty()
    }

    /// The remote named `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&ResolvedRemote> {
        self.by_rank.get(self.rank_of.get(name)?)
    }

    /// Where the remote named `name` stands.
    #[must_use]
    pub fn rank(&self, name: &str) -> Option<&Rank> {
        self.rank_of.get(name)
    }

    /// Puts `remote` at `rank`, in place of the remote of its name, and of
    /// the remote at that rank, if any: a rank holds one remote.
    pub fn insert(&mut self, rank: Rank, remote: ResolvedRemote) {
        if let Some(was) = self.rank_of.get(&remote.name)
            && *was != rank
        {
            let was = was.clone();
            self.by_rank.remove_mut(&was);
        }
        if let Some(other) = self.by_rank.get(&rank)
            && other.name != remote.name
        {
            let other = other.name.clone();
            self.rank_of.remove_mut(&other);
        }
        self.rank_of.insert_mut(remote.name.clone(), rank.clone());
        self.by_rank.insert_mut(rank, remote);
    }

    /// Takes out the remote named `name`; whether there was one.
    pub fn remove(&mut self, name: &str) -> bool {
        let Some(rank) = self.rank_of.get(name).cloned() else {
            return false;
        };
        self.rank_of.remove_mut(name);
        self.by_rank.remove_mut(&rank);
        true
    }
}

/// Static remotes, ranked in the order given.
impl FromIterator<ResolvedRemote> for Remotes {
    fn from_iter<I: IntoIterator<Item = ResolvedRemote>>(remotes: I) -> Self {
        let mut ranked = Self::default();
        for (index, remote) in remotes.into_iter().enumerate() {
            ranked.insert(Rank::Static(index), remote);
        }
        ranked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(name: &str) -> ResolvedRemote {
        ResolvedRemote::on(name, "h")
    }

    fn names(remotes: &Remotes) -> Vec<&str> {
        remotes.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn remotes_keep_their_rank_order_and_a_copy_keeps_what_it_had() {
        let mut remotes: Remotes = [remote("b"), remote("a")].into_iter().collect();
        remotes.insert(Rank::Discovered((0, "s2".to_owned())), remote("d2"));
        remotes.insert(Rank::Discovered((0, "s1".to_owned())), remote("d1"));
        assert_eq!(names(&remotes), ["b", "a", "d1", "d2"]);
        let copy = remotes.clone();
        // d2 moves to another Secret, earlier in order; a goes.
        remotes.insert(Rank::Discovered((0, "s0".to_owned())), remote("d2"));
        assert!(remotes.remove("a"));
        assert!(!remotes.remove("a"));
        assert_eq!(names(&remotes), ["b", "d2", "d1"]);
        assert_eq!(remotes.len(), 3);
        assert_eq!(remotes.get("d2").map(|r| r.name.as_str()), Some("d2"));
        assert!(remotes.get("a").is_none());
        assert_eq!(names(&copy), ["b", "a", "d1", "d2"]);
        // A rank holds one remote: d3 in d1's place takes it.
        remotes.insert(Rank::Discovered((0, "s1".to_owned())), remote("d3"));
        assert_eq!(names(&remotes), ["b", "d2", "d3"]);
        assert!(remotes.get("d1").is_none());
        assert_eq!(remotes.len(), 3);
    }
}
