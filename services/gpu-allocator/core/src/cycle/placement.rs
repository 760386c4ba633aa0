//! Placement: choosing concrete nodes for every worker of a gang.
//!
//! Pure functions over candidate nodes (node, usable units, zone, rack), so
//! the admission path, reservations and what-if preemption searches all use
//! the same rules:
//! - one worker: best fit, the node with the fewest usable units that still
//!   fits, so whole nodes stay free for big gangs;
//! - a gang: one node if one can host it all, else the tightest single rack
//!   (NVLink domain), else the tightest single zone, else spread over as few
//!   zones and racks as possible; inside the chosen domain, best fit again;
//! - a gang whose workers must not share a node (`oneWorkerPerNode`, from a
//!   required pod anti-affinity between them) counts one worker a node.

use std::collections::BTreeMap;

use crate::ids::{FastMap, LabelId, NodeIdx, RackIdx, ZoneIdx};
use crate::state::jobs::Gang;
use crate::types::TopologyRequirement;

/// A node that could host at least one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) node: NodeIdx,
    /// Units this job may use on the node (free minus reservations).
    pub(crate) usable: u32,
    /// Interned zone, `ZoneIdx::ABSENT` when unlabeled.
    pub(crate) zone: ZoneIdx,
    /// Interned rack / NVLink domain, `RackIdx::ABSENT` when unlabeled.
    pub(crate) rack: RackIdx,
}

/// Free units, zone and rack of each eligible node, by node index: searches
/// look nodes up in their innermost loops, where a dense table beats
/// hashing (and building it is one pass without inserts).
pub(crate) struct NodeTable(Vec<Option<(u32, ZoneIdx, RackIdx)>>);

impl NodeTable {
    /// A table for `nodes` nodes, none eligible yet.
    pub(crate) fn new(nodes: usize) -> Self {
        NodeTable(vec![None; nodes])
    }

    pub(crate) fn set(&mut self, node: NodeIdx, entry: (u32, ZoneIdx, RackIdx)) {
        if let Some(slot) = self.0.get_mut(node.slot()) {
            *slot = Some(entry);
        }
    }

    pub(crate) fn get(&self, node: &NodeIdx) -> Option<&(u32, ZoneIdx, RackIdx)> {
        self.0.get(node.slot()).and_then(Option::as_ref)
    }

    pub(crate) fn get_mut(&mut self, node: &NodeIdx) -> Option<&mut (u32, ZoneIdx, RackIdx)> {
        self.0.get_mut(node.slot()).and_then(Option::as_mut)
    }

    /// Eligible nodes by index, with their entries.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (NodeIdx, &(u32, ZoneIdx, RackIdx))> {
        NodeIdx::enumerate(&self.0).filter_map(|(node, entry)| Some((node, entry.as_ref()?)))
    }
}

/// Workers per node in a placement.
pub(crate) type Assignment = Vec<(NodeIdx, u32)>;

/// Takes workers from `ordered` nodes until the gang is complete.
fn fill<'a>(ordered: impl Iterator<Item = &'a Candidate>, gang: Gang) -> Option<Assignment> {
    let mut left = u64::from(gang.workers);
    let mut out = Vec::new();
    for c in ordered {
        if left == 0 {
            break;
        }
        let take = gang.slots(c.usable).min(left);
        if take > 0 {
            out.push((c.node, u32::try_from(take).unwrap_or(u32::MAX)));
            left -= take;
        }
    }
    (left == 0).then_some(out)
}

/// Best fit for a single worker: fewest usable units, then lowest node index.
pub(crate) fn place_single(per_worker: u32, candidates: &[Candidate]) -> Option<Assignment> {
    candidates
        .iter()
        .filter(|c| c.usable >= per_worker)
        .min_by_key(|c| (c.usable, c.node))
        .map(|c| vec![(c.node, 1)])
}

