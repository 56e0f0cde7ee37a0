#!/usr/bin/env bash
# slurm_localhost.sh -- a real single-node Slurm cluster on localhost.
#
# What it is for: development and the end-to-end tests of tangentlens's Slurm path (sbatch, job
# arrays, dependencies, requeue, submitit). `make test` skips those tests when `sbatch` is not on
# PATH, so nothing here is needed for the ordinary test suite.
#
# Usage:
#   scripts/slurm_localhost.sh start    install slurm-wlm + munge if missing, write the config,
#                                       start munged, slurmctld and slurmd, wait until the node is
#                                       idle (exit non-zero, with diagnostics, if it is not)
#   scripts/slurm_localhost.sh stop     stop slurmd and slurmctld (and slurmdbd); munged and
#                                       MariaDB are left running
#   scripts/slurm_localhost.sh status   sinfo + squeue; exit 0 if the node is up, 1 otherwise
# `start` is idempotent: a second run leaves running daemons alone, unless the generated config
# changed (e.g. other knobs below), in which case they are restarted.
#
# Requirements: a Debian/Ubuntu machine with apt (packages slurm-wlm and munge; slurmdbd and
# mariadb-server with SLURM_LOCALHOST_ACCOUNTING=1), root or sudo for start/stop (status runs as
# any user). Works without systemd and without cgroups (containers): the daemons are started
# directly unless systemd is PID 1, and the config uses proctrack/linuxproc and task/affinity (or
# task/none). Tested on Debian 12 (Slurm 22.05.8).
#
# Without accounting (the default) there is no slurmdbd, so `sacct` fails ("Slurm accounting
# storage is disabled"): use `scontrol show job` (finished jobs stay for MinJobAge seconds) or the
# output files. submitit polls job states with sacct: without it, job states read UNKNOWN and
# result() only returns once the result pickle exists -- it waits forever on a job that died
# without writing one (scancel, SIGKILL, node failure). SLURM_LOCALHOST_ACCOUNTING=1 adds
# slurmdbd on a local MariaDB so that sacct (and submitit's state tracking) work.
#
# Environment knobs (all optional):
#   SLURM_LOCALHOST_ACCOUNTING    1: install/start MariaDB + slurmdbd, AccountingStorageType=
#                                 accounting_storage/slurmdbd (default 0: no accounting).
#   SLURM_LOCALHOST_CRED_EXPIRE   AuthInfo cred_expire in seconds (default 10; Slurm's own
#                                 default is 120). It is also how long a requeued job must wait
#                                 before it may start again (minimum 5).
#   SLURM_LOCALHOST_SCHEDULER_PARAMETERS
#                                 SchedulerParameters (default "batch_sched_delay=0,
#                                 sched_interval=5": batch jobs start ~1 s after submission
#                                 instead of ~3 s, and a requeued job starts within ~5 s of its
#                                 BeginTime instead of up to 60 s; "" gives Slurm's defaults).
#   SLURM_LOCALHOST_TASK_PLUGIN   TaskPlugin (default: task/affinity when this process may use
#                                 every online CPU and can set CPU affinity, else task/none).
#   SLURM_LOCALHOST_MIN_JOB_AGE   MinJobAge, seconds a finished job stays in `scontrol show job`
#                                 (default 300).
#   SLURM_LOCALHOST_TIMEOUT       seconds `start` waits for the node to be idle (default 60).
# The defaults are a fast profile for development and tests (a requeued job restarts after ~15 s
# instead of ~150 s); SLURM_LOCALHOST_CRED_EXPIRE=120 SLURM_LOCALHOST_SCHEDULER_PARAMETERS= gives
# Slurm's own timing.
set -euo pipefail

SLURM_CONF=/etc/slurm/slurm.conf # where Debian's slurm-wlm (22.05, bookworm) looks for it
SLURMDBD_CONF=/etc/slurm/slurmdbd.conf
MUNGE_KEY=/etc/munge/munge.key
LOG_DIR=/var/log/slurm
CTLD_SPOOL=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
DBD_PID=/run/slurmdbd.pid
DB_NAME=slurm_acct_db
CLUSTER_NAME=localhost
PARTITION=debug
ACCOUNTING=${SLURM_LOCALHOST_ACCOUNTING:-0}
CRED_EXPIRE=${SLURM_LOCALHOST_CRED_EXPIRE:-10}
SCHEDULER_PARAMETERS=${SLURM_LOCALHOST_SCHEDULER_PARAMETERS-batch_sched_delay=0,sched_interval=5}
TASK_PLUGIN=${SLURM_LOCALHOST_TASK_PLUGIN:-}
MIN_JOB_AGE=${SLURM_LOCALHOST_MIN_JOB_AGE:-300}
TIMEOUT=${SLURM_LOCALHOST_TIMEOUT:-60}
NODE=$(hostname -s)

