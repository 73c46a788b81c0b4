#!/usr/bin/env bash
# A real Slurm cluster on this machine: slurmctld and four slurmd nodes (n1..n4), each node name resolving to its own
# loopback address. Debian's slurm-wlm; settings explained in docs/slurm.md.
#
#   tests/slurm/cluster.sh start    install if missing (apt, root), configure, start, wait until the nodes are idle
#   tests/slurm/cluster.sh stop     stop every daemon this script started
#   tests/slurm/cluster.sh install  only install slurm-wlm, munge and bubblewrap (root), e.g. for the oracle tests
#   tests/slurm/cluster.sh status
#
# Idempotent: `start` on a running cluster only checks it; `stop` on a stopped one does nothing.
# Nodes declare 8 CPUs on a 2-core machine (config_overrides) so that the scenario jobs, which mostly sleep, run
# side by side.
# State lives in $SLURMRT_CLUSTER_DIR (default /tmp/slurmrt-cluster); the config is $SLURMRT_CLUSTER_DIR/slurm.conf.
set -euo pipefail

DIR=${SLURMRT_CLUSTER_DIR:-/tmp/slurmrt-cluster}
CONF=$DIR/slurm.conf
NODES=(n1 n2 n3 n4)
export SLURM_CONF=$CONF

log() { echo "cluster.sh: $*" >&2; }

need_root() {
    if [ "$(id -u)" != 0 ]; then
        log "needs root (to install slurm-wlm and munge, write /etc/hosts and run the daemons)"
        exit 3
    fi
}

installed() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null && command -v bwrap >/dev/null
}

install() {
    installed && return
    # One install at a time: the hostlist tests and the cluster scenarios may ask for it at once (tests/run.sh runs
    # them side by side), and two apt-get runs fail on the package manager's lock.
    exec 9>/tmp/.slurmrt-cluster-install.lock
    flock 9
    if ! installed; then
        # bubblewrap: the container boundary of tests/slurm/test_containers.py (tests/slurm/container.sh).
        log "installing slurm-wlm, munge and bubblewrap"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq slurm-wlm munge bubblewrap >/dev/null
    fi
    exec 9>&-
}

hosts() {
    # Each node its own loopback address, so MASTER_ADDR taken from the nodelist works as on a real cluster.
    local i
    for i in 1 2 3 4; do
        grep -qE "^127\.0\.1\.$i[[:space:]]+n$i\$" /etc/hosts || echo "127.0.1.$i n$i" >> /etc/hosts
    done
}

munge_up() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return
    fi
    mkdir -p /etc/munge /var/log/munge /run/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge /var/log/munge /run/munge /var/lib/munge
    chmod 400 /etc/munge/munge.key
    /usr/sbin/munged --force
    # Ours to stop: `stop` ends only the munged this script started.
    for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
    cp /run/munge/munged.pid "$DIR/munged.pid" 2>/dev/null || true
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
    log "munged did not come up"; exit 1
}

configure() {
    local host
    host=$(hostname -s)
    mkdir -p "$DIR"/{spool,state,log}
    for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n"; done
    cat > "$CONF.new" <<CONF
ClusterName=slurmrt
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=17000
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire + 1 s (120 by default) before it may start again, until the old job credential
# has expired on its nodes; 10 s keeps requeue scenarios short without skipping that wait.
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=10
MinJobAge=300
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
JobRequeue=1
# Job ids from 100 (slurmctld -c starts them afresh): a job's ids decide its rendezvous ports, and the integration
# tests, which may run beside the cluster's jobs (tests/run.sh), fake the ids 5 and 7.
FirstJobId=100
# Two GPUs per node as GRES, their "devices" stand-in files (slurmd refuses a count without files): what a GPU
# cluster's side steps and steps meet (tests/slurm/test_gres.py); a job that asks for none is not affected.
GresTypes=gpu
NodeName=n[1-4] NodeHostname=$host NodeAddr=127.0.0.1 Port=17001-17004 CPUs=8 RealMemory=4000 Gres=gpu:2 State=UNKNOWN
PartitionName=low Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=20 OverSubscribe=NO
PartitionName=high Nodes=n[1-4] MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF OverSubscribe=NO
CONF
    echo "NodeName=n[1-4] Name=gpu File=/dev/tty[0-1]" > "$DIR/gres.conf"
    if [ -f "$CONF" ] && ! cmp -s "$CONF.new" "$CONF" && running; then
        mv "$CONF.new" "$CONF"
        scontrol reconfigure   # a running cluster takes the new settings
        return
    fi
    mv "$CONF.new" "$CONF"
}