/// The most workers of `gang` that nodes (units, zone, rack) could host as
/// its topology requires: all of them together if the gang may spread, else
/// the roomiest single zone, rack or node (an unlabeled node counts alone). What a
/// capacity reason reports for a gang that does not fit.
pub(crate) fn most_placeable(
    gang: Gang,
    nodes: impl IntoIterator<Item = (u32, ZoneIdx, RackIdx)>,
) -> u64 {
    let mut roomiest = RoomiestDomain::new(gang.topology);
    for (units, zone, rack) in nodes {
        let s = gang.slots(units);
        roomiest.add((zone, rack), s, s);
    }
    roomiest.slots()
}

/// Worker slots of the roomiest domain a gang's topology allows, kept as
/// nodes gain units: all nodes together for a gang that may spread, else
/// one zone, rack or node.
pub(crate) struct RoomiestDomain {
    topology: TopologyRequirement,
    by_domain: FastMap<u32, u64>,
    roomiest: u64,
}

impl RoomiestDomain {
    pub(crate) fn new(topology: TopologyRequirement) -> Self {
        RoomiestDomain {
            topology,
            by_domain: FastMap::default(),
            roomiest: 0,
        }
    }

    /// A node of `(zone, rack)` gained `gained` slots and now has `now`.
    pub(crate) fn add(&mut self, (zone, rack): (ZoneIdx, RackIdx), gained: u64, now: u64) {
        // One kind of domain per gang: the zone's or the rack's number, 0
        // for a node alone.
        let domain = match self.topology {
            TopologyRequirement::Preferred => {
                self.roomiest += gained;
                return;
            }
            TopologyRequirement::SameZone => zone.number(),
            TopologyRequirement::SameRack => rack.number(),
            TopologyRequirement::SameNode => 0,
        };
        let slots = if domain == 0 {
            now
        } else {
            let slots = self.by_domain.entry(domain).or_default();
            *slots += gained;
            *slots
        };
        self.roomiest = self.roomiest.max(slots);
    }

    pub(crate) fn slots(&self) -> u64 {
        self.roomiest
    }
}

