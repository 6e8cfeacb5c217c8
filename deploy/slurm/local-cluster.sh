#!/bin/bash
# A real Slurm cluster of four nodes on this one machine, for trying canopy-run and for its test.
#
#   deploy/slurm/local-cluster.sh start DIR    # munged, slurmctld and slurmd for node1..node4; prints SLURM_CONF
#   deploy/slurm/local-cluster.sh stop DIR
#
# Needs root, and Debian's slurm-wlm and munge. Each node has its own loopback address (node1 = 127.0.0.2 ...
# node4 = 127.0.0.5, added to /etc/hosts) and its own slurmd port. Containers have no cgroups for Slurm, hence
# proctrack/linuxproc and task/none; each node declares 8 CPUs (config_overrides) so 4 ranks and an agent fit.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,8p' "$0"; exit 64; }
[ "$(id -u)" = 0 ] || { echo "local-cluster.sh: needs root (munged and slurmd)" >&2; exit 1; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/slurm.conf
nodes=4

stop() {
    for pidfile in "$dir"/slurmd-node*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    sleep 0.5
}

if [ "$cmd" = stop ]; then
    stop
    exit 0
fi
[ "$cmd" = start ] || { echo "local-cluster.sh: unknown command $cmd (start or stop)" >&2; exit 64; }
for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || { echo "local-cluster.sh: $tool is missing: apt-get install slurm-wlm munge" >&2; exit 1; }
done
stop

# Node names resolve to their own loopback addresses.
for k in $(seq 1 $nodes); do
    grep -qE "^127\.0\.0\.$((k + 1))[[:space:]]+node$k\$" /etc/hosts || echo "127.0.0.$((k + 1)) node$k" >> /etc/hosts
done

# munge: its directories owned by its user, a key, the daemon running as that user.
id munge >/dev/null 2>&1 || useradd --system --no-create-home munge
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 "$dir/munge"
su -s /bin/sh munge -c "munged --pid-file=$dir/munge/munged.pid"
ln -sf "$dir/munge/munged.pid" "$dir/munged.pid"
for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
munge -n | unmunge >/dev/null

mkdir -p "$dir/state"
# Each node its own TmpFS: the nodes share /tmp, where Slurm's PMIx plugin (srun --mpi=pmix, for MPI ranks)
# would make the same per-step directory on every node.
for k in $(seq 1 $nodes); do mkdir -p -m 1777 "$dir/tmp-node$k"; done
{
    echo "ClusterName=canopy"
    echo "SlurmctldHost=localhost(127.0.0.1)"
    echo "SlurmctldPort=16817"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "MpiDefault=none"
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool-%n"
    echo "TmpFS=$dir/tmp-%n"
    echo "SlurmdPidFile=$dir/slurmd-%n.pid"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmctldLogFile=$dir/slurmctld.log"
    echo "SlurmdLogFile=$dir/slurmd-%n.log"
    echo "SchedulerType=sched/backfill"
    echo "InactiveLimit=0"
    echo "KillWait=5"
    for k in $(seq 1 $nodes); do
        echo "NodeName=node$k NodeAddr=127.0.0.$((k + 1)) Port=$((17000 + k)) CPUs=8 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=node[1-$nodes] Default=YES MaxTime=INFINITE State=UP"
} > "$conf"

slurmctld -f "$conf"
for k in $(seq 1 $nodes); do
    slurmd -f "$conf" -N "node$k"
done
export SLURM_CONF=$conf
for _ in $(seq 100); do
    idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l)
    [ "$idle" = "$nodes" ] && break
    sleep 0.2
done
if [ "$idle" != "$nodes" ]; then
    echo "local-cluster.sh: only $idle of $nodes nodes are idle:" >&2
    sinfo -N >&2 || true
    exit 1
fi
echo "SLURM_CONF=$conf"