running() { [ -f "$CONF" ] && scontrol ping 2>/dev/null | grep -q "UP"; }

PORTS=(16817 17001 17002 17003 17004)

ports_free() {
    # Another cluster (or any program) on this machine may hold our ports: starting beside it would make our
    # daemons fail in odd ways, or talk to it. Refuse, and say which port and who holds it.
    local port holder
    for port in "${PORTS[@]}"; do
        if python3 -c "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', $port))" 2>/dev/null; then
            continue
        fi
        holder=$(ss -Hltnp "sport = :$port" 2>/dev/null | sed -n 's/.*users:((\("[^"]*",pid=[0-9]*\).*/\1/p' | head -1)
        log "port $port is in use${holder:+ by $holder}: another Slurm cluster or program runs on this machine. Stop it, or run the tests where these ports (${PORTS[*]}) are free"
        return 1
    done
}

# Started by this script, by pid file: the only processes `stop` ends.
alive() { [ -s "$1" ] && [ "$(cat "/proc/$(cat "$1")/comm" 2>/dev/null)" = "$2" ]; }

wait_idle() {
    local i state
    for i in $(seq 120); do
        state=$(sinfo -h -p low -o "%D %t" 2>/dev/null | tr '\n' ' ')
        if [ "$state" = "4 idle " ]; then return 0; fi
        # Nodes left DOWN/DRAIN by an earlier run come back with an explicit resume.
        if [[ "$state" == *down* || "$state" == *drain* ]]; then
            scontrol update NodeName=n[1-4] State=RESUME 2>/dev/null || true
        fi
        sleep 0.5
    done
    log "nodes not idle after 60 s: $(sinfo 2>&1)"; return 1
}

start() {
    need_root
    mkdir -p "$DIR"
    if ! running; then
        ports_free || exit 4
    fi
    install
    hosts
    munge_up
    configure
    if ! running; then
        # A fresh state: `slurmctld -c` clears the jobs and the nodes' states but keeps counting job ids from where
        # the last start left off, and the ids must start at FirstJobId (see the configuration).
        rm -rf "${DIR:?}/state"
        mkdir -p "$DIR/state"
        slurmctld -c -f "$CONF"
        for _ in $(seq 100); do running && break; sleep 0.1; done
    fi
    for n in "${NODES[@]}"; do
        local pidfile="$DIR/slurmd-$n.pid"
        # A pid file left by an earlier machine state may name a pid reused by another program: trust it only when
        # that process really is slurmd.
        if [ -s "$pidfile" ] && [ "$(cat "/proc/$(cat "$pidfile")/comm" 2>/dev/null)" = slurmd ]; then continue; fi
        slurmd -N "$n" -c -f "$CONF"
    done
    wait_idle
    log "up: $(sinfo -h -o '%P %D %t' | tr '\n' ' ')"
}

stop() {
    local f name pid
    if running; then
        scancel --quiet --user=root 2>/dev/null || true
        scontrol shutdown 2>/dev/null || true   # stops slurmctld and every slurmd of this cluster (its config)
    fi
    # Only the daemons this script started, by the pids it recorded and only while the pid is still that daemon: a
    # `pkill -x slurmd` here once killed another cluster on the same machine, mid-job.
    for f in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid "$DIR"/munged.pid; do
        [ -s "$f" ] || continue
        name=$(basename "$f" .pid); name=${name%%-*}
        if alive "$f" "$name"; then
            pid=$(cat "$f")
            [ "$name" = munged ] && kill "$pid" 2>/dev/null
            for _ in $(seq 50); do alive "$f" "$name" || break; sleep 0.1; done
            alive "$f" "$name" && kill -9 "$pid" 2>/dev/null
        fi
        rm -f "$f"
    done
    log "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    install) need_root; install ;;
    status) running && sinfo || { log "not running"; exit 1; } ;;
    *) echo "usage: $0 start|stop|status|install" >&2; exit 2 ;;
esac
