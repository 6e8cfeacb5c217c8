//! The simulated applications' regions: FLASH's, NAMD's and Uintah's events, their nesting, kind, base time and
//! calls per round, and the names they are known by.

use super::*;

/// A base time for the generated filler events, spread by their id so they are not all alike.
pub(super) fn filler_base_us(id: u64) -> f64 {
    50.0 + (id % 450) as f64
}

#[derive(Default)]
pub(super) struct Names {
    pub(super) list: Vec<(u64, String)>,
    seen: HashSet<String>,
}

impl Names {
    pub(super) fn add(&mut self, name: &str) -> u64 {
        let id = event_id(name);
        if self.seen.insert(name.to_owned()) {
            self.list.push((id, name.to_owned()));
        }
        id
    }

    pub(super) fn slot(
        &mut self,
        name: &str,
        kind: Kind,
        base_us: f64,
        calls: u64,
        parent: Option<usize>,
    ) -> Slot {
        Slot {
            id: self.add(name),
            kind,
            base_us,
            calls,
            parent,
        }
    }
}

/// FLASH's regions: name, parent (index in this list), kind, base time, calls per round.
pub(super) const FLASH: [(&str, Option<usize>, Kind, f64, u64); 20] = [
    ("main_loop", None, Kind::Root, 200.0, 1),
    ("MPI_Allreduce", Some(0), Kind::Wait { spike: true }, 40.0, 4),
    ("hydro_sweep", Some(0), Kind::Compute, 1500.0, 3),
    ("guardcell_fill", Some(0), Kind::Compute, 300.0, 6),
    ("MPI_Isend", Some(3), Kind::Comm, 60.0, 24),
    ("MPI_Irecv", Some(3), Kind::Comm, 40.0, 24),
    ("MPI_Waitall", Some(3), Kind::Comm, 250.0, 6),
    ("riemann", Some(2), Kind::Compute, 2200.0, 3),
    ("eos", Some(2), Kind::Compute, 900.0, 6),
    ("update_solution", Some(2), Kind::Compute, 700.0, 3),
    ("timestep", Some(0), Kind::Compute, 150.0, 1),
    ("MPI_Bcast", Some(0), Kind::Comm, 30.0, 2),
    ("amr_refine", Some(0), Kind::Compute, 400.0, 1),
    ("MPI_Alltoall", Some(12), Kind::Comm, 120.0, 1),
    ("MPI_Allgather", Some(12), Kind::Comm, 60.0, 1),
    ("flux_correct", Some(2), Kind::Compute, 350.0, 3),
    ("MPI_Barrier", Some(0), Kind::Comm, 80.0, 1),
    ("MPI_Reduce", Some(0), Kind::Comm, 35.0, 1),
    ("gravity_solve", Some(0), Kind::Compute, 1200.0, 1),
    ("io_write_stats", Some(0), Kind::Compute, 90.0, 1),
];

pub(super) fn flash_plan(events: u32, names: &mut Names) -> Vec<Slot> {
    (0..events as usize)
        .map(|i| match FLASH.get(i) {
            Some(&(name, parent, kind, base, calls)) => names.slot(name, kind, base, calls, parent),
            None => {
                let name = format!("compute_{}", i - FLASH.len());
                let base = filler_base_us(event_id(&name));
                names.slot(&name, Kind::Compute, base, 1, Some(0))
            }
        })
        .collect()
}

/// NAMD's entry methods: name, base time, calls per round, share of the work that follows the overload.
pub(super) const NAMD: [(&str, f64, u64, f64); 18] = [
    ("ComputeNonbonded::doWork", 6000.0, 24, 1.0),
    ("ComputePme::ungridForces", 400.0, 2, 0.3),
    ("Sequencer::integrate", 300.0, 1, 0.3),
    ("PatchMgr::sendMigrationMsgs", 50.0, 1, 0.3),
    ("ProxyPatch::receiveData", 200.0, 16, 0.3),
    ("WorkDistrib::enqueueWork", 150.0, 24, 0.3),
    ("ComputeHomeTuples::doWork", 800.0, 4, 1.0),
    ("HomePatch::positionsReady", 250.0, 2, 0.3),
    ("ProxyMgr::recvProxyData", 120.0, 8, 0.3),
    ("ProxyMgr::recvResults", 150.0, 8, 0.3),
    ("HomePatch::receiveResults", 180.0, 8, 0.3),
    ("ComputePmeMgr::gridCalc2", 350.0, 1, 0.3),
    ("PmeZPencil::fft", 200.0, 1, 0.0),
    ("PmeYPencil::fft", 200.0, 1, 0.0),
    ("PmeXPencil::fft", 200.0, 1, 0.0),
    ("CollectionMgr::submitPositions", 40.0, 1, 0.0),
    ("ReductionMgr::remoteSubmit", 20.0, 2, 0.0),
    ("LdbCoordinator::nodeDone", 10.0, 1, 0.0),
];

