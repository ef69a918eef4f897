//! Volumes in one zone and clients in several (CSI accessible topology): each client's node
//! plugin reports its zone, a zoned volume asks for its zone, and once quiet every allocation
//! ever placed for a job using a zoned volume must sit on a client of that zone. The check
//! reads the leader's state and the plan, not the scheduler it judges.

use std::collections::BTreeMap;

use drover_core::structs::{CsiTopology, CsiTopologyRequest, CsiVolume};
use drover_io_sim::cluster::SimCluster;
use drover_io_sim::trace::Recorder;

use crate::real_clients::{RealClientPlan, leader_state};

pub const NAME: &str = "consumers of a volume run only inside its accessible topology";

/// The segments client `index`'s node plugin reports (none without a zone).
pub fn segments(plan: &RealClientPlan, index: usize) -> BTreeMap<String, String> {
    match plan.zones.get(index) {
        Some(zone) if !zone.is_empty() => [("zone".to_string(), zone.clone())].into(),
        _ => BTreeMap::new(),
    }
}

/// `volume` asking for its zone, when the plan gives it one.
pub fn zoned(mut volume: CsiVolume, plan: &RealClientPlan) -> CsiVolume {
    if let Some(zone) = plan.volume_zones.get(&volume.id) {
        volume.requested_topologies = Some(CsiTopologyRequest {
            required: vec![CsiTopology {
                segments: [("zone".to_string(), zone.clone())].into(),
            }],
            preferred: Vec::new(),
        });
    }
    volume
}

/// Every placed allocation of a job on a zoned volume is on a client of the volume's zone.
pub fn check_placements(cluster: &SimCluster, recorder: &Recorder, plan: &RealClientPlan, leader: u64) {
    let Some(state) = leader_state(cluster, leader) else {
        recorder.violate(NAME, "the leader's state cannot be read".into());
        return;
    };
    let zone_of = |node_name: &str| {
        (0..plan.clients)
            .find(|index| format!("c{}", index + 1) == node_name)
            .and_then(|index| plan.zones.get(index).cloned())
            .unwrap_or_default()
    };
    let mut checked = 0;
    let mut outside = Vec::new();
    for job in &plan.jobs {
        let Some(zone) = job.volume.as_ref().and_then(|volume| plan.volume_zones.get(volume)) else {
            continue;
        };
        for alloc in state
            .allocs()
            .filter(|alloc| alloc.job_id == job.id && !alloc.node_id.is_empty())
        {
            checked += 1;
            let node = state
                .node(&alloc.node_id)
                .map(|node| node.name.clone())
                .unwrap_or_default();
            let placed_in = zone_of(&node);
            if placed_in != *zone {
                outside.push(format!(
                    "{} of {} on {node} (zone {placed_in:?}, volume zone {zone:?})",
                    alloc.id, job.id
                ));
            }
        }
    }
    recorder.checked(NAME, checked);
    if checked == 0 {
        recorder.violate(NAME, "no allocation of a zoned volume's job was ever placed".into());
    } else if !outside.is_empty() {
        recorder.violate(NAME, outside.join("; "));
    } else {
        recorder.note(format!(
            "{checked} placements of zoned volumes' jobs, all inside their zone"
        ));
    }
}