log() { printf '[slurm_localhost] %s\n' "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "must run as root (no sudo available)"
        exec sudo -E bash "$0" "$@"
    fi
}

have_systemd() { [ -d /run/systemd/system ]; }

# Prints the pid from a pid file if that process is alive and runs the named binary.
pid_alive() { # $1 pidfile, $2 process name
    local pid
    [ -r "$1" ] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
    echo "$pid"
}

# Polls a command (quietly) once every 0.5 s, up to $1 seconds.
wait_for() { # $1 seconds, command...
    local tries=$(($1 * 2))
    shift
    while [ "$tries" -gt 0 ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
        tries=$((tries - 1))
    done
    return 1
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 &&
        command -v sbatch >/dev/null 2>&1 || missing+=(slurm-wlm)
    command -v munged >/dev/null 2>&1 || missing+=(munge)
    if [ "$ACCOUNTING" = 1 ]; then
        command -v slurmdbd >/dev/null 2>&1 || missing+=(slurmdbd)
        command -v mariadbd >/dev/null 2>&1 || missing+=(mariadb-server)
    fi
    [ "${#missing[@]}" -gt 0 ] || return 0
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and apt-get is not available"
    log "installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${missing[@]}"
}

munge_ok() { munge -n | unmunge; }

start_munge() {
    if [ ! -s "$MUNGE_KEY" ]; then
        log "creating $MUNGE_KEY"
        install -d -o munge -g munge -m 0700 "$(dirname "$MUNGE_KEY")"
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile="$MUNGE_KEY" --force
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
        fi
        chown munge:munge "$MUNGE_KEY"
        chmod 0400 "$MUNGE_KEY"
    fi
    munge_ok >/dev/null 2>&1 && return 0
    log "starting munged"
    if have_systemd; then
        systemctl start munge
    else
        install -d -o munge -g munge -m 0755 /run/munge
        runuser -u munge -- /usr/sbin/munged
    fi
    wait_for 10 munge_ok ||
        die "munged does not answer (munge -n | unmunge fails); see /var/log/munge/munged.log"
}

# task/affinity binds each job to its allocated CPUs (as real clusters do); it needs
# sched_setaffinity, and Slurm's CPU ids to be this process's CPUs, so a CPU-restricted container
# gets task/none. (proctrack/cgroup + task/cgroup need cgroup v1, or v2 with systemd in Slurm
# 22.05: not portable to containers, so they are not used.)
task_plugin() {
    if [ -n "$TASK_PLUGIN" ]; then
        echo "$TASK_PLUGIN"
    elif [ "$(nproc)" = "$(nproc --all)" ] && command -v taskset >/dev/null 2>&1 &&
        taskset -c 0 true 2>/dev/null; then
        echo task/affinity
    else
        echo task/none
    fi
}

# The slurm.conf for this host, on stdout.
render_slurm_conf() {
    local cpus topo mem_total real_mem def_mem
    cpus=$(nproc)
    # Sockets/cores/threads as slurmd detects them, when it sees the same CPU count (otherwise
    # slurmd notes "Node reconfigured socket/core boundaries").
    topo=$(slurmd -C 2>/dev/null | head -n1 | grep -o 'CPUs=[0-9]* .*ThreadsPerCore=[0-9]*' || true)
    case "$topo" in
    "CPUs=$cpus "*) ;;
    *) topo="CPUs=$cpus" ;;
    esac
    mem_total=$(free -m | awk '/^Mem:/ {print $2}')
    # Slightly below the total: slurmd drains a node that has less memory than configured.
    real_mem=$((mem_total - mem_total / 20))
    [ "$real_mem" -ge 1 ] || real_mem=1
    # Memory is a consumable resource; a job that does not ask for memory gets its CPUs' share.
    def_mem=$((real_mem / cpus))
    cat <<EOF