/// Places every worker of `gang` on `candidates`, or returns `None` when
/// they do not fit (all-or-nothing).
pub(crate) fn place_gang(gang: Gang, candidates: &[Candidate]) -> Option<Assignment> {
    let Gang {
        per_worker,
        workers,
        topology,
        ..
    } = gang;
    if workers == 0 || per_worker == 0 {
        return None;
    }
    if workers == 1 {
        return place_single(per_worker, candidates);
    }
    let need = u64::from(workers);
    let total: u64 = candidates.iter().map(|c| gang.slots(c.usable)).sum();
    if total < need {
        return None;
    }
    // One node for the whole gang: no cross-node traffic at all.
    if let Some(c) = candidates
        .iter()
        .filter(|c| gang.slots(c.usable) >= need)
        .min_by_key(|c| (c.usable, c.node))
    {
        return Some(vec![(c.node, workers)]);
    }
    if topology == TopologyRequirement::SameNode {
        return None;
    }

    let mut rack_slots: BTreeMap<RackIdx, u64> = BTreeMap::new();
    let mut zone_slots: BTreeMap<ZoneIdx, u64> = BTreeMap::new();
    for c in candidates {
        let s = gang.slots(c.usable);
        *rack_slots.entry(c.rack).or_default() += s;
        *zone_slots.entry(c.zone).or_default() += s;
    }

    // Tightest rack that fits the gang: keeps roomier racks for bigger gangs.
    let best_rack = rack_slots
        .iter()
        .filter(|(rack, s)| !rack.is_absent() && **s >= need)
        .min_by_key(|(rack, s)| (**s, **rack))
        .map(|(rack, _)| *rack);
    if let Some(rack) = best_rack {
        let mut in_rack: Vec<&Candidate> = candidates.iter().filter(|c| c.rack == rack).collect();
        in_rack.sort_by_key(|c| (c.usable, c.node));
        return fill(in_rack.into_iter(), gang);
    }
    if topology == TopologyRequirement::SameRack {
        return None;
    }

    let rack_key = |c: &Candidate| std::cmp::Reverse(rack_slots.get(&c.rack).copied().unwrap_or(0));
    let best_zone = zone_slots
        .iter()
        .filter(|(zone, s)| !zone.is_absent() && **s >= need)
        .min_by_key(|(zone, s)| (**s, **zone))
        .map(|(zone, _)| *zone);
    if let Some(zone) = best_zone {
        // Inside the zone, span as few racks as possible: roomiest racks first.
        let mut in_zone: Vec<&Candidate> = candidates.iter().filter(|c| c.zone == zone).collect();
        // Cached: a rack's slots are a map lookup, once per node, not per comparison.
        in_zone.sort_by_cached_key(|c| (rack_key(c), c.rack, c.usable, c.node));
        return fill(in_zone.into_iter(), gang);
    }
    if topology == TopologyRequirement::SameZone {
        return None;
    }

    let zone_key = |c: &Candidate| std::cmp::Reverse(zone_slots.get(&c.zone).copied().unwrap_or(0));
    let mut all: Vec<&Candidate> = candidates.iter().collect();
    all.sort_by_cached_key(|c| (zone_key(c), c.zone, rack_key(c), c.rack, c.usable, c.node));
    fill(all.into_iter(), gang)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::CpuMemory;

    fn gang(per_worker: u32, workers: u32, topology: TopologyRequirement) -> Gang {
        Gang {
            per_worker,
            workers,
            topology,
            one_per_node: false,
            cpu_memory: CpuMemory::default(),
        }
    }

    /// A placement of (node, workers) pairs.
    fn on(placement: &[(u32, u32)]) -> Option<Vec<(NodeIdx, u32)>> {
        Some(placement.iter().map(|&(n, w)| (n.into(), w)).collect())
    }

    /// Nodes as (units, zone, rack), zones and racks by number.
    fn labelled<const N: usize>(nodes: [(u32, u32, u32); N]) -> [(u32, ZoneIdx, RackIdx); N] {
        nodes.map(|(units, zone, rack)| (units, zone.into(), rack.into()))
    }

    fn c(node: u32, usable: u32, zone: u32, rack: u32) -> Candidate {
        Candidate {
            node: node.into(),
            usable,
            zone: zone.into(),
            rack: rack.into(),
        }
    }

    #[test]
    fn single_worker_takes_the_tightest_node() {
        let cands = [c(0, 8, 1, 1), c(1, 2, 1, 1), c(2, 4, 1, 1)];
        assert_eq!(place_single(2, &cands), on(&[(1, 1)]));
        assert_eq!(place_single(3, &cands), on(&[(2, 1)]));
        assert_eq!(place_single(9, &cands), None);
    }

    #[test]
    fn gang_prefers_one_node_then_one_rack() {
        let cands = [c(0, 8, 1, 1), c(1, 4, 1, 2), c(2, 4, 1, 2)];
        // 2 workers x 4 fit on node 0 alone.
        assert_eq!(
            place_gang(gang(4, 2, TopologyRequirement::Preferred), &cands),
            on(&[(0, 2)])
        );
        // 3 workers x 4: no single node; rack 2 holds 2, rack 1 holds 2: zone 1 fits.
        let placed =
            place_gang(gang(4, 3, TopologyRequirement::Preferred), &cands).expect("fits in zone");
        assert_eq!(placed.iter().map(|(_, w)| w).sum::<u32>(), 3);
        assert_eq!(
            place_gang(gang(4, 3, TopologyRequirement::SameRack), &cands),
            None
        );
        assert!(place_gang(gang(4, 3, TopologyRequirement::SameZone), &cands).is_some());
    }

    #[test]
    fn a_gang_kept_on_one_node_takes_the_tightest_node_that_holds_it_all() {
        let cands = [c(0, 8, 1, 1), c(1, 6, 1, 1), c(2, 4, 1, 2), c(3, 4, 1, 2)];
        let together =
            |per_worker, workers| gang(per_worker, workers, TopologyRequirement::SameNode);
        assert_eq!(place_gang(together(2, 3), &cands), on(&[(1, 3)]));
        assert_eq!(place_gang(together(2, 4), &cands), on(&[(0, 4)]));
        // 3 x 4 fits spread over nodes 0 and 2, never on one node.
        assert!(place_gang(gang(4, 3, TopologyRequirement::Preferred), &cands).is_some());
        assert_eq!(place_gang(together(4, 3), &cands), None);
        // Kept apart as well, more than one worker fits nowhere.
        let apart = Gang {
            one_per_node: true,
            ..together(1, 2)
        };
        assert_eq!(place_gang(apart, &cands), None);
    }

    #[test]
    fn gang_picks_tightest_rack_and_never_splits_a_worker() {
        // Rack 1 has 4 free 8-GPU nodes, rack 2 exactly 2: a 2x8 gang goes to rack 2.
        let cands = [
            c(0, 8, 1, 1),
            c(1, 8, 1, 1),
            c(2, 8, 1, 1),
            c(3, 8, 1, 1),
            c(4, 8, 1, 2),
            c(5, 8, 1, 2),
        ];
        assert_eq!(
            place_gang(gang(8, 2, TopologyRequirement::Preferred), &cands),
            on(&[(4, 1), (5, 1)])
        );
        // 7 free units on each of two nodes cannot host two 8-unit workers.
        let frag = [c(0, 7, 1, 1), c(1, 7, 1, 1)];
        assert_eq!(
            place_gang(gang(8, 1, TopologyRequirement::Preferred), &frag),
            None
        );
        assert_eq!(
            place_gang(gang(4, 2, TopologyRequirement::Preferred), &frag),
            on(&[(0, 1), (1, 1)])
        );
    }

    #[test]
    fn most_placeable_counts_the_roomiest_domain_a_gang_must_stay_in() {
        // (units, zone, rack): racks 1 and 2 in zone 1, rack 3 in zone 2,
        // and an unlabeled node.
        let nodes = labelled([(8, 1, 1), (8, 1, 1), (8, 1, 2), (4, 2, 3), (8, 0, 0)]);
        let most = |topology| most_placeable(gang(4, 0, topology), nodes);
        assert_eq!(most(TopologyRequirement::Preferred), 9);
        assert_eq!(most(TopologyRequirement::SameZone), 6);
        assert_eq!(most(TopologyRequirement::SameRack), 4);
        assert_eq!(most(TopologyRequirement::SameNode), 2);
        assert_eq!(
            most_placeable(
                gang(8, 0, TopologyRequirement::SameRack),
                labelled([(8, 0, 0)])
            ),
            1
        );
    }

    #[test]
    fn workers_that_must_not_share_a_node_take_one_node_each() {
        // Node 0 alone could host both workers.
        let cands = [c(0, 8, 1, 1), c(1, 4, 1, 1), c(2, 4, 1, 2)];
        let apart = Gang {
            one_per_node: true,
            ..gang(4, 2, TopologyRequirement::Preferred)
        };
        assert_eq!(place_gang(apart, &cands), on(&[(1, 1), (0, 1)]));
        let three = Gang {
            workers: 3,
            ..apart
        };
        let placed = place_gang(three, &cands).expect("three nodes");
        assert_eq!(placed.len(), 3);
        assert!(placed.iter().all(|(_, w)| *w == 1));
        assert_eq!(
            place_gang(
                Gang {
                    workers: 4,
                    ..apart
                },
                &cands
            ),
            None
        );
        assert_eq!(
            most_placeable(apart, cands.iter().map(|c| (c.usable, c.zone, c.rack))),
            3
        );
        assert_eq!(
            most_placeable(
                Gang {
                    topology: TopologyRequirement::SameRack,
                    ..apart
                },
                labelled([(8, 1, 1), (8, 1, 1), (16, 1, 2)])
            ),
            2
        );
    }

    #[test]
    fn gang_spreads_across_zones_only_when_allowed() {
        let cands = [c(0, 8, 1, 1), c(1, 8, 2, 2)];
        assert_eq!(
            place_gang(gang(8, 2, TopologyRequirement::SameZone), &cands),
            None
        );
        let spread =
            place_gang(gang(8, 2, TopologyRequirement::Preferred), &cands).expect("spread");
        assert_eq!(spread.len(), 2);
    }
}