pub(super) fn namd_plan(events: u32, names: &mut Names) -> Vec<Slot> {
    let mut plan: Vec<Slot> = (0..events as usize)
        .map(|i| match NAMD.get(i) {
            Some(&(name, base, calls, load)) => names.slot(name, Kind::Entry { load }, base, calls, None),
            None => {
                let name = format!("compute_{}", i - NAMD.len());
                let base = filler_base_us(event_id(&name));
                names.slot(&name, Kind::Entry { load: 0.5 }, base, 1, None)
            }
        })
        .collect();
    plan.push(names.slot("Idle", Kind::Idle, 0.0, 1, None));
    plan
}

pub(super) const UINTAH_PATCH0_US: f64 = 4000.0;
pub(super) const UINTAH_PATCH1_US: f64 = 300.0;
pub(super) const UINTAH_REGRID_US: f64 = 200.0;
pub(super) const UINTAH_REGRID_PATCH_US: f64 = 150.0;
pub(super) const UINTAH_L1_PATCHES: usize = 16;
pub(super) const UINTAH_LARGE_L1_PATCHES: u32 = 8;
/// Optional MPI calls; rank % 13 picks a distinct subset, hence 13 `MPI_` classes.
pub(super) const UINTAH_OPTIONAL_MPI: [(&str, f64, u64); 4] = [
    ("MPI_Reduce", 25.0, 1),
    ("MPI_Bcast", 20.0, 1),
    ("MPI_Wait", 40.0, 4),
    ("MPI_Iprobe", 10.0, 8),
];

/// The compute time of the busiest uintah rank at workload 1: everyone else waits for it in MPI_Waitall.
pub(super) fn uintah_envelope_us(tasks: u32) -> f64 {
    let large = UINTAH_PATCH0_US + f64::from(UINTAH_LARGE_L1_PATCHES) * UINTAH_PATCH1_US;
    let regrid = UINTAH_REGRID_US + UINTAH_L1_PATCHES as f64 * UINTAH_REGRID_PATCH_US;
    (large.max(regrid) + f64::from(tasks) * UINTAH_TASK_US) * SPEED_MAX
}

/// Uintah framework tasks that every rank runs each timestep.
pub(super) const UINTAH_TASKS: [&str; 16] = [
    "ICE::computeEquilibrationPressure",
    "ICE::computeVel_FC",
    "ICE::addExchangeToMomentumAndEnergy",
    "ICE::computeDelPressAndUpdatePressCC",
    "ICE::computePressFC",
    "ICE::accumulateMomentumSourceSinks",
    "ICE::accumulateEnergySourceSinks",
    "ICE::computeLagrangianValues",
    "ICE::advectAndAdvanceInTime",
    "ICE::conservedtoPrimitive_Vars",
    "MPM::interpolateParticlesToGrid",
    "MPM::computeStressTensor",
    "MPM::interpolateToParticlesAndUpdate",
    "Relocate::relocateParticles",
    "DataArchiver::output",
    "SchedulerCommon::copyDataToNewGrid",
];

pub(super) const UINTAH_TASK_US: f64 = 20.0;

pub(super) fn uintah_plan(rank: u32, total: u32, tasks: u32, names: &mut Names) -> Vec<Slot> {
    let mut plan = vec![
        names.slot("Scheduler::execute", Kind::Root, 300.0, 1, None),
        names.slot("MPI_Allreduce", Kind::Comm, 30.0, 2, Some(0)),
        names.slot("MPI_Isend", Kind::Comm, 80.0, 40, Some(0)),
        names.slot("MPI_Irecv", Kind::Comm, 60.0, 40, Some(0)),
        names.slot("MPI_Waitall", Kind::Wait { spike: false }, 50.0, 4, Some(0)),
    ];
    for k in 0..tasks as usize {
        let name = UINTAH_TASKS
            .get(k)
            .map_or_else(|| format!("Task {k}"), |n| n.to_string());
        plan.push(names.slot(&name, Kind::Compute, UINTAH_TASK_US, 1, Some(0)));
    }
    let mask = rank % 13;
    for (bit, &(name, base, calls)) in UINTAH_OPTIONAL_MPI.iter().enumerate() {
        if mask & (1 << bit) != 0 {
            plan.push(names.slot(name, Kind::Comm, base, calls, Some(0)));
        }
    }
    if rank == 0 {
        let regrid = plan.len();
        plan.push(names.slot("Regrid", Kind::Compute, UINTAH_REGRID_US, 1, Some(0)));
        for i in 0..UINTAH_L1_PATCHES {
            let name = format!("Patch 1 -> {i}");
            plan.push(names.slot(&name, Kind::Compute, UINTAH_REGRID_PATCH_US, 1, Some(regrid)));
        }
    } else {
        let name = format!("Patch 0 -> {rank}");
        plan.push(names.slot(&name, Kind::Compute, UINTAH_PATCH0_US, 12, Some(0)));
        if rank <= UINTAH_LARGE_L1_PATCHES && rank < total {
            for i in 0..UINTAH_LARGE_L1_PATCHES {
                let name = format!("Patch 1 -> {i}");
                plan.push(names.slot(&name, Kind::Compute, UINTAH_PATCH1_US, 3, Some(0)));
            }
        }
    }
    plan
}