# Generated by tangentlens scripts/slurm_localhost.sh -- a single-node development cluster.
# Rewritten by every 'start'; edit the script, not this file.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=$CRED_EXPIRE
MpiDefault=none
SwitchType=switch/none
# No systemd and possibly no usable cgroups (containers): track job processes through /proc.
ProctrackType=proctrack/linuxproc
TaskPlugin=$(task_plugin)
SchedulerType=sched/backfill
EOF
    if [ -n "$SCHEDULER_PARAMETERS" ]; then
        echo "SchedulerParameters=$SCHEDULER_PARAMETERS"
    fi
    if [ "$ACCOUNTING" = 1 ]; then
        echo "AccountingStorageType=accounting_storage/slurmdbd"
        echo "AccountingStorageHost=localhost"
        echo "JobAcctGatherType=jobacct_gather/linux"
    else
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobAcctGatherType=jobacct_gather/none"
    fi
    cat <<EOF
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobRequeue=1
ReturnToService=2
MinJobAge=$MIN_JOB_AGE
StateSaveLocation=$CTLD_SPOOL
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
NodeName=$NODE NodeHostname=$NODE NodeAddr=127.0.0.1 $topo RealMemory=$real_mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP DefMemPerCPU=$def_mem
EOF
}

render_slurmdbd_conf() { # $1 database password
    cat <<EOF
# Generated by tangentlens scripts/slurm_localhost.sh (SLURM_LOCALHOST_ACCOUNTING=1).
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$1
StorageLoc=$DB_NAME
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$DBD_PID
EOF
}

# Installs stdin as file $1 (owner $2, mode $3); returns 0 if it changed, 1 if it was up to date.
update_file() {
    local tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [ -f "$1" ] && cmp -s "$tmp" "$1"; then
        rm -f "$tmp"
        return 1
    fi
    install -d -m 0755 "$(dirname "$1")"
    if [ -f "$1" ]; then
        cp -p "$1" "$1.bak"
    fi
    install -o "$2" -g "$2" -m "$3" "$tmp" "$1"
    rm -f "$tmp"
    log "wrote $1"
    return 0
}

prepare_dirs() {
    install -d -o slurm -g slurm -m 0755 "$LOG_DIR" "$CTLD_SPOOL"
    install -d -o root -g root -m 0755 "$SLURMD_SPOOL"
}

db_ok() { mariadb-admin ping; }

# MariaDB + slurmdbd (SLURM_LOCALHOST_ACCOUNTING=1 only).
start_accounting() {
    local pass changed=0
    if ! db_ok >/dev/null 2>&1; then
        log "starting MariaDB"
        if have_systemd; then
            systemctl start mariadb
        else
            /etc/init.d/mariadb start >/dev/null
        fi
        wait_for 30 db_ok || die "MariaDB does not answer (mariadb-admin ping)"
    fi
    # Keep the password of an existing slurmdbd.conf, so that the file does not change.
    pass=$(sed -n 's/^StoragePass=//p' "$SLURMDBD_CONF" 2>/dev/null || true)
    [ -n "$pass" ] || pass=$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
    mariadb <<EOF
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS 'slurm'@'localhost';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
GRANT ALL ON $DB_NAME.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
    render_slurmdbd_conf "$pass" | update_file "$SLURMDBD_CONF" slurm 0600 && changed=1
    if [ "$changed" = 1 ] && pid_alive "$DBD_PID" slurmdbd >/dev/null; then
        log "slurmdbd.conf changed; restarting slurmdbd"
        stop_slurmdbd
    fi
    if ! pid_alive "$DBD_PID" slurmdbd >/dev/null; then
        log "starting slurmdbd"
        if have_systemd; then
            systemctl start slurmdbd
        else
            slurmdbd # daemonizes; logs to $LOG_DIR/slurmdbd.log
        fi
    fi
    wait_for 30 sacctmgr -n list cluster ||
        die "slurmdbd does not answer (sacctmgr list cluster); see $LOG_DIR/slurmdbd.log"
}

stop_slurmdbd() {
    local pid
    if have_systemd; then
        systemctl stop slurmdbd || true
        return 0
    fi
    pid=$(pid_alive "$DBD_PID" slurmdbd) || return 0
    kill -TERM "$pid" 2>/dev/null || true
    wait_for 30 eval "! kill -0 $pid" || die "slurmdbd ($pid) still running after SIGTERM"
}

SLURMD_STARTED_AT=0 # set when this run starts slurmd: the node must then re-register

# True once the running slurmd has registered with slurmctld (after a restart the saved state
# can show the node idle before that).
slurmd_registered() {
    local started
    [ "$SLURMD_STARTED_AT" -gt 0 ] || return 0
    started=$(scontrol show node "$NODE" 2>/dev/null | sed -n 's/.*SlurmdStartTime=\([^ ]*\).*/\1/p')
    [ -n "$started" ] && [ "$started" != None ] || return 1
    [ "$(date -d "$started" +%s 2>/dev/null || echo 0)" -ge "$SLURMD_STARTED_AT" ]
}

daemons_running() { pid_alive "$CTLD_PID" slurmctld >/dev/null || pid_alive "$SLURMD_PID" slurmd >/dev/null; }
daemons_stopped() { ! daemons_running; }

