#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on this machine, for the `slurm` tests (tests/experiments/test_slurm.py).
#
#   scripts/slurm_single_node.sh up      install (Debian packages, as root) and start it; prints SLURM_CONF
#   scripts/slurm_single_node.sh down    stop every daemon it started (by the pids it recorded) and cancel jobs
#   scripts/slurm_single_node.sh status  sinfo of the running cluster
#
# What it brings up, all under $MX_PROXY_SLURM_DIR (default /tmp/mx-proxy-slurm), nothing in /etc/slurm:
# munged (run as the munge user, no systemd), a private MariaDB on 127.0.0.1:$MX_PROXY_SLURM_DB_PORT (default
# 3307) holding the accounting database, slurmdbd (submitit reads job states with sacct: without real
# accounting a cancelled job stays UNKNOWN), slurmctld and slurmd for one node, this machine at 127.0.0.1,
# with all its CPUs; proctrack/linuxproc and task/none (no cgroups), select/cons_tres. Clients find it through
# SLURM_CONF=$MX_PROXY_SLURM_DIR/slurm.conf (`up` prints it; the tests read it from the folder).
#
# Where it cannot run (not root, no apt-get, no packages) `up` writes the reason to $MX_PROXY_SLURM_DIR/unavailable
# and exits 1; the `slurm` tests then skip, printing that reason. Measured on a 2-core Debian 12 VM: packages
# ~30 s (once), start-up 5–9 s, `down` ~4 s.
set -euo pipefail

DIR="${MX_PROXY_SLURM_DIR:-/tmp/mx-proxy-slurm}"
DB_PORT="${MX_PROXY_SLURM_DB_PORT:-3307}"
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
NODE="$(hostname -s)"

unavailable() {  # record why the cluster cannot come up, and stop
  mkdir -p "$DIR"
  echo "$*" >"$DIR/unavailable"
  echo "slurm_single_node.sh: $*" >&2
  exit 1
}

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v munged >/dev/null \
    && command -v mariadbd >/dev/null && return 0
  [ "$(id -u)" = 0 ] || unavailable "Slurm is not installed and this user is not root (apt-get install ${PACKAGES[*]})"
  command -v apt-get >/dev/null || unavailable "Slurm is not installed and there is no apt-get (not Debian/Ubuntu)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >"$DIR/apt.log" 2>&1 || unavailable "apt-get update failed (see $DIR/apt.log)"
  apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >>"$DIR/apt.log" 2>&1 \
    || unavailable "apt-get install ${PACKAGES[*]} failed (see $DIR/apt.log)"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll COMMAND until it succeeds
  local limit=$1 what=$2
  shift 2
  for _ in $(seq $((limit * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  unavailable "$what did not come up within ${limit}s (logs in $DIR/log)"
}

write_configs() {
  local cpus mem
  cpus="$(nproc)"
  mem="$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)"
  cat >"$DIR/slurm.conf" <<EOF
# written by scripts/slurm_single_node.sh: a one-node test cluster
ClusterName=mxproxy
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits cred_expire + 1 s before it starts again (default 121 s); starting it sooner (scontrol
# update StartTime=now) can launch it in the second its old credential was revoked, and slurmd then kills it
# ("Job credential revoked")
AuthInfo=cred_expire=10
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobCompType=jobcomp/none
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ReturnToService=2
KillWait=20
MinJobAge=30
JobRequeue=1
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
EOF
  chmod 600 "$DIR/slurmdbd.conf"
}

start_munge() {
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || mungekey --create >/dev/null 2>&1 || unavailable "no munge key and mungekey failed"
  if ! pgrep -u munge -x munged >/dev/null; then  # one already running (the system's) is used, and left running
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid || unavailable "munged did not start"
    wait_for 10 "munged's pid file" test -s /run/munge/munged.pid
    cp /run/munge/munged.pid "$DIR/run/munged.pid"
  fi
  wait_for 10 munged sh -c 'munge -n | unmunge'
}

start_mariadb() {
  local sock="$DIR/run/mysqld.sock"
  if [ ! -d "$DIR/mysql/mysql" ]; then
    mkdir -p "$DIR/mysql" && chown mysql:mysql "$DIR/mysql"
    mariadb-install-db --user=mysql --datadir="$DIR/mysql" --auth-root-authentication-method=socket \
      >"$DIR/log/mariadb-install.log" 2>&1 || unavailable "mariadb-install-db failed (see $DIR/log)"
  fi
  chown mysql:mysql "$DIR/run"
  mariadbd --user=mysql --datadir="$DIR/mysql" --socket="$sock" --port="$DB_PORT" --bind-address=127.0.0.1 \
    --pid-file="$DIR/run/mariadbd.pid" --skip-name-resolve --innodb-buffer-pool-size=32M \
    >"$DIR/log/mariadbd.log" 2>&1 &
  wait_for 30 MariaDB mariadb --socket="$sock" -e "select 1"
  mariadb --socket="$sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
}

up() {
  mkdir -p "$DIR"
  rm -f "$DIR/unavailable" "$DIR/up"
  install_packages
  if [ -f "$DIR/run/slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null; then
    echo "already up: export SLURM_CONF=$DIR/slurm.conf"
    touch "$DIR/up"
    return 0
  fi
  mkdir -p "$DIR"/{ctld,spool,run,log}
  write_configs
  export SLURM_CONF="$DIR/slurm.conf"
  start_munge
  start_mariadb
  slurmdbd || unavailable "slurmdbd did not start (see $DIR/log/slurmdbd.log)"
  wait_for 30 slurmdbd sacctmgr -i -n list cluster
  sacctmgr -i add cluster mxproxy >/dev/null 2>&1 || true
  slurmctld -c -f "$SLURM_CONF" || unavailable "slurmctld did not start (see $DIR/log/slurmctld.log)"
  wait_for 30 slurmctld scontrol ping
  slurmd -f "$SLURM_CONF" -N "$NODE" || unavailable "slurmd did not start (see $DIR/log/slurmd.log)"
  wait_for 30 "the node" sh -c "sinfo -h -N -o %t | grep -qx idle"
  touch "$DIR/up"
  echo "export SLURM_CONF=$DIR/slurm.conf"
}

stop_pids() {  # stop_pids NAME...: SIGTERM the daemons whose pid files we wrote, all at once, then wait for each
  local name f pid pids=()
  for name in "$@"; do
    f="$DIR/run/$name.pid"
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    rm -f "$f"
    kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}

down() {
  [ -d "$DIR" ] || return 0
  export SLURM_CONF="$DIR/slurm.conf"
  if [ -f "$DIR/up" ]; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    sleep 1
  fi
  rm -f "$DIR/up"
  stop_pids slurmd slurmctld slurmdbd mariadbd munged
  rm -rf "$DIR/ctld" "$DIR/spool" "$DIR/mysql"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) SLURM_CONF="$DIR/slurm.conf" sinfo ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