start_daemons() {
    if have_systemd; then
        systemctl start slurmctld slurmd
        return 0
    fi
    if ! pid_alive "$CTLD_PID" slurmctld >/dev/null; then
        log "starting slurmctld"
        # Daemonizes; logs to $LOG_DIR/slurmctld.log.
        slurmctld || {
            diagnostics
            die "slurmctld failed to start"
        }
    fi
    if ! pid_alive "$SLURMD_PID" slurmd >/dev/null; then
        log "starting slurmd"
        SLURMD_STARTED_AT=$(date +%s)
        slurmd || {
            diagnostics
            die "slurmd failed to start"
        }
    fi
}

stop_daemons() {
    local entry name pid
    if have_systemd; then
        systemctl stop slurmd slurmctld || true
        return 0
    fi
    # `scontrol shutdown` stops slurmctld and every slurmd cleanly (state saved). Running jobs'
    # slurmstepd processes survive and reattach on the next start.
    if pid_alive "$CTLD_PID" slurmctld >/dev/null && scontrol ping >/dev/null 2>&1; then
        scontrol shutdown >/dev/null 2>&1 || true
    fi
    wait_for 15 daemons_stopped && return 0
    for entry in "$SLURMD_PID:slurmd" "$CTLD_PID:slurmctld"; do
        name=${entry#*:}
        pid=$(pid_alive "${entry%%:*}" "$name") || continue
        log "sending SIGTERM to $name ($pid)"
        kill -TERM "$pid" 2>/dev/null || true
    done
    wait_for 15 daemons_stopped || die "slurm daemons still running after SIGTERM"
}

node_state() { sinfo -h -n "$NODE" -o '%t' 2>/dev/null | head -n1; }

diagnostics() {
    log "---- diagnostics ----"
    {
        echo "\$ scontrol ping"
        scontrol ping 2>&1 || true
        echo "\$ sinfo -N -l"
        sinfo -N -l 2>&1 || true
        echo "\$ scontrol show node $NODE"
        scontrol show node "$NODE" 2>&1 || true
        echo "\$ tail -n 30 $LOG_DIR/slurmctld.log"
        tail -n 30 "$LOG_DIR/slurmctld.log" 2>&1 || true
        echo "\$ tail -n 30 $LOG_DIR/slurmd.log"
        tail -n 30 "$LOG_DIR/slurmd.log" 2>&1 || true
    } >&2
}

# Waits for the node to be up ("idle", or "mix"/"alloc" when jobs survived a restart).
wait_idle() {
    local deadline state resumed=0
    deadline=$((SECONDS + TIMEOUT))
    while [ "$SECONDS" -lt "$deadline" ]; do
        state=$(node_state)
        case "$state" in
        idle | mix | alloc | comp) slurmd_registered && return 0 ;;
        drain | drng | down | fail)
            # Responding but drained/down (e.g. an old reason in saved state): resume it once.
            if [ "$resumed" -eq 0 ]; then
                log "node $NODE is '$state' ($(sinfo -h -n "$NODE" -o '%E')); resuming it"
                scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
                resumed=1
            fi
            ;;
        esac
        sleep 1
    done
    log "node $NODE not up after ${TIMEOUT}s (state: '${state:-unknown}')"
    diagnostics
    return 1
}

cmd_start() {
    need_root start
    install_packages
    start_munge
    prepare_dirs
    local changed=0
    render_slurm_conf | update_file "$SLURM_CONF" root 0644 && changed=1
    if [ "$ACCOUNTING" = 1 ]; then
        start_accounting # after slurm.conf: sacctmgr reads it
    fi
    if [ "$changed" = 1 ] && daemons_running; then
        log "slurm.conf changed; restarting slurmctld and slurmd"
        stop_daemons
    fi
    start_daemons
    wait_idle || exit 1
    log "node $NODE is up ($(node_state)); partition '$PARTITION'"
    sinfo
}

cmd_stop() {
    need_root stop
    if ! command -v slurmctld >/dev/null 2>&1; then
        log "slurm is not installed; nothing to stop"
        return 0
    fi
    stop_daemons
    if command -v slurmdbd >/dev/null 2>&1; then
        stop_slurmdbd
    fi
    log "slurm daemons stopped"
}

cmd_status() {
    if ! command -v sinfo >/dev/null 2>&1; then
        echo "slurm is not installed"
        exit 1
    fi
    sinfo || true
    squeue || true
    case "$(node_state)" in
    idle | mix | alloc | comp) exit 0 ;;
    *) exit 1 ;;
    esac
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*)
    echo "usage: $0 {start|stop|status}" >&2
    exit 2
    ;;
esac
